// Factories of the dtypes in dtypes/*.cpp; all_dtypes.cpp lists them in id order.
#pragma once

#include "dtype.hpp"

namespace cmf::codecs {

std::unique_ptr<Dtype> make_f32();
std::unique_ptr<Dtype> make_f16();
std::unique_ptr<Dtype> make_bf16();

}  // namespace cmf::codecs
