# One device call: (unless SKIP_AB=1) the previous commit's kernels vs the working tree's on the acceptance cases in
# the same run, then the GPU tests, compare-88 and bench --headline with the working tree's kernels (all prebuilt
# into .bskcache and carried). The previous commit lives in .headtree (git archive HEAD, its own .bskcache; carry it).
source scripts/gpu_session.sh >/dev/null 2>&1; set -o pipefail
export BSK_AB_CASES=${BSK_AB_CASES:-dense-d128,topk25-d128,causal-d128,win2K-d128,dense-d64,topk25-d64}
ab_head() { (cd .headtree && BSK_CACHE_DIR=$PWD/.bskcache PYTHONPATH=/tmp/site:$PWD BSK_AB_TAG=${BASE_TAG:-head} \
             python scripts/exp_ab.py); }
(if [ "${SKIP_AB:-0}" != 1 ]; then ab_head; fi
 python -m pytest -q -rf tests/test_attention_gpu.py 2>&1 | grep -E "FAILED|passed|failed" | tee $OUT/gpu_tests.txt
 [ "${SKIP_AB:-0}" != 1 ] && BSK_AB_TAG=${NEW_TAG:-new} python scripts/exp_ab.py
 python -m blackwell_sparsek compare-88 --json $OUT/compare88.json > $OUT/compare88.txt 2>&1; tail -9 $OUT/compare88.txt
 python -m blackwell_sparsek bench --headline --out $OUT 2>&1 | tail -9) 2>&1 | tee $OUT/log
