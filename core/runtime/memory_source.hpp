// A cmf_model_source over tensors held in memory (or borrowed from the
// caller): for tests, benchmarks and tools that build a model without a
// container. Not thread-safe while tensors are being added; after that the
// source is read-only and may be shared.
#pragma once

#include <cmf/cmf_plugin.h>

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

namespace cmf::runtime {

class MemoryModel {
public:
    MemoryModel();
    MemoryModel(const MemoryModel &) = delete;
    MemoryModel &operator=(const MemoryModel &) = delete;

    void set_arch_json(std::string json) { arch_json_ = std::move(json); }
    // Takes ownership of the bytes.
    void add(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, std::vector<uint8_t> bytes);
    // Borrows the bytes: they must outlive every user of source().
    void add_borrowed(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, const void *data,
                      uint64_t nbytes);
    // Total payload bytes of the tensors.
    uint64_t payload_bytes() const { return payload_bytes_; }

    // Valid while this object lives and no tensor is added.
    const cmf_model_source *source();

private:
    struct Entry {
        std::string name;
        cmf_tensor_view view{};
        std::vector<uint8_t> bytes;
    };
    static cmf_error *tensor_fn(void *user, const char *name, cmf_tensor_view *out);
    static cmf_error *tensor_at_fn(void *user, uint64_t index, const char **name, cmf_tensor_view *out);
    Entry &insert(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape);

    std::string arch_json_;
    std::deque<Entry> entries_;  // deque: views stay put while adding
    std::unordered_map<std::string, size_t> by_name_;
    uint64_t payload_bytes_ = 0;
    cmf_model_source src_{};
};

}  // namespace cmf::runtime
