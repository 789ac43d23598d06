// What the converter reads: tensors in a memory-mapped source file
// (a safetensors shard, or a GGUF file seen as Hugging Face tensors), each
// with its Hugging Face name and shape, read as f32 element ranges.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cmf::convert {

// The mapped file a source tensor's bytes live in. The converter releases a
// tensor's pages once it has read them, which bounds its resident set to the
// tensors in flight whatever the model's size.
class SourceFile {
public:
    virtual ~SourceFile() = default;
    virtual const std::string &path() const = 0;
    // Drop the pages of [from, to) (whole pages only). The mapping is
    // private and never written, so a later read maps them again.
    virtual void release_bytes(const uint8_t *from, const uint8_t *to) const = 0;
};

// madvise(DONTNEED) the whole pages of [from, to) inside a private
// read-only mapping that starts at `map_base`: what release_bytes does.
void release_mapped_pages(const void *map_base, const uint8_t *from, const uint8_t *to);

// F32/F16/BF16 (safetensors and GGUF), or a GGUF block type (`ggml_type`).
enum class SourceDtype : uint8_t { F32, F16, BF16, Ggml };

struct SourceTensor {
    std::string name;
    SourceDtype dtype = SourceDtype::F32;
    uint32_t ggml_type = 0;         // SourceDtype::Ggml: the GGUF tensor type
    std::vector<uint64_t> shape;
    const uint8_t *data = nullptr;  // into the file mapping (may be unaligned)
    uint64_t nbytes = 0;
    uint64_t elements = 0;
    std::string file;               // path of the file holding it, for messages
    const SourceFile *owner = nullptr;
    // Added to every value read (0 = none): undoes a constant offset the
    // source format applied (llama.cpp stores Gemma's norm weights + 1).
    float add = 0.0f;
};

// "F32", "BF16", "Q4_K", ...
std::string source_dtype_name(const SourceTensor &t);
// Bytes of the source holding elements [0, count) (whole blocks: rounded down).
uint64_t source_bytes(const SourceTensor &t, uint64_t count);

// Convert `count` elements starting at element `first` of a source tensor to f32.
void read_f32(const SourceTensor &t, uint64_t first, uint64_t count, float *dst);

// Drop the pages of elements [first, first + count) (no-op without an owner).
void release_elements(const SourceTensor &t, uint64_t first, uint64_t count);

}  // namespace cmf::convert
