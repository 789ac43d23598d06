// Short names of the CMF dtype ids ("q4tp"), for messages and reports.
#pragma once

#include <cstdint>
#include <string>

namespace cmf {

// "f32", "q4_block", ...; "dtype N" for an id without a name.
std::string dtype_name(int32_t dtype);

}  // namespace cmf
