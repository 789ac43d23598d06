// Re-encoding the tensors of an existing .cmf to another dtype: dequantize
// through the stored dtype's codec, quantize with the converter's policy for
// the new --quant (1-D/small/keep-f16 tensors stay f16), keep masks, vocab
// and header (quant_type updated; feature bits and section hashes are
// recomputed by the writer).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cmf { class Runtime; }

namespace cmf::convert {

struct RequantOptions {
    std::string input, output;  // output "" with in_place
    // Rewrite the input itself, tensor by tensor, each new payload in the
    // old one's slot (container/in_place.hpp: journaled, crash-safe). Every
    // re-encoded payload must fit its slot, which is checked for all of them
    // before the first write; the header (quant_type too) stays as it is.
    bool in_place = false;
    std::string quant;          // --quant name
    std::string only;           // glob (name_matches); "" = every tensor
    uint64_t shard_max_bytes = 0;
    std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> on_progress;  // tensors, bytes (of input payloads)
};

struct RequantStats {
    uint64_t tensors = 0, reencoded = 0;
};

RequantStats requant(Runtime &rt, const RequantOptions &opts);

// Encode f32 values as `dtype` through its codec (cmf::Error naming the tensor on failure).
std::vector<uint8_t> encode_tensor(Runtime &rt, const std::string &name, int32_t dtype, const std::string &options, uint32_t ndim,
                                   const uint64_t *shape, const float *values);

}  // namespace cmf::convert
