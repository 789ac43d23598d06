// An opened CMF v2 model: one file or the merged shards of a sharded model.
// Opening validates everything the original's open() validates, in its
// order (docs/container.md), plus stricter checks where the original silently
// truncates or skips (overruns, out-of-range indices, nonzero tail bits); tensor
// payloads are never read here (except by a codec's structural validate()).
#pragma once

#include "container/format.hpp"
#include "container/header.hpp"
#include "container/mapped_file.hpp"

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cmf { class Runtime; }

namespace cmf::container {

struct TensorRec {
    std::string name;
    int32_t dtype = 0;
    uint32_t ndim = 0;
    uint64_t shape[CMF_MAX_DIMS] = {};
    uint64_t off = 0, nbytes = 0, hash = 0;
    uint32_t shard = 0;
    const uint8_t *data = nullptr;  // inside the shard's mapping
    uint32_t facts = 0;             // its codec's facts about the payload, from validation at open

    // The tensor as codecs and backends see it.
    cmf_tensor_view view() const {
        cmf_tensor_view v{};
        v.struct_size = sizeof v;
        v.dtype = dtype;
        v.ndim = ndim;
        v.facts = facts;
        for (uint32_t i = 0; i < CMF_MAX_DIMS; ++i) v.shape[i] = shape[i];
        v.data = data;
        v.nbytes = nbytes;
        return v;
    }
};

// Sizes of one mask blob, derived from header.arch (spec §5).
struct MaskLayout {
    uint64_t ffn_row_bytes = 0, head_row_bytes = 0, gate_bytes = 0, expert_row_bytes = 0;
    uint64_t physical_layers = 0, visits = 0;  // visits = layers * max(num_loops, 1)
};

struct MaskRec {
    uint32_t task_id = 0;
    std::string name, description, parent, priority, quality_json;
    bool has_description = false, has_parent = false;
    float sparsity = 0;
    bool has_hot_pack = false, has_expert_fields = false;
    uint64_t blob_off = 0, blob_len = 0;
    const uint8_t *blob = nullptr;
    uint64_t ffn_rows = 0;  // rows stored: visits (loop layout) or physical layers (legacy)
};

struct IndexEntry {
    uint32_t task_id = 0, layer = 0;
    std::vector<uint16_t> groups;
    std::vector<uint8_t> heads;
};

struct Shard {
    std::unique_ptr<MappedFile> file;
    Envelope env;
    Header header;
    std::vector<TensorRec> tensors;  // this shard's directory, shard field set
    const uint8_t *section(int s) const { return file->data() + env.off[s]; }
};

class Model {
public:
    // Opens `path` (any shard name of a sharded model unless CMF_OPEN_NO_SHARD_MERGE).
    // Throws cmf::Error; `out` must be freshly constructed.
    static void open(Model &out, Runtime &rt, const std::string &path, uint32_t flags);

    Runtime &runtime() const { return *rt_; }
    const std::vector<Shard> &shards() const { return shards_; }
    const Header &header() const { return shards_[0].header; }
    const std::string &header_text() const { return header_text_; }  // shard 1's header bytes
    const std::vector<TensorRec> &tensors() const { return tensors_; }
    const TensorRec *find(std::string_view name) const;
    const std::vector<MaskRec> &masks() const { return masks_; }
    const std::string &default_task() const { return default_task_; }
    const MaskLayout &mask_layout() const { return mask_layout_; }
    const std::vector<IndexEntry> &index() const { return index_; }
    bool has_vocab() const { return shards_[0].env.len[kVocab] > 0; }
    const uint8_t *vocab() const { return shards_[0].section(kVocab); }
    uint64_t vocab_len() const { return shards_[0].env.len[kVocab]; }

    // t's payload, once its bytes match the hash in its directory record
    // (HashMismatch naming the file and the tensor otherwise): what the
    // tools that copy or re-encode tensors into a new file read, so damaged
    // bytes are refused instead of being written out under a fresh hash
    // that would make them look sound.
    const uint8_t *verified(const TensorRec &t) const;

    // Dequantizes rows [row_begin, row_end) of tensor `i` into dst through its
    // codec, in parallel on the runtime's pool.
    void dequantize(size_t i, uint64_t row_begin, uint64_t row_end, float *dst, uint64_t dst_count) const;

private:
    Runtime *rt_ = nullptr;
    std::vector<Shard> shards_;
    std::vector<TensorRec> tensors_;
    std::unordered_map<std::string_view, size_t> by_name_;
    std::vector<MaskRec> masks_;
    std::string default_task_;
    MaskLayout mask_layout_;
    std::vector<IndexEntry> index_;
    std::string header_text_;
};

// One file alone, fully validated (steps 1-14 of open(), docs/container.md). Masks and the
// sparse index are decoded into `masks`/`index` when not NULL.
Shard open_shard(Runtime &rt, const std::string &path, bool allow_mmap, std::vector<MaskRec> *masks,
                 std::string *default_task, MaskLayout *layout, std::vector<IndexEntry> *index);

// The section decoders open_shard runs (each throws cmf::Error naming what
// is wrong; fuzz targets call them on arbitrary bytes). The directory: its
// records, names checked against the pool (payloads are not looked at).
std::vector<TensorRec> decode_directory(const uint8_t *d, uint64_t len);
// The masks section against the arch's dimensions: meta JSON, blobs, tail bits.
void decode_masks(const uint8_t *s, uint64_t len, const ArchInfo &arch, std::vector<MaskRec> &masks,
                  std::string &default_task, MaskLayout &layout);
// The sparse index section.
void decode_index(const uint8_t *s, uint64_t len, std::vector<IndexEntry> &out);

// A payload's size (via its dtype's codec: UnknownDtype without one) and
// structure; Bounds when they do not match the shape. Returns the codec's
// facts about the payload (cmf_tensor_view.facts; 0 from a codec without
// validate_facts).
uint32_t check_tensor_payload(Runtime &rt, const TensorRec &t);
// The size part of check_tensor_payload alone; returns the codec's expected
// size (CMF_SIZE_VARIABLE when the dtype's size varies).
uint64_t check_tensor_size(Runtime &rt, const TensorRec &t);

// The blob layout for an arch, and the expected blob sizes (loop / legacy).
MaskLayout mask_layout_for(const ArchInfo &arch);
// Blob sizes of the loop layout (one FFN row per visit) and the legacy one
// (per physical layer); false when they overflow.
bool mask_blob_sizes(const MaskLayout &l, bool experts, uint64_t &loop_size, uint64_t &legacy_size);
// "" when every tail bit beyond a dimension is zero, else what is wrong.
// The blob must have one of the sizes above (ffn_rows matching it).
std::string mask_tail_problem(const ArchInfo &arch, const MaskLayout &layout, const uint8_t *blob, uint64_t ffn_rows,
                              bool experts);

// Splits "{stem}-{no:05}-of-{count:05}.cmf"; false when `path` does not match.
bool parse_shard_name(const std::string &path, std::string &stem, uint64_t &no, uint64_t &count);
std::string shard_name(const std::string &stem, uint64_t no, uint64_t count);

}  // namespace cmf::container

struct cmf_model : cmf::container::Model {};
