#include "container/model.hpp"

#include "common/hash64.hpp"
#include "common/json.hpp"
#include "container/in_place.hpp"

#include "plugin_host/runtime.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <optional>
#include <tuple>

namespace cmf::container {

namespace {

[[noreturn]] void bounds(const std::string &m) { throw Error(CMF_ERR_BOUNDS, m); }
[[noreturn]] void parse_fail(const std::string &m) { throw Error(CMF_ERR_PARSE, m); }

// The message of an error a codec returned; frees it.
std::string take_message(cmf_error *e) {
    std::string msg = e->message;
    if (!is_static_error(e)) delete e;
    return msg;
}

std::string tensor_label(const TensorRec &t) { return "tensor '" + t.name + "'"; }

}  // namespace

// Step 9 of open() (docs/container.md): the directory, record by record.
std::vector<TensorRec> decode_directory(const uint8_t *d, uint64_t len) {
    if (len < 16) parse_fail("directory: " + std::to_string(len) + " bytes, shorter than its 16-byte head");
    uint64_t count = rd64(d), pool_off = rd64(d + 8), rec_bytes, rec_end;
    if (!mul_ok(count, kDirRecordSize, rec_bytes) || !add_ok(16, rec_bytes, rec_end))
        parse_fail("directory: tensor count " + std::to_string(count) + " overflows");
    if (rec_end > len) parse_fail("directory: " + std::to_string(count) + " records do not fit in " + std::to_string(len) + " bytes");
    if (pool_off > len) parse_fail("directory: name pool offset " + std::to_string(pool_off) + " beyond the directory");
    if (pool_off < rec_end) parse_fail("directory: name pool offset " + std::to_string(pool_off) + " overlaps the records");
    const uint64_t pool_len = len - pool_off;
    std::vector<TensorRec> out;
    out.reserve(size_t(count));
    for (uint64_t i = 0; i < count; ++i) {
        const uint8_t *r = d + 16 + i * kDirRecordSize;
        TensorRec t;
        uint32_t name_off = rd32(r);
        uint16_t name_len = rd16(r + 4);
        uint8_t dtype = r[6];
        t.ndim = r[7];
        const std::string which = "directory record " + std::to_string(i);
        if (t.ndim > CMF_MAX_DIMS) parse_fail(which + ": ndim " + std::to_string(t.ndim) + " > 6");
        if (uint64_t(name_off) + name_len > pool_len)
            parse_fail(which + ": name [" + std::to_string(name_off) + ", +" + std::to_string(name_len) + ") beyond the name pool");
        const char *name = reinterpret_cast<const char *>(d + pool_off + name_off);
        if (!simdjson::validate_utf8(name, name_len)) parse_fail(which + ": tensor name is not valid UTF-8");
        t.name.assign(name, name_len);
        if (dtype > kMaxDtypeId)
            throw Error(CMF_ERR_UNKNOWN_DTYPE, "tensor '" + t.name + "': unknown dtype id " + std::to_string(dtype));
        t.dtype = dtype;
        for (uint32_t k = 0; k < t.ndim; ++k) t.shape[k] = rd32(r + 8 + 4 * k);
        t.off = rd64(r + 32);
        t.nbytes = rd64(r + 40);
        t.hash = rd64(r + 48);
        out.push_back(std::move(t));
    }
    return out;
}

namespace {

// Step 10: bounds of one payload, then its size and structure via the codec.
void check_tensor_bounds(const TensorRec &t, uint64_t data_len) {
    if (t.off % kTensorAlign != 0) bounds(tensor_label(t) + ": offset " + std::to_string(t.off) + " is not a multiple of 64");
    uint64_t end;
    if (!add_ok(t.off, t.nbytes, end)) bounds(tensor_label(t) + ": offset + nbytes overflows");
    if (end > data_len)
        bounds(tensor_label(t) + ": payload [" + std::to_string(t.off) + ", " + std::to_string(end) + ") beyond data_len " +
               std::to_string(data_len));
}

}  // namespace

uint64_t check_tensor_size(Runtime &rt, const TensorRec &t) {
    uint64_t n = 1;
    for (uint32_t k = 0; k < t.ndim; ++k)
        if (!mul_ok(n, t.shape[k], n)) bounds(tensor_label(t) + ": element count overflows");
    const CodecEntry *codec = rt.codec(t.dtype);
    if (codec == nullptr)
        throw Error(CMF_ERR_UNKNOWN_DTYPE, tensor_label(t) + ": no codec registered for dtype id " + std::to_string(t.dtype));
    uint64_t expected = 0;
    if (cmf_error *e = codec->vt.expected_size(codec->ctx, t.ndim, t.shape, &expected)) {
        bounds(tensor_label(t) + " (" + codec->name + "): " + take_message(e));
    }
    if (expected != CMF_SIZE_VARIABLE && expected != t.nbytes)
        bounds(tensor_label(t) + " (" + codec->name + "): nbytes " + std::to_string(t.nbytes) + " but its shape needs " +
               std::to_string(expected));
    return expected;
}

uint32_t check_tensor_payload(Runtime &rt, const TensorRec &t) {
    check_tensor_size(rt, t);
    const CodecEntry *codec = rt.codec(t.dtype);
    cmf_tensor_view v = t.view();
    v.facts = 0;  // the bytes are being asked about, not yet known
    uint32_t facts = 0;
    cmf_error *e = nullptr;
    if (codec->vt.validate_facts != nullptr) e = codec->vt.validate_facts(codec->ctx, &v, &facts);
    else if (codec->vt.validate != nullptr) e = codec->vt.validate(codec->ctx, &v);
    if (e != nullptr) bounds(tensor_label(t) + " (" + codec->name + "): " + take_message(e));
    return facts;
}

void decode_masks(const uint8_t *s, uint64_t len, const ArchInfo &arch, std::vector<MaskRec> &masks,
                  std::string &default_task, MaskLayout &layout) {
    const std::string where = "masks section: ";
    if (len < 8) parse_fail(where + "shorter than its 8-byte head");
    uint32_t n_masks = rd32(s), meta_len = rd32(s + 4);
    if (uint64_t(8) + meta_len > len) parse_fail(where + "meta JSON length " + std::to_string(meta_len) + " beyond the section");
    simdjson::dom::parser parser;
    simdjson::dom::object meta;
    if (parse_json(parser, std::string_view(reinterpret_cast<const char *>(s + 8), meta_len), "masks section: meta").get(meta) !=
        simdjson::SUCCESS)
        parse_fail(where + "meta is not a JSON object");
    std::string_view sv;
    if (meta["default_task"].get(sv) != simdjson::SUCCESS) parse_fail(where + "meta.default_task missing or not a string");
    default_task = std::string(sv);
    simdjson::dom::array list;
    if (meta["masks"].get(list) != simdjson::SUCCESS) parse_fail(where + "meta.masks missing or not an array");
    if (list.size() != n_masks)
        parse_fail(where + "n_masks " + std::to_string(n_masks) + " but meta lists " + std::to_string(list.size()));
    layout = mask_layout_for(arch);
    const uint64_t N = layout.physical_layers;
    for (simdjson::dom::element el : list) {
        simdjson::dom::object o;
        if (el.get(o) != simdjson::SUCCESS) parse_fail(where + "each mask must be an object");
        MaskRec m;
        uint64_t u;
        auto need_uint = [&](const char *k) {
            if (o[k].get(u) != simdjson::SUCCESS) parse_fail(where + "mask key '" + k + "' missing or not an unsigned integer");
            return u;
        };
        m.task_id = uint32_t(need_uint("task_id"));
        if (o["name"].get(sv) != simdjson::SUCCESS) parse_fail(where + "mask key 'name' missing or not a string");
        m.name = std::string(sv);
        const std::string mw = where + "mask '" + m.name + "': ";
        simdjson::dom::element spe;
        std::optional<double> sp;
        if (o["sparsity"].get(spe) != simdjson::SUCCESS || !(sp = json::number_of(spe))) parse_fail(mw + "'sparsity' missing or not a number");
        m.sparsity = float(*sp);
        if (o["priority"].get(sv) != simdjson::SUCCESS) parse_fail(mw + "'priority' missing or not a string");
        m.priority = std::string(sv);
        if (m.priority != "Fallback" && m.priority != "Normal" && m.priority != "Primary")
            parse_fail(mw + "unknown priority '" + m.priority + "'");
        m.blob_off = need_uint("blob_off");
        m.blob_len = need_uint("blob_len");
        simdjson::dom::element e;
        if (o["description"].get(e) == simdjson::SUCCESS && !e.is_null()) {
            if (e.get(sv) != simdjson::SUCCESS) parse_fail(mw + "'description' must be a string or null");
            m.description = std::string(sv);
            m.has_description = true;
        }
        if (o["parent"].get(e) == simdjson::SUCCESS && !e.is_null()) {
            if (e.get(sv) != simdjson::SUCCESS) parse_fail(mw + "'parent' must be a string or null");
            m.parent = std::string(sv);
            m.has_parent = true;
        }
        if (o["quality"].get(e) == simdjson::SUCCESS && !e.is_null()) {
            if (!e.is_object()) parse_fail(mw + "'quality' must be an object or null");
            m.quality_json = simdjson::minify(e);
        }
        for (auto [k, dst] : {std::pair{"has_hot_pack", &m.has_hot_pack}, std::pair{"has_expert_fields", &m.has_expert_fields}})
            if (o[k].get(e) == simdjson::SUCCESS && !e.is_null() && e.get(*dst) != simdjson::SUCCESS)
                parse_fail(mw + "'" + k + "' must be a boolean");
        if (m.has_expert_fields && !arch.has_moe) parse_fail(mw + "has_expert_fields but the arch has no moe block");
        uint64_t end;
        if (!add_ok(m.blob_off, m.blob_len, end) || end > len)
            parse_fail(mw + "blob [" + std::to_string(m.blob_off) + ", +" + std::to_string(m.blob_len) + ") beyond the section");
        // FFN row count from blob_len: loop layout (one row per visit) or legacy (per physical layer).
        uint64_t loop_size = 0, legacy_size = 0;
        if (!mask_blob_sizes(layout, m.has_expert_fields, loop_size, legacy_size))
            parse_fail(mw + "the arch's mask dimensions overflow");
        if (m.blob_len == loop_size) m.ffn_rows = layout.visits;
        else if (m.blob_len == legacy_size) m.ffn_rows = N;
        else
            parse_fail(mw + "blob_len " + std::to_string(m.blob_len) + " matches neither the loop layout (" +
                       std::to_string(loop_size) + ") nor the legacy layout (" + std::to_string(legacy_size) + ")");
        m.blob = s + m.blob_off;
        // Tail bits beyond each dimension must be zero (spec §5): checked here,
        // stricter than the original, so popcounts never see phantom units.
        std::string tail_problem = mask_tail_problem(arch, layout, m.blob, m.ffn_rows, m.has_expert_fields);
        if (!tail_problem.empty()) parse_fail(mw + tail_problem);
        masks.push_back(std::move(m));
    }
}

void decode_index(const uint8_t *s, uint64_t len, std::vector<IndexEntry> &out) {
    const std::string where = "sparse index: ";
    if (len < 8) parse_fail(where + "shorter than its 8-byte head");
    uint32_t n = rd32(s);
    uint64_t pos = 8;
    for (uint32_t i = 0; i < n; ++i) {
        if (len - pos < 16) parse_fail(where + "entry " + std::to_string(i) + " runs past the section");
        IndexEntry e;
        e.task_id = rd32(s + pos);
        e.layer = rd32(s + pos + 4);
        uint64_t ng = rd32(s + pos + 8), nh = rd32(s + pos + 12);
        pos += 16;
        if ((len - pos) < 2 * ng || (len - pos - 2 * ng) < nh)
            parse_fail(where + "entry " + std::to_string(i) + " lists more indices than the section holds");
        e.groups.resize(size_t(ng));
        for (uint64_t g = 0; g < ng; ++g) e.groups[size_t(g)] = rd16(s + pos + 2 * g);
        pos += 2 * ng;
        e.heads.assign(s + pos, s + pos + nh);
        pos += nh;
        pos = std::min(align_up(pos, 4), len);
        out.push_back(std::move(e));
    }
}

static bool tail_bits_zero(const uint8_t *row, uint64_t row_bytes, uint64_t dim) {
    if (dim % 8 == 0 || row_bytes == 0) return true;
    return (row[row_bytes - 1] >> (dim % 8)) == 0;
}

MaskLayout mask_layout_for(const ArchInfo &arch) {
    auto bytes_for = [](uint64_t bits) { return bits / 8 + (bits % 8 != 0); };
    MaskLayout l;
    l.physical_layers = arch.num_layers;
    if (!mul_ok(arch.num_layers, std::max<uint64_t>(arch.num_loops, 1), l.visits)) l.visits = UINT64_MAX;
    l.ffn_row_bytes = bytes_for(arch.intermediate_size);
    l.head_row_bytes = bytes_for(arch.num_attention_heads);
    l.gate_bytes = bytes_for(arch.num_layers);
    l.expert_row_bytes = arch.has_moe ? bytes_for(arch.moe_num_experts) : 0;
    return l;
}

std::string mask_tail_problem(const ArchInfo &arch, const MaskLayout &layout, const uint8_t *blob, uint64_t ffn_rows,
                              bool experts) {
    const uint64_t N = layout.physical_layers;
    const uint8_t *p = blob;
    for (uint64_t r = 0; r < ffn_rows; ++r, p += layout.ffn_row_bytes)
        if (!tail_bits_zero(p, layout.ffn_row_bytes, arch.intermediate_size))
            return "FFN row " + std::to_string(r) + " has bits set beyond intermediate_size";
    for (uint64_t r = 0; r < N; ++r, p += layout.head_row_bytes)
        if (!tail_bits_zero(p, layout.head_row_bytes, arch.num_attention_heads))
            return "head row " + std::to_string(r) + " has bits set beyond num_attention_heads";
    if (!tail_bits_zero(p, layout.gate_bytes, N)) return "layer gates have bits set beyond num_layers";
    p += layout.gate_bytes;
    if (experts)
        for (uint64_t r = 0; r < N; ++r, p += layout.expert_row_bytes)
            if (!tail_bits_zero(p, layout.expert_row_bytes, arch.moe_num_experts))
                return "expert row " + std::to_string(r) + " has bits set beyond num_experts";
    return "";
}

bool mask_blob_sizes(const MaskLayout &l, bool experts, uint64_t &loop_size, uint64_t &legacy_size) {
    const uint64_t N = l.physical_layers;
    uint64_t heads, expert = 0, tail, ffn_loop, ffn_legacy;
    if (!mul_ok(N, l.head_row_bytes, heads) || (experts && !mul_ok(N, l.expert_row_bytes, expert)) ||
        !add_ok(heads, l.gate_bytes, tail) || !add_ok(tail, expert, tail) || !mul_ok(l.visits, l.ffn_row_bytes, ffn_loop) ||
        !mul_ok(N, l.ffn_row_bytes, ffn_legacy) || !add_ok(ffn_loop, tail, loop_size) || !add_ok(ffn_legacy, tail, legacy_size))
        return false;
    return true;
}

Shard open_shard(Runtime &rt, const std::string &path, bool allow_mmap, std::vector<MaskRec> *masks,
                 std::string *default_task, MaskLayout *layout, std::vector<IndexEntry> *index) {
    Shard sh;
    // An in-place rewrite interrupted by a crash is completed (its redo
    // journal replayed) before anything is read, as SQLite rolls a hot
    // journal: the file is then all old or all new (container/in_place.hpp).
    recover_in_place(path);
    sh.file = std::make_unique<MappedFile>(path, allow_mmap);  // 1. FileNotFound / Io
    const uint8_t *f = sh.file->data();
    const uint64_t size = sh.file->size();
    if (size < kEnvelopeSize)  // 2. before the magic
        bounds("file is " + std::to_string(size) + " bytes, shorter than the 128-byte envelope");
    if (std::memcmp(f, kMagic, 4) != 0) throw Error(CMF_ERR_INVALID_MAGIC, "not a CMF file: magic is not \"CMF\\x01\"");
    sh.env = Envelope::decode(f);
    const Envelope &env = sh.env;
    if (env.version != kVersion)
        throw Error(CMF_ERR_UNSUPPORTED_VERSION, "CMF version " + std::to_string(env.version) + " (only 2 is supported)");
    if (uint32_t unknown = env.required_features & ~uint32_t(CMF_FEATURES_SUPPORTED)) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "0x%x", unknown);
        throw Error(CMF_ERR_UNSUPPORTED_FEATURE, std::string("required_features has bits this reader does not support: ") + buf);
    }
    for (int s = 0; s < kSectionCount; ++s) {  // 6
        if ((s == kHeader || s == kDir) && env.len[s] == 0) bounds(std::string(section_name(s)) + " section is required but has length 0");
        if (env.len[s] == 0) continue;
        uint64_t end;
        if (!add_ok(env.off[s], env.len[s], end)) bounds(std::string(section_name(s)) + " section: offset + length overflows");
        if (end > size)
            bounds(std::string(section_name(s)) + " section [" + std::to_string(env.off[s]) + ", " + std::to_string(end) +
                   ") beyond the end of the file (" + std::to_string(size) + " bytes)");
    }
    if (env.len[kData] > 0 && env.off[kData] % kDataAlign != 0)  // 7
        bounds("data_off " + std::to_string(env.off[kData]) + " is not a multiple of 4096");
    sh.header = parse_header(sh.section(kHeader), env.len[kHeader]);  // 8
    sh.tensors = decode_directory(sh.section(kDir), env.len[kDir]);   // 9
    const uint8_t *data = sh.section(kData);
    for (auto &t : sh.tensors) {  // 10
        check_tensor_bounds(t, env.len[kData]);
        t.data = data + t.off;  // only now known to lie inside the data section
        t.facts = check_tensor_payload(rt, t);
    }
    {  // 11
        std::unordered_map<std::string_view, size_t> seen;
        for (size_t i = 0; i < sh.tensors.size(); ++i)
            if (!seen.emplace(sh.tensors[i].name, i).second) parse_fail("duplicate tensor name '" + sh.tensors[i].name + "'");
    }
    std::vector<MaskRec> local_masks;
    std::string local_default;
    MaskLayout local_layout;
    if (env.len[kMasks] > 0)  // 12
        decode_masks(sh.section(kMasks), env.len[kMasks], sh.header.arch, masks ? *masks : local_masks,
                     default_task ? *default_task : local_default, layout ? *layout : local_layout);
    std::vector<IndexEntry> local_index;
    if (env.len[kIndex] > 0) decode_index(sh.section(kIndex), env.len[kIndex], index ? *index : local_index);  // 14
    return sh;
}

