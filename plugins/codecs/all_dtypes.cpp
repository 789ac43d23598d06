#include "dtypes/all.hpp"

namespace cmf::codecs {

std::vector<std::unique_ptr<Dtype>> make_all_dtypes() {
    std::vector<std::unique_ptr<Dtype>> v;
    v.push_back(make_f32());
    v.push_back(make_f16());
    v.push_back(make_bf16());
    v.push_back(make_q8_row());
    v.push_back(make_q4_block());
    v.push_back(make_reserved(CMF_DTYPE_MIX8_4));
    v.push_back(make_reserved(CMF_DTYPE_U8));
    v.push_back(make_reserved(CMF_DTYPE_Q4_COL));
    v.push_back(make_vbit());
    v.push_back(make_q8_2f());
    v.push_back(make_vbit_ro());
    v.push_back(make_q4_tiled());
    v.push_back(make_q1());
    v.push_back(make_q1s());
    v.push_back(make_q1t());
    v.push_back(make_q4tp());
    v.push_back(make_q2tp());
    v.push_back(make_q4_rows());  // memory-only (CMF_DTYPE_MEM_Q4_ROWS)
    v.push_back(make_q1_passes());  // memory-only (CMF_DTYPE_MEM_Q1_PASSES)
    v.push_back(make_q1t_passes());  // memory-only (CMF_DTYPE_MEM_Q1T_PASSES)
    v.push_back(make_q1s_passes());  // memory-only (CMF_DTYPE_MEM_Q1S_PASSES)
    return v;
}

}  // namespace cmf::codecs
