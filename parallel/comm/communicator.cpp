// parallel/comm/communicator.cpp — the defaults of the Communicator's capabilities: refused,
// naming the group (Note [Communicator capabilities] in parallel/comm/communicator.h).
#include "parallel/comm/communicator.h"

#include "parallel/comm/one_sided.h"

namespace loom::parallel {

std::unique_ptr<Communicator> Communicator::subgroup(const std::vector<int>&,
                                                     const std::string& sub, double, int) {
  LOOM_FAIL("communicator ", name(), ": this backend cannot make sub-groups (", sub,
            "): an MPI communicator can; NCCL's are not built yet, and a build without MPI has "
            "none");
}

std::unique_ptr<OneSidedWindow> Communicator::one_sided_window(int64_t, DType, std::string window,
                                                               double) {
  LOOM_FAIL("communicator ", name(), ": this backend has no one-sided windows (", window,
            "): an MPI communicator has them (RMA); the GPU path is described in "
            "docs/parallel.md, \"ODC\"");
}

}  // namespace loom::parallel
