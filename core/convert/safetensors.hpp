// Reading Hugging Face safetensors checkpoints for the converter.
//
// A safetensors file is: u64 LE header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
//  "__metadata__": {str: str}}, then the data region the offsets point into.
// Files are memory-mapped read-only; every tensor is validated on open
// (dtype, shape, offsets in range, size = elements x dtype size, no two
// tensors overlapping), so later reads cannot go out of bounds. Errors are
// cmf::Error naming the file and, where it applies, the tensor.
#pragma once

#include "convert/source_tensor.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cmf::convert {

// Refuse headers larger than this (the reference safetensors crate uses the
// same 100 MB cap): a corrupt length must not make us map or parse gigabytes.
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// One mapped .safetensors file (F32, F16 and BF16 tensors; others are
// refused by name).
class SafetensorsFile : public SourceFile {
public:
    // Maps and validates the whole header. Throws cmf::Error.
    explicit SafetensorsFile(const std::string &path);
    // The same validation over bytes already in memory, which must outlive
    // the object (`name` stands for the path in messages; release() does
    // nothing). Used by the fuzz target, and by anything that holds a
    // checkpoint in memory.
    SafetensorsFile(const std::string &name, const uint8_t *bytes, uint64_t size);
    ~SafetensorsFile() override;
    SafetensorsFile(const SafetensorsFile &) = delete;
    SafetensorsFile &operator=(const SafetensorsFile &) = delete;

    const std::string &path() const override { return path_; }
    // Tensors sorted by name (byte order, as the original reads them).
    const std::vector<SourceTensor> &tensors() const { return tensors_; }
    const SourceTensor *find(const std::string &name) const;
    const std::map<std::string, std::string> &metadata() const { return metadata_; }
    // Tell the kernel a tensor's pages are no longer needed (bounds the
    // converter's resident set to the tensors in flight).
    void release(const SourceTensor &t) const { release_bytes(t.data, t.data + t.nbytes); }
    void release_bytes(const uint8_t *from, const uint8_t *to) const override;

private:
    void parse(const uint8_t *bytes);  // the header of size_ bytes at `bytes`
    std::string path_;
    void *map_ = nullptr;
    uint64_t size_ = 0;
    std::vector<SourceTensor> tensors_;
    std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` (its `weight_map`: tensor -> file); other
// stems for other layouts (diffusers: "diffusion_pytorch_model").
class Checkpoint {
public:
    explicit Checkpoint(const std::string &dir, const std::string &stem = "model");

    const std::string &dir() const { return dir_; }
    // Files in the original's order: single file, or the index's distinct
    // weight_map values sorted by name.
    const std::vector<std::unique_ptr<SafetensorsFile>> &files() const { return files_; }
    // Every tensor over all files, in file order then name order.
    const std::vector<const SourceTensor *> &tensors() const { return all_; }
    const SourceTensor *find(const std::string &name) const;
    const SafetensorsFile &file_of(const SourceTensor &t) const;

private:
    std::string dir_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::vector<const SourceTensor *> all_;
    std::map<std::string, std::pair<const SourceTensor *, size_t>> by_name_;
};

}  // namespace cmf::convert
