#include "dtype_name.hpp"

namespace cmf {

std::string dtype_name(int32_t dtype) {
    // Indexed by CMF_DTYPE_* (cmf_types.h, spec §5).
    static const char *const names[] = {"f32", "f16", "bf16", "q8_row", "q4_block", "mix8_4", "u8", "q4_col", "vbit",
                                        "q8_2f", "vbit_ro", "q4_tiled", "q1", "q1s", "q1t", "q4tp", "q2tp"};
    if (dtype >= 0 && dtype < static_cast<int32_t>(sizeof names / sizeof names[0])) return names[dtype];
    return "dtype " + std::to_string(dtype);
}

}  // namespace cmf
