// The W1 writer (COMPAT §3.2): layout, directory, masks + sparse index,
// section_hashes, feature bits and header spelling as the original's
// CmfModel::write emits them; plus sharded output, in-place append growth
// (COMPAT §9.5) and compaction.
#pragma once

#include "container/format.hpp"

#include <boost/json/value.hpp>

#include <optional>
#include <string>
#include <vector>

namespace cmf { class Runtime; }

namespace cmf::container {

struct PendingTensor {
    std::string name;
    int32_t dtype = 0;
    uint32_t ndim = 0;
    uint64_t shape[CMF_MAX_DIMS] = {};
    const uint8_t *data = nullptr;  // borrowed
    uint64_t nbytes = 0;
    uint64_t hash = 0;
};

struct PendingMask {
    uint32_t task_id = 0;
    std::string name;
    std::optional<std::string> description, parent;
    std::optional<boost::json::value> quality;
    float sparsity = 0;
    std::string priority = "Normal";
    bool has_hot_pack = false, has_expert_fields = false;
    std::vector<uint8_t> blob;
};

// Test hook: called at named points of a write (after each payload, before
// the rename, before the envelope rewrite of an append). Crash tests make it
// kill the process. Never set outside tests.
extern void (*write_crash_hook)(const char *point);

class Writer {
public:
    Writer(Runtime &rt, std::string path, const std::string &header_json, uint64_t shard_max_bytes,
           std::optional<std::string> default_task);
    // Append mode: grows `path` in place.
    static Writer for_append(Runtime &rt, std::string path, const std::string *header_json);

    void add_tensor(const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape, const void *data,
                    uint64_t nbytes);
    void add_mask(PendingMask m) { masks_.push_back(std::move(m)); }
    void set_vocab(const void *data, uint64_t len);
    void finish();

private:
    Writer(Runtime &rt, std::string path) : rt_(&rt), path_(std::move(path)) {}
    void finish_append();

    Runtime *rt_;
    std::string path_;
    boost::json::value header_;
    bool keep_header_bytes_ = false;  // append without a new header
    uint64_t shard_max_bytes_ = 0;
    std::optional<std::string> default_task_;
    std::vector<PendingTensor> tensors_;
    std::vector<PendingMask> masks_;
    std::optional<std::vector<uint8_t>> vocab_;
    bool append_ = false;
    bool finished_ = false;
};

// Rewrite `in` (merged over shards) as one W1 file.
void compact(Runtime &rt, const std::string &in, const std::string &out);

}  // namespace cmf::container