bool parse_shard_name(const std::string &path, std::string &stem, uint64_t &no, uint64_t &count) {
    // "{stem}-NNNNN-of-NNNNN.cmf": 19 characters after the stem.
    static const std::string_view pattern = "-#####-of-#####.cmf";
    if (path.size() <= pattern.size()) return false;
    const size_t base = path.size() - pattern.size();
    uint64_t nums[2] = {0, 0};
    int which = 0;
    for (size_t i = 0; i < pattern.size(); ++i) {
        char c = path[base + i];
        if (pattern[i] == '#') {
            if (c < '0' || c > '9') return false;
            nums[which] = nums[which] * 10 + uint64_t(c - '0');
        } else {
            if (c != pattern[i]) return false;
            if (i > 0 && pattern[i - 1] == '#') which = 1;
        }
    }
    stem = path.substr(0, base);
    no = nums[0];
    count = nums[1];
    return true;
}

std::string shard_name(const std::string &stem, uint64_t no, uint64_t count) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "-%05llu-of-%05llu.cmf", static_cast<unsigned long long>(no),
                  static_cast<unsigned long long>(count));
    return stem + buf;
}

void Model::open(Model &m, Runtime &rt, const std::string &path, uint32_t flags) {
    m.rt_ = &rt;
    const bool allow_mmap = !(flags & CMF_OPEN_NO_MMAP);
    Shard first = open_shard(rt, path, allow_mmap, &m.masks_, &m.default_task_, &m.mask_layout_, &m.index_);
    if (first.header.shard && !(flags & CMF_OPEN_NO_SHARD_MERGE)) {
        const ShardBlock b = *first.header.shard;
        std::string stem;
        uint64_t no = 0, count = 0;
        if (b.count == 0 || b.no == 0 || b.no > b.count)
            parse_fail("'" + path + "': invalid shard block {no: " + std::to_string(b.no) + ", count: " + std::to_string(b.count) + "}");
        if (!parse_shard_name(path, stem, no, count))
            parse_fail("'" + path + "' carries a shard block but its name does not follow {stem}-NNNNN-of-NNNNN.cmf");
        if (no != b.no || count != b.count)
            parse_fail("'" + path + "': file name says shard " + std::to_string(no) + " of " + std::to_string(count) +
                       " but its header says " + std::to_string(b.no) + " of " + std::to_string(b.count));
        if (b.no != 1) {  // normalize to shard 1 (the masks, vocab and registry live there)
            m.masks_.clear();
            m.index_.clear();
            first = open_shard(rt, shard_name(stem, 1, count), allow_mmap, &m.masks_, &m.default_task_, &m.mask_layout_, &m.index_);
            if (!first.header.shard || first.header.shard->no != 1 || first.header.shard->count != count)
                parse_fail("'" + shard_name(stem, 1, count) + "' is not shard 1 of " + std::to_string(count));
        }
        m.shards_.push_back(std::move(first));
        for (uint64_t i = 2; i <= count; ++i) {
            const std::string name = shard_name(stem, i, count);
            Shard s;
            try {
                s = open_shard(rt, name, allow_mmap, nullptr, nullptr, nullptr, nullptr);
            } catch (const Error &e) {
                if (e.code() == CMF_ERR_FILE_NOT_FOUND)
                    throw Error(CMF_ERR_FILE_NOT_FOUND, "shard " + std::to_string(i) + " of " + std::to_string(count) + " is missing: '" + name + "'");
                throw Error(e.code(), "shard '" + name + "': " + e.message());
            }
            if (!s.header.shard || s.header.shard->no != i || s.header.shard->count != count)
                parse_fail("shard '" + name + "': header shard block does not say {no: " + std::to_string(i) +
                           ", count: " + std::to_string(count) + "}" +
                           (s.header.shard ? " (it says " + std::to_string(s.header.shard->no) + " of " +
                                                 std::to_string(s.header.shard->count) + ")"
                                           : " (it has none)"));
            // Nothing in the format ties shards together but {no, count}; a
            // shard of another conversion still verifies alone. Every shard
            // of one conversion carries the same arch, quant_type and
            // provenance, so a difference there gives such a shard away.
            const Header &h1 = m.shards_[0].header;
            for (auto [key, a, b] : {std::tuple{"arch", &h1.arch_json, &s.header.arch_json},
                                     std::tuple{"quant_type", &h1.quant_type, &s.header.quant_type},
                                     std::tuple{"provenance", &h1.provenance_json, &s.header.provenance_json}})
                if (*a != *b)
                    parse_fail("shard '" + name + "' belongs to another model: its header's " + key + " differs from shard 1's");
            m.shards_.push_back(std::move(s));
        }
    } else {
        m.shards_.push_back(std::move(first));
    }
    const Shard &s1 = m.shards_[0];
    m.header_text_.assign(reinterpret_cast<const char *>(s1.section(kHeader)), size_t(s1.env.len[kHeader]));
    for (uint32_t si = 0; si < m.shards_.size(); ++si)
        for (auto &t : m.shards_[si].tensors) {
            t.shard = si;
            m.tensors_.push_back(t);
        }
    m.by_name_.reserve(m.tensors_.size());
    for (size_t i = 0; i < m.tensors_.size(); ++i)
        if (!m.by_name_.emplace(m.tensors_[i].name, i).second)
            parse_fail("duplicate tensor name '" + m.tensors_[i].name + "' across shards");
}

