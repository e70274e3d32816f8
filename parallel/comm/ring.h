// parallel/comm/ring.h — one step of a ring over a communicator's group: send to the next member,
// receive from the previous one, both in flight while the caller computes. Shared by the ring
// algorithms that hide their transfers behind compute (context parallelism's ring attention,
// the tensor-parallel layers' ring all-gather / reduce-scatter). No state of its own.
#pragma once

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel {

// A pending ring transfer; wait() waits for both halves (either may be absent).
struct RingStep {
  WorkPtr send, recv;
  void wait() {
    if (send) send->wait();
    if (recv) recv->wait();
  }
};

// Posts the send of `out` to member (rank + 1) mod n and the receive of `in` from member
// (rank − 1) mod n, with `tag`. Even members post the send first and odd members the receive:
// a communicator that runs its operations in issue order and matches a send only with a
// posted receive (NCCL) would deadlock if every member sent first (Note in
// parallel/comm/nccl_communicator.h).
inline RingStep ring_step(Communicator& g, const Tensor& out, const Tensor& in, int tag) {
  const int n = g.size(), r = g.rank();
  RingStep step;
  if (r % 2 == 0) {
    step.send = g.send_async(out, (r + 1) % n, tag);
    step.recv = g.recv_async(in, (r + n - 1) % n, tag);
  } else {
    step.recv = g.recv_async(in, (r + n - 1) % n, tag);
    step.send = g.send_async(out, (r + 1) % n, tag);
  }
  return step;
}

}  // namespace loom::parallel
