// core/checkpoint.h — activation checkpointing: a region whose intermediate activations are
// discarded after its forward and recomputed during backward.
//
// Note [Activation checkpoint]: checkpoint(fn, inputs) runs fn once with recording on, walks
// the graph it built to find the parameters (leaves) it used, then drops that graph, keeping
// only the inputs. Its backward restores the random generators, re-runs fn, back-propagates
// through the fresh graph with the gradients of the region's inputs and parameters captured
// (not accumulated), and hands them on as its own input gradients. Parameters therefore still
// receive their gradient through their AccumulateGrad once, when it is final, so gradient-ready
// hooks fire exactly once. fn may use leaves it captures, but any tensor with history must be
// passed in `inputs`. Random ops inside fn must draw from the generators listed.
#pragma once

#include <functional>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace loom {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const std::vector<Generator*>& generators = {});

}  // namespace loom
