// optim/decay_rule.h — which parameters get weight decay, decided from a parameter's name and
// shape, and the helper that turns named parameters into ParamRefs. Knows nothing about any
// particular model class: only naming conventions (GPT-2 and Llama/Hugging Face style).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace loom::optim {

// Note [Default decay rule]: with DecayRule::kDefault a parameter is decayed iff
//   (a) it has at least 2 dimensions (a weight matrix), and
//   (b) its name, lower-cased, matches none of these exclusions:
//         ends with ".bias" (or is "bias")           — biases
//         contains "ln_" or "norm"                   — norm gains: GPT-2 "h.0.ln_1.weight",
//                                                      "ln_f.weight"; Llama
//                                                      "model.layers.0.input_layernorm.weight",
//                                                      "model.norm.weight"
//         contains "wte", "wpe" or "embed"           — embeddings: GPT-2 "wte.weight",
//                                                      "wpe.weight"; Llama
//                                                      "model.embed_tokens.weight"
// So every 1-d parameter is excluded by (a) whatever its name, and an untied output projection
// ("lm_head.weight") is decayed. A head tied to wte is one parameter, named and treated as wte.
//   kAll          decays every parameter.
//   kMatricesOnly decays every parameter with >= 2 dimensions, whatever its name (nanoGPT's
//                 rule: embeddings decay, biases and norm gains do not).
enum class DecayRule { kDefault, kAll, kMatricesOnly };

// "default" | "all" | "matrices"; anything else is an error listing the choices.
DecayRule parse_decay_rule(const std::string& s);
const char* decay_rule_name(DecayRule rule);

// Whether `rule` decays a parameter called `name` with shape `shape`.
bool decays(DecayRule rule, const std::string& name, const Shape& shape);

// ParamRefs for named parameters, decay decided by `rule`, order kept.
std::vector<ParamRef> make_param_refs(const std::vector<std::pair<std::string, Tensor>>& named,
                                      DecayRule rule = DecayRule::kDefault);

}  // namespace loom::optim