const TensorRec *Model::find(std::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t *Model::verified(const TensorRec &t) const {
    const uint64_t h = hash64(t.data, size_t(t.nbytes));
    if (h != t.hash)
        throw Error(CMF_ERR_HASH_MISMATCH, shards_.at(t.shard).file->path() + ": tensor '" + t.name + "': payload hash64 " +
                                               hex16(h) + " does not match its directory's " + hex16(t.hash) +
                                               " (the file is damaged; cmfhost verify lists every such tensor)");
    return t.data;
}

void Model::dequantize(size_t i, uint64_t row_begin, uint64_t row_end, float *dst, uint64_t dst_count) const {
    if (i >= tensors_.size()) throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor index " + std::to_string(i) + " out of range");
    const TensorRec &t = tensors_[i];
    const CodecEntry *codec = rt_->codec(t.dtype);
    if (codec == nullptr)
        throw Error(CMF_ERR_UNKNOWN_DTYPE, tensor_label(t) + ": no codec registered for dtype id " + std::to_string(t.dtype));
    if (codec->vt.dequantize_rows == nullptr) throw Error(CMF_ERR_UNSUPPORTED, "codec " + codec->name + " cannot dequantize");
    const uint64_t rows = t.ndim >= 2 ? t.shape[0] : 1;
    uint64_t row_len = 1;
    for (uint32_t k = (t.ndim >= 2 ? 1 : 0); k < t.ndim; ++k) row_len *= t.shape[k];  // bounded: checked at open
    if (row_begin > row_end || row_end > rows)
        throw Error(CMF_ERR_INVALID_ARGUMENT, tensor_label(t) + ": rows [" + std::to_string(row_begin) + ", " +
                                                   std::to_string(row_end) + ") outside [0, " + std::to_string(rows) + ")");
    uint64_t need;
    if (!mul_ok(row_end - row_begin, row_len, need) || need > dst_count)
        throw Error(CMF_ERR_INVALID_ARGUMENT, tensor_label(t) + ": destination holds " + std::to_string(dst_count) +
                                                   " floats, rows need " + std::to_string(need));
    const cmf_tensor_view v = t.view();
    struct Job {
        const CodecEntry *codec;
        const cmf_tensor_view *v;
        uint64_t row_begin, row_len;
        float *dst;
        std::mutex mu;
        cmf_error *first = nullptr;
    } job{codec, &v, row_begin, row_len, dst, {}, nullptr};
    const uint64_t grain = std::max<uint64_t>(1, (uint64_t(1) << 16) / std::max<uint64_t>(row_len, 1));
    rt_->pool().parallel_for(row_begin, row_end, grain, [](void *u, uint64_t b, uint64_t e) {
        auto *j = static_cast<Job *>(u);
        cmf_error *err = j->codec->vt.dequantize_rows(j->codec->ctx, j->v, b, e, j->dst + (b - j->row_begin) * j->row_len);
        if (err) {
            std::lock_guard<std::mutex> lock(j->mu);
            if (j->first) take_message(err);
            else j->first = err;
        }
    }, &job);
    throw_if_error(job.first, tensor_label(t));
}

}  // namespace cmf::container
