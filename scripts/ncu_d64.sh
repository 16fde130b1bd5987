source scripts/gpu_session.sh; set -o pipefail
S="--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis"
G='Registers Per|Achieved Occ|Theoretical Occ|Block Limit|Duration|Compute \(SM\) Th|Shared Memory Config|Dynamic Shared|Stall|Issue Slots Busy|Warp Cycles Per Issued|Executed Ipc A'
(ncu --target-processes all --kernel-name-base demangled --launch-skip 2 --launch-count 1 -k regex:bsk_ $S python scripts/one_kernel.py 64 single 2>&1 | grep -E "$G|bsk_sm90"
ncu --target-processes all --kernel-name-base demangled --launch-skip 2 --launch-count 1 -k regex:bsk_ $S python scripts/one_kernel.py 64 pingpong 2>&1 | grep -E "$G|bsk_sm90"
ncu --target-processes all --kernel-name-base demangled --launch-count 1 -k "regex:FmhaKernelTma<" $S $BSK_EX88_BIN --b=1 --h=8 --q=8192 --k=8192 --d=64 --iterations=1 2>&1 | grep -E "$G|FmhaKernel|==ERR|==WARN" | cut -c1-200) 2>&1 | tee $OUT/log
