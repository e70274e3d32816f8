// kernels/matmul.cpp — the TF32 switch of kernels/matmul.h (Note [TF32]): one thread_local
// flag, changed only by AllowTf32Guard. Holds no other state and no kernel.
#include "kernels/matmul.h"

namespace loom::kernels {
namespace {
thread_local bool t_allow_tf32 = false;
}  // namespace

AllowTf32Guard::AllowTf32Guard(bool allow) : previous_(t_allow_tf32) { t_allow_tf32 = allow; }
AllowTf32Guard::~AllowTf32Guard() { t_allow_tf32 = previous_; }

bool tf32_allowed() { return t_allow_tf32; }

}  // namespace loom::kernels
