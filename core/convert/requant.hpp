// Re-encoding the tensors of an existing .cmf to another dtype: dequantize
// through the stored dtype's codec, quantize with the converter's policy for
// the new --quant (1-D/small/keep-f16 tensors stay f16), keep masks, vocab
// and header (quant_type updated; feature bits and section hashes are
// recomputed by the writer).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace cmf { class Runtime; }

namespace cmf::convert {

struct RequantOptions {
    std::string input, output;
    std::string quant;          // --quant name
    std::string only;           // glob (name_matches); "" = every tensor
    uint64_t shard_max_bytes = 0;
    std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> on_progress;  // tensors, bytes (of input payloads)
};

struct RequantStats {
    uint64_t tensors = 0, reencoded = 0;
};

RequantStats requant(Runtime &rt, const RequantOptions &opts);

}  // namespace cmf::convert
