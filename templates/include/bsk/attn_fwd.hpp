// Entry header of the attention-forward family: what templates/attn_fwd.cu.j2 includes. It names the one arch
// implementation there is (sm90a); the pieces live by role under common/ (shared by every arch) and sm90/.
#pragma once

#include "bsk/sm90/attn_fwd.hpp"
