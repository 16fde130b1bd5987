// Entry header of the BSR GEMM family: what templates/bsr_gemm.cu.j2 includes. It names the one arch
// implementation there is (sm90a): the kernel (gemm_kernel.hpp), its work list (gemm_work.hpp) and launcher.
#pragma once

#include "bsk/sm90/gemm_launch.hpp"
