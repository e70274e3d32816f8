// data/balance.h — minibatch-level load balancing for variable-length data (post-training): the
// global minibatch's sequences split over the data-parallel ranks so that each rank's work is as
// equal as possible, then each rank's share cut into micro-batches under a token budget. Pure
// functions of (lengths, ranks, cost, budget), deterministic to the tie, so every rank computes
// the same plan without communicating and a resumed run plans what the original did. Nothing here
// reads data or knows a model; PackedLoader (data/packed_loader.h) applies the plan.
//
// Note [Balanced partition]: the cost of a sequence of s tokens is a·s² + b·s (attention is
// quadratic in s, the rest linear: a ≈ the attention FLOPs per token pair over the others per
// token; {0, 1} counts tokens). partition_balanced is Karmarkar–Karp's largest differencing
// method for k parts: every sequence starts as a k-tuple of part sums (its cost in one part),
// the two tuples of largest spread (max − min) are merged — the heaviest part of one with the
// lightest of the other — until one tuple is left. It beats greedy longest-processing-time on
// most inputs and is within the largest cost of the optimum. Ties are broken by sequence index.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

struct SequenceCost {
  double quadratic = 0.0;  // a
  double linear = 1.0;     // b
  double operator()(int64_t tokens) const {
    const double s = static_cast<double>(tokens);
    return quadratic * s * s + linear * s;
  }
};

// The sequences (indices into lengths) each of `parts` ranks takes, each part's indices
// ascending. Every index appears once; a part may be empty when there are fewer sequences.
std::vector<std::vector<int64_t>> partition_balanced(const std::vector<int64_t>& lengths, int parts,
                                                     const SequenceCost& cost = {});

// One rank's share cut into micro-batches of at most max_tokens tokens each (a longer sequence
// alone in its own), heaviest sequence first, each placed into the first micro-batch it fits
// (first-fit decreasing); the micro-batches are in the order they were opened.
std::vector<std::vector<int64_t>> cut_microbatches(const std::vector<int64_t>& indices,
                                                   const std::vector<int64_t>& lengths,
                                                   int64_t max_tokens);

}  // namespace loom
