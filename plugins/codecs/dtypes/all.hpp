// Factories of the dtypes in dtypes/*.cpp; all_dtypes.cpp lists them in id order.
#pragma once

#include "dtype.hpp"

namespace cmf::codecs {

std::unique_ptr<Dtype> make_f32();
std::unique_ptr<Dtype> make_f16();
std::unique_ptr<Dtype> make_bf16();
std::unique_ptr<Dtype> make_q8_row();
std::unique_ptr<Dtype> make_q4_block();
std::unique_ptr<Dtype> make_reserved(int32_t id);  // 5, 6, 7
std::unique_ptr<Dtype> make_vbit();
std::unique_ptr<Dtype> make_q8_2f();
std::unique_ptr<Dtype> make_vbit_ro();
std::unique_ptr<Dtype> make_q4_tiled();
std::unique_ptr<Dtype> make_q4_rows();
std::unique_ptr<Dtype> make_q1();
std::unique_ptr<Dtype> make_q1_passes();
std::unique_ptr<Dtype> make_q1t_passes();
std::unique_ptr<Dtype> make_q1s_passes();
std::unique_ptr<Dtype> make_q1s();
std::unique_ptr<Dtype> make_q1t();
std::unique_ptr<Dtype> make_q4tp();
std::unique_ptr<Dtype> make_q2tp();

}  // namespace cmf::codecs
