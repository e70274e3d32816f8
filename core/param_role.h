// core/param_role.h — ParamRole: what a parameter is in its model — in the input tables, in
// block l, or in the output part (final norm, head) — and its name there. The model records it
// when it registers the parameter (layers/transformer.cpp), so schemes that treat parts of a
// model differently (pipeline stages, ZeRO units, SDP's covers) ask it instead of parsing
// parameter names. Plain data carried on the tensor (Tensor::role), like its Placement.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct ParamRole {
  enum class Part : uint8_t { kInput, kBlock, kOutput };
  Part part = Part::kOutput;
  int64_t block = -1;  // kBlock: the block's index in the whole model
  std::string name;    // inside its block ("attn.qkv.weight"), else in the model ("wte.weight")
  bool operator==(const ParamRole&) const = default;
};

// The block of a parameter with this role, or -1 outside the blocks (null: no role, -1).
inline int64_t block_of(const ParamRole* role) {
  return role != nullptr && role->part == ParamRole::Part::kBlock ? role->block : -1;
}

}  // namespace loom
