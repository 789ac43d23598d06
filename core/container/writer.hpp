// The two writers of the original (docs/container.md): W1 (Writer: the whole file
// laid out at finish, from borrowed payloads; also in-place append growth,
// spec §9, and compaction) and W2 (StreamWriter: each payload written
// to the file when it is added, header and directory written into a
// reserved gap at finish, so memory stays bounded by one tensor). Both set
// the directory, masks + sparse index, section_hashes, feature bits and
// header spelling as the original does, and both shard.
#pragma once

#include "common/hash64.hpp"
#include "container/format.hpp"

#include <boost/json/value.hpp>

#include <memory>
#include <optional>
#include <unordered_set>
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

// What both writers accept. Calls from one thread: add_* / set_vocab, then
// finish once. Nothing appears at the output path before finish succeeds.
class TensorWriter {
public:
    virtual ~TensorWriter() = default;
    virtual void add_tensor(const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape,
                            const void *data, uint64_t nbytes) = 0;
    void add_mask(PendingMask m) { masks_.push_back(std::move(m)); }
    void set_vocab(const void *data, uint64_t len);  // copied; len 0 = present but empty
    virtual void finish() = 0;

protected:
    explicit TensorWriter(std::optional<std::string> default_task = std::nullopt) : default_task_(std::move(default_task)) {}
    // masks meta default_task: the caller's, else the first mask's name, else "general".
    std::string default_task() const;
    // Shard `no` of `count` (1-based): the shard block, and shards after
    // the first drop what lives in shard 1 only (chat bundle, skills,
    // section_hashes of masks/vocab/index).
    static void set_shard(boost::json::value &header, uint64_t no, uint64_t count);

    std::optional<std::string> default_task_;
    std::vector<PendingMask> masks_;
    std::optional<std::vector<uint8_t>> vocab_;
};

class Writer final : public TensorWriter {
public:
    Writer(Runtime &rt, std::string path, const std::string &header_json, uint64_t shard_max_bytes,
           std::optional<std::string> default_task);
    // Append mode: grows `path` in place.
    static Writer for_append(Runtime &rt, std::string path, const std::string *header_json);
    // Append mode: the new directory leaves out the file's tensor `name`
    // (its bytes stay where they are, dead until compaction).
    void drop_existing(const std::string &name) { dropped_.insert(name); }

    // `data` is borrowed until finish().
    void add_tensor(const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape, const void *data,
                    uint64_t nbytes) override;
    void finish() override;

private:
    Writer(Runtime &rt, std::string path) : rt_(&rt), path_(std::move(path)) {}
    void finish_append();

    Runtime *rt_;
    std::string path_;
    boost::json::value header_;
    bool keep_header_bytes_ = false;  // append without a new header
    uint64_t shard_max_bytes_ = 0;
    std::vector<PendingTensor> tensors_;
    bool append_ = false;
    bool finished_ = false;
    std::unordered_set<std::string> dropped_;
};

namespace parts { class TempFile; class Out; }

// W2, as the original's streaming writer. The reserved gap is
// max(align(3·(128 + 16 + N·158 + 2^20), 4096), 2^20) with
// N = 2·max(source_tensor_count, 4096) — 7 032 832 bytes up to 4096 source
// tensors, room for tens of thousands of directory records. Sharded output
// keeps one temp file per shard and names them at finish, when the count
// is known.
class StreamWriter final : public TensorWriter {
public:
    StreamWriter(Runtime &rt, std::string path, const std::string &header_json, uint64_t source_tensor_count,
                 uint64_t shard_max_bytes, std::optional<std::string> default_task);
    ~StreamWriter() override;
    // `data` is written (copied) before add_tensor returns.
    void add_tensor(const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape, const void *data,
                    uint64_t nbytes) override;
    // One payload in pieces, so it is never whole in memory: begin_tensor
    // (nbytes must be the dtype's fixed size; see checked_tensor_header),
    // append until nbytes have come, end_tensor. Hashed as it streams.
    void begin_tensor(const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape, uint64_t nbytes);
    void append(const void *data, uint64_t n);
    void end_tensor();
    void finish() override;

    static uint64_t gap_bytes(uint64_t source_tensor_count);

private:
    struct Part;
    Part &open_part();
    Part &place(PendingTensor t);
    void close_open();

    Runtime *rt_;
    std::string path_;
    boost::json::value header_;
    uint64_t data_off_;
    uint64_t shard_max_bytes_;
    std::vector<std::unique_ptr<Part>> parts_;
    std::unordered_set<std::string> names_;
    bool finished_ = false;
    std::optional<PendingTensor> open_;  // the tensor whose bytes are being written
    uint64_t open_off_ = 0;
    Hash64Stream open_hash_;
};

class Model;
struct MaskRec;
// A mask as read, ready to write again (blob copied).
PendingMask pending_mask_of(const MaskRec &r);
// A model's masks (blobs copied, metadata as read) and vocab section, for
// tools that rewrite a file (compact, requant); copy_masks: the masks alone.
void copy_masks_and_vocab(const Model &m, TensorWriter &w);
void copy_masks(const Model &m, TensorWriter &w);

// Rewrite `in` (merged over shards) as one W1 file.
void compact(Runtime &rt, const std::string &in, const std::string &out);

}  // namespace cmf::container
