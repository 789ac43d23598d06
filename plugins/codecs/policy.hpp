// The converter's tensor policy (COMPAT §5.13): which dtype a tensor gets for
// a requested `--quant` name. The converter calls choose_dtype() per tensor.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace cmf::codecs {

struct DtypeChoice {
    int32_t dtype;        // CMF_DTYPE_*
    std::string options;  // encoder options for cmf_quantize_params.options ("" = defaults)
};

// `requested` is a --quant name: q8|q8_row, q8_2f|q82f|q8f, q4|q4_block,
// q4t|q4_tiled, q4tp, q2tp, f16|fp16, vbit (writes vbit_ro), q1, q1p, q1s, q1t.
// Throws cmf::sdk::Error(INVALID_ARGUMENT) for an unknown name. Rules:
//  - names ending in ".tid2eid" -> f32;
//  - quantized only if 2-D, >= 32 elements and not on the keep-f16 list
//    (routers, GDN in_proj_a/b, shared-expert gate, g_proj, conv1d, KDA and
//    Gemma-3n gates); everything else -> f16;
//  - 2-D with cols % 32 != 0: q4t/q4tp/q2tp/vbit/q1* fall back to q8_2f;
//    q8_row/q8_2f/q4_block/f16 are used as they are.
// q2tp applies to MoE expert (or dense) gate/up projections only, like the
// original; every other quantized tensor gets q4tp.
DtypeChoice choose_dtype(std::string_view name, std::span<const uint64_t> shape, std::string_view requested);

// The header `quant_type` string the converter writes for a --quant name.
const char *quant_type_label(std::string_view requested);

}  // namespace cmf::codecs
