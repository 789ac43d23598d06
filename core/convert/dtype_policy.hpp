// Which CMF dtype (and encoder options) each converted or requantized
// tensor gets: the original converter's policy (docs/convert.md). The one
// policy of the project: `cmfhost convert`, `cmf_convert` and `requant` use it.
#pragma once

#include "common/dtype_name.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cmf::convert {

// --quant name -> dtype id: f32, f16|fp16, bf16, q8|q8_row, q8_2f|q82f|q8f,
// q4|q4_block, q4t|q4_tiled, q4tp, q2tp, vbit (writes vbit_ro), q1, q1p (q1
// with error diffusion), q1s, q1t.
// Throws cmf::Error(CMF_ERR_INVALID_ARGUMENT) listing the valid names.
int32_t quant_dtype_from_name(const std::string &name);
// Header `quant_type` for a --quant choice, as the original converter names it.
const char *header_quant_type(int32_t dtype);
using cmf::dtype_name;  // common/dtype_name.hpp

// Glob `pattern` (fnmatch) against the whole name or any dot-separated
// suffix of it: the matching rule of --quant-map and requant --only.
bool name_matches(const std::string &pattern, const std::string &name);

// A tensor's dtype and the encoder options it is quantized with
// (cmf_quantize_params.options; "" = the codec's defaults).
struct DtypeChoice {
    int32_t dtype;
    std::string options;
};

// Whether a tensor belongs to a routed expert: a model holding one is a MoE
// model for QuantPolicy::choose's `model_has_experts`.
bool is_routed_expert(const std::string &name);

// A --quant name's dtype and encoder options, as is (no policy).
DtypeChoice quant_choice(const std::string &name);

class QuantPolicy {
public:
    // `quant`: the --quant name; `quant_map`: "pattern=name,pattern=name"
    // where a pattern is a glob matched against the whole tensor name or
    // any dot-separated suffix of it ("mlp.*" matches
    // "model.layers.0.mlp.up_proj.weight"); first matching pattern wins.
    explicit QuantPolicy(const std::string &quant, const std::string &quant_map = {});

    int32_t base() const { return base_.dtype; }
    // The dtype for one output tensor. `model_has_experts` (see
    // is_routed_expert): q2tp is a profile, not a blanket, as in the
    // original converter: the 2-bit plane goes to the SwiGLU inputs
    // (gate_proj/up_proj, or w1/w3) of every expert, the shared expert
    // included (it shares the routed experts' layout); a model without
    // experts gives it to its dense FFN's gate/up instead (not to a `.mtp.`
    // draft layer's). Every other tensor q2tp would get is q4tp.
    DtypeChoice choose(const std::string &name, const std::vector<uint64_t> &shape, bool model_has_experts = false) const;

private:
    DtypeChoice base_;
    std::vector<std::pair<std::string, DtypeChoice>> overrides_;
};

}  // namespace cmf::convert
