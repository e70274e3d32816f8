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
// (rank − 1) mod n, with `tag`, as one group (Communicator::send_recv_async): every member
// sends and receives at once, which a backend that runs point-to-point in issue order (NCCL)
// needs — with separate calls, every member's send would wait for a receive not yet posted.
inline RingStep ring_step(Communicator& g, const Tensor& out, const Tensor& in, int tag) {
  const int n = g.size(), r = g.rank();
  std::vector<WorkPtr> w =
      g.send_recv_async({P2P::send(out, (r + 1) % n, tag), P2P::recv(in, (r + n - 1) % n, tag)});
  return RingStep{w[0], w[1]};
}

}  // namespace loom::parallel
