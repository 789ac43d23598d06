// hash64: the 64-bit hash CMF v2 puts on every tensor, the header and the
// directory (spec §8, COMPAT §2.1). Not a cryptographic hash.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cmf {

uint64_t hash64(const void *data, size_t len) noexcept;

}  // namespace cmf
