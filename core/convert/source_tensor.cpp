#include "convert/source_tensor.hpp"

#include "common/error.hpp"
#include "convert/gguf.hpp"

// f16/bf16 decoding exactly as the codecs (the original's rules, docs/dtypes.md): header-only, shared.
#include "half.hpp"

#include <algorithm>
#include <cstring>

#include <sys/mman.h>
#include <unistd.h>

namespace cmf::convert {

namespace {
struct Block {
    uint64_t elems, bytes;
};
Block block_of(const SourceTensor &t) {
    switch (t.dtype) {
    case SourceDtype::F32: return {1, 4};
    case SourceDtype::F16:
    case SourceDtype::BF16: return {1, 2};
    case SourceDtype::Ggml: break;
    }
    const gguf::TypeInfo *ti = gguf::type_info(t.ggml_type);
    if (!ti) throw Error(CMF_ERR_INTERNAL, t.file + ": tensor \"" + t.name + "\": unknown GGUF type");
    return {ti->elems, ti->bytes};
}
}  // namespace

std::string source_dtype_name(const SourceTensor &t) {
    switch (t.dtype) {
    case SourceDtype::F32: return "F32";
    case SourceDtype::F16: return "F16";
    case SourceDtype::BF16: return "BF16";
    case SourceDtype::Ggml: break;
    }
    return gguf::type_name(t.ggml_type);
}

uint64_t source_bytes(const SourceTensor &t, uint64_t count) {
    const Block b = block_of(t);
    return count / b.elems * b.bytes;
}

void read_f32(const SourceTensor &t, uint64_t first, uint64_t count, float *dst) {
    if (first > t.elements || count > t.elements - first)
        throw Error(CMF_ERR_INTERNAL, t.file + ": tensor \"" + t.name + "\": element range out of bounds");
    switch (t.dtype) {
    case SourceDtype::F32:
        std::memcpy(dst, t.data + first * 4, count * 4);  // the source may be unaligned
        break;
    case SourceDtype::F16:
        for (uint64_t i = 0; i < count; ++i) {
            uint16_t h;
            std::memcpy(&h, t.data + (first + i) * 2, 2);
            dst[i] = codecs::f16_to_f32(h);
        }
        break;
    case SourceDtype::BF16:
        for (uint64_t i = 0; i < count; ++i) {
            uint16_t h;
            std::memcpy(&h, t.data + (first + i) * 2, 2);
            dst[i] = codecs::bf16_to_f32(h);
        }
        break;
    case SourceDtype::Ggml: {
        // Whole blocks straight into dst; a range starting or ending inside
        // a block goes through one block's worth of scratch.
        const Block b = block_of(t);
        float scratch[256];
        uint64_t at = first, end = first + count;
        while (at < end) {
            const uint64_t blk = at / b.elems, in = at % b.elems;
            const uint8_t *src = t.data + blk * b.bytes;
            if (in == 0 && end - at >= b.elems) {
                const uint64_t whole = (end - at) / b.elems;
                gguf::dequantize(t.ggml_type, src, whole * b.elems, dst + (at - first));
                at += whole * b.elems;
            } else {
                gguf::dequantize(t.ggml_type, src, b.elems, scratch);
                const uint64_t n = std::min(b.elems - in, end - at);
                std::memcpy(dst + (at - first), scratch + in, n * 4);
                at += n;
            }
        }
        break;
    }
    }
    if (t.add != 0.0f)
        for (uint64_t i = 0; i < count; ++i) dst[i] += t.add;
}

void release_mapped_pages(const void *map_base, const uint8_t *from, const uint8_t *to) {
    if (!map_base || from >= to) return;
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto base = reinterpret_cast<uintptr_t>(map_base);
    auto begin = reinterpret_cast<uintptr_t>(from), end = reinterpret_cast<uintptr_t>(to);
    begin = base + (begin - base + page - 1) / page * page;  // only whole pages inside the range
    end = base + (end - base) / page * page;
    if (end > begin) ::madvise(reinterpret_cast<void *>(begin), end - begin, MADV_DONTNEED);
}

void release_elements(const SourceTensor &t, uint64_t first, uint64_t count) {
    if (!t.owner) return;
    const uint64_t lo = source_bytes(t, first), hi = std::min(t.nbytes, source_bytes(t, first + count));
    if (hi > lo) t.owner->release_bytes(t.data + lo, t.data + hi);
}

}  // namespace cmf::convert
