#include "container/writer.hpp"

#include "common/hash64.hpp"
#include "container/header.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"
#include "plugins/runtime.hpp"

#include <boost/json.hpp>
#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cmf::container {

void (*write_crash_hook)(const char *point) = nullptr;

namespace bj = boost::json;

namespace {

void crash_point(const char *p) {
    if (write_crash_hook) write_crash_hook(p);
}

[[noreturn]] void io_fail(const std::string &what, const std::string &path, int err) {
    throw Error(CMF_ERR_IO, what + " '" + path + "': " + std::strerror(err));
}

// Buffered sequential writes to an fd, tracking the position.
class Out {
public:
    Out(int fd, std::string path, uint64_t pos = 0) : fd_(fd), path_(std::move(path)), pos_(pos) { buf_.reserve(1 << 20); }
    void put(const void *p, uint64_t n) {
        const uint8_t *b = static_cast<const uint8_t *>(p);
        while (n > 0) {
            if (buf_.size() == buf_.capacity()) flush();
            size_t k = size_t(std::min<uint64_t>(n, buf_.capacity() - buf_.size()));
            buf_.insert(buf_.end(), b, b + k);
            b += k;
            n -= k;
            pos_ += k;
        }
    }
    void zeros(uint64_t n) {
        static const uint8_t z[4096] = {};
        while (n > 0) {
            uint64_t k = std::min<uint64_t>(n, sizeof z);
            put(z, k);
            n -= k;
        }
    }
    void pad_to(uint64_t target) {
        if (target < pos_) throw Error(CMF_ERR_INTERNAL, "writer layout went backwards");
        zeros(target - pos_);
    }
    uint64_t pos() const { return pos_; }
    void flush() {
        size_t done = 0;
        while (done < buf_.size()) {
            ssize_t w = ::write(fd_, buf_.data() + done, buf_.size() - done);
            if (w < 0) {
                if (errno == EINTR) continue;
                io_fail("cannot write", path_, errno);
            }
            done += size_t(w);
        }
        buf_.clear();
    }

private:
    int fd_;
    std::string path_;
    uint64_t pos_;
    std::vector<uint8_t> buf_;
};

std::string dir_of(const std::string &path) {
    auto slash = path.rfind('/');
    return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

void fsync_dir(const std::string &path) {
    int d = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        ::fsync(d);  // best effort: some filesystems refuse fsync on directories
        ::close(d);
    }
}

// A temp file next to `path`; unlinked unless commit() renamed it into place.
class TempFile {
public:
    explicit TempFile(const std::string &path) : final_(path) {
        auto slash = path.rfind('/');
        std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
        tmp_ = dir_of(path) + "/." + base + ".tmp.XXXXXX";
        fd_ = ::mkstemp(tmp_.data());
        if (fd_ < 0) io_fail("cannot create a temp file next to", path, errno);
        ::fchmod(fd_, 0644);
    }
    ~TempFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(tmp_.c_str());
    }
    int fd() const { return fd_; }
    void commit() {
        if (::fsync(fd_) != 0) io_fail("cannot fsync", tmp_, errno);
        if (::close(fd_) != 0) {
            fd_ = -1;
            io_fail("cannot close", tmp_, errno);
        }
        fd_ = -1;
        crash_point("before-rename");
        if (::rename(tmp_.c_str(), final_.c_str()) != 0) io_fail("cannot rename the temp file to", final_, errno);
        committed_ = true;
        fsync_dir(final_);
    }

private:
    std::string final_, tmp_;
    int fd_ = -1;
    bool committed_ = false;
};

std::vector<uint8_t> build_directory(const std::vector<const PendingTensor *> &ts, const std::vector<uint64_t> &offs) {
    uint64_t pool = 0;
    for (auto *t : ts) pool += t->name.size();
    const uint64_t pool_off = 16 + kDirRecordSize * ts.size();
    std::vector<uint8_t> d(size_t(pool_off + pool), 0);
    wr64(d.data(), ts.size());
    wr64(d.data() + 8, pool_off);
    uint64_t name_off = 0;
    for (size_t i = 0; i < ts.size(); ++i) {
        const PendingTensor &t = *ts[i];
        uint8_t *r = d.data() + 16 + i * kDirRecordSize;
        wr32(r, uint32_t(name_off));
        wr16(r + 4, uint16_t(t.name.size()));
        r[6] = uint8_t(t.dtype);
        r[7] = uint8_t(t.ndim);
        for (uint32_t k = 0; k < t.ndim; ++k) wr32(r + 8 + 4 * k, uint32_t(t.shape[k]));
        wr64(r + 32, offs[i]);
        wr64(r + 40, t.nbytes);
        wr64(r + 48, t.hash);
        std::memcpy(d.data() + pool_off + name_off, t.name.data(), t.name.size());
        name_off += t.name.size();
    }
    return d;
}

std::string mask_meta(const std::string &default_task, const std::vector<PendingMask> &masks,
                      const std::vector<uint64_t> &blob_offs) {
    std::string m = "{\"default_task\":";
    json::append_string(m, default_task);
    m += ",\"masks\":[";
    for (size_t i = 0; i < masks.size(); ++i) {
        const PendingMask &k = masks[i];
        if (i) m += ',';
        m += "{\"task_id\":" + std::to_string(k.task_id) + ",\"name\":";
        json::append_string(m, k.name);
        m += ",\"description\":";
        if (k.description) json::append_string(m, *k.description);
        else m += "null";
        m += ",\"sparsity\":" + json::format_f32(k.sparsity) + ",\"quality\":";
        m += k.quality ? json::emit_mask_quality(*k.quality) : "null";
        m += ",\"parent\":";
        if (k.parent) json::append_string(m, *k.parent);
        else m += "null";
        m += ",\"priority\":";
        json::append_string(m, k.priority);
        m += std::string(",\"has_hot_pack\":") + (k.has_hot_pack ? "true" : "false");
        m += std::string(",\"has_expert_fields\":") + (k.has_expert_fields ? "true" : "false");
        m += ",\"blob_off\":" + std::to_string(blob_offs[i]) + ",\"blob_len\":" + std::to_string(k.blob.size()) + "}";
    }
    return m + "]}";
}

// Masks section (COMPAT §7.1): the meta carries the blob offsets, so it is
// re-serialized until its length stops changing.
std::vector<uint8_t> build_masks(const std::string &default_task, const std::vector<PendingMask> &masks) {
    std::vector<uint64_t> offs(masks.size());
    std::string meta;
    uint64_t meta_len = 0;
    for (int round = 0; round < 64; ++round) {
        uint64_t pos = align_up(8 + meta_len, 8);
        for (size_t i = 0; i < masks.size(); ++i) {
            offs[i] = pos;
            pos = align_up(pos + masks[i].blob.size(), 8);
        }
        meta = mask_meta(default_task, masks, offs);
        if (meta.size() == meta_len) break;
        meta_len = meta.size();
    }
    if (meta.size() != meta_len) throw Error(CMF_ERR_INTERNAL, "masks meta length did not converge");
    uint64_t end = offs.empty() ? 8 + meta_len : offs.back() + masks.back().blob.size();
    std::vector<uint8_t> s(size_t(end), 0);
    wr32(s.data(), uint32_t(masks.size()));
    wr32(s.data() + 4, uint32_t(meta_len));
    std::memcpy(s.data() + 8, meta.data(), meta.size());
    for (size_t i = 0; i < masks.size(); ++i)
        std::memcpy(s.data() + offs[i], masks[i].blob.data(), masks[i].blob.size());
    return s;
}

// Sparse index (COMPAT §7.4) from the mask blobs.
std::vector<uint8_t> build_index(const ArchInfo &arch, const std::vector<PendingMask> &masks) {
    const MaskLayout l = mask_layout_for(arch);
    const uint64_t N = l.physical_layers;
    std::vector<uint8_t> s(8, 0);
    uint32_t n = 0;
    for (const PendingMask &m : masks) {
        const uint8_t *ffn = m.blob.data();
        // Rows per visit or per physical layer; the gates follow N head rows.
        const uint64_t tail = N * l.head_row_bytes + l.gate_bytes + (m.has_expert_fields ? N * l.expert_row_bytes : 0);
        const uint64_t ffn_rows = (m.blob.size() - tail) / std::max<uint64_t>(l.ffn_row_bytes, 1);
        const uint8_t *heads = ffn + ffn_rows * l.ffn_row_bytes;
        const uint8_t *gates = heads + N * l.head_row_bytes;
        for (uint64_t layer = 0; layer < N; ++layer) {
            if (!((gates[layer / 8] >> (layer % 8)) & 1)) continue;
            std::vector<uint16_t> groups;
            const uint8_t *row = ffn + layer * l.ffn_row_bytes;
            for (uint64_t g = 0; g < (arch.intermediate_size + 31) / 32; ++g) {
                bool any = false;
                for (uint64_t b = 4 * g; b < std::min<uint64_t>(4 * g + 4, l.ffn_row_bytes); ++b) any = any || row[b] != 0;
                if (any) groups.push_back(uint16_t(g));
            }
            std::vector<uint8_t> hs;
            const uint8_t *hrow = heads + layer * l.head_row_bytes;
            for (uint64_t h = 0; h < arch.num_attention_heads; ++h)
                if ((hrow[h / 8] >> (h % 8)) & 1) hs.push_back(uint8_t(h));
            uint8_t e[16];
            wr32(e, m.task_id);
            wr32(e + 4, uint32_t(layer));
            wr32(e + 8, uint32_t(groups.size()));
            wr32(e + 12, uint32_t(hs.size()));
            s.insert(s.end(), e, e + 16);
            for (uint16_t g : groups) {
                uint8_t b[2];
                wr16(b, g);
                s.insert(s.end(), b, b + 2);
            }
            s.insert(s.end(), hs.begin(), hs.end());
            s.resize(size_t(align_up(s.size(), 4)), 0);
            ++n;
        }
    }
    wr32(s.data(), n);
    return s;
}

// Validates a mask blob against the arch the same way the reader will.
void check_mask(const ArchInfo &arch, const PendingMask &m) {
    const MaskLayout l = mask_layout_for(arch);
    if (m.has_expert_fields && !arch.has_moe) throw Error(CMF_ERR_INVALID_ARGUMENT, "mask '" + m.name + "': has_expert_fields without arch.moe");
    uint64_t a = 0, b = 0;
    if (!mask_blob_sizes(l, m.has_expert_fields, a, b)) throw Error(CMF_ERR_INVALID_ARGUMENT, "mask '" + m.name + "': the arch's mask dimensions overflow");
    if (m.blob.size() != a && m.blob.size() != b)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "mask '" + m.name + "': blob is " + std::to_string(m.blob.size()) +
                                                  " bytes; the arch needs " + std::to_string(a) + " (or legacy " + std::to_string(b) + ")");
    std::string tail = mask_tail_problem(arch, l, m.blob.data(), m.blob.size() == a ? l.visits : l.physical_layers, m.has_expert_fields);
    if (!tail.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "mask '" + m.name + "': " + tail);
}

uint32_t quant_bit(int32_t dtype) { return (dtype == CMF_DTYPE_Q8_2F || dtype == CMF_DTYPE_VBIT) ? CMF_FEATURE_QUANT_2F : 0u; }

struct FilePlan {
    bj::value header;  // object
    std::vector<const PendingTensor *> tensors;
    const std::vector<PendingMask> *masks = nullptr;  // null or empty: none
    std::string default_task;
    const std::vector<uint8_t> *vocab = nullptr;      // null: absent
};

// One complete W1 file (COMPAT §3.2), written to a temp file and renamed.
void write_w1(const std::string &path, FilePlan &plan) {
    // 1. payload layout
    std::vector<uint64_t> offs;
    uint64_t cursor = 0;
    for (auto *t : plan.tensors) {
        cursor = align_up(cursor, t->nbytes >= kLargeTensor ? kPageTensorAlign : kTensorAlign);
        offs.push_back(cursor);
        cursor += t->nbytes;
    }
    const uint64_t data_len = cursor;
    // 2. directory, masks, index
    std::vector<uint8_t> dir = build_directory(plan.tensors, offs);
    bj::object &hobj = plan.header.as_object();
    const std::string draft = json::emit_header(plan.header);  // before section_hashes: arch and skills only
    const Header parsed = parse_header(reinterpret_cast<const uint8_t *>(draft.data()), draft.size());
    const bool has_masks = plan.masks && !plan.masks->empty();
    std::vector<uint8_t> masks, index;
    if (has_masks) {
        for (const auto &m : *plan.masks) check_mask(parsed.arch, m);
        masks = build_masks(plan.default_task, *plan.masks);
        index = build_index(parsed.arch, *plan.masks);
    }
    // 3. section_hashes (COMPAT §2.3), then the header text
    if (has_masks || plan.vocab) {
        bj::object sh;
        if (has_masks) sh["masks"] = hex16(hash64(masks.data(), masks.size()));
        if (plan.vocab) sh["vocab"] = hex16(hash64(plan.vocab->data(), plan.vocab->size()));
        if (has_masks) sh["index"] = hex16(hash64(index.data(), index.size()));
        hobj["section_hashes"] = std::move(sh);
    }
    const std::string header = json::emit_header(plan.header);
    // 4. envelope
    Envelope env;
    env.required_features = CMF_FEATURE_TENSOR_DIR;
    for (auto *t : plan.tensors) env.required_features |= quant_bit(t->dtype);
    if (has_masks) env.required_features |= CMF_FEATURE_BINARY_MASKS;
    if (has_masks && parsed.arch.num_loops > 1) env.required_features |= CMF_FEATURE_LOOP_MASKS;
    if (parsed.skill_file) env.required_features |= CMF_FEATURE_SKILL_FILE;
    env.off[kHeader] = kEnvelopeSize;
    env.len[kHeader] = header.size();
    env.off[kDir] = kEnvelopeSize + header.size();
    env.len[kDir] = dir.size();
    const uint64_t data_off = align_up(env.off[kDir] + dir.size(), kDataAlign);
    env.len[kData] = data_len;
    env.len[kMasks] = masks.size();
    env.len[kVocab] = plan.vocab ? plan.vocab->size() : 0;
    env.len[kIndex] = index.size();
    uint64_t pos = data_off;
    for (int s = kData; s <= kIndex; ++s) {
        env.off[s] = env.len[s] ? pos : 0;
        pos += env.len[s];
    }
    env.header_hash = hash64(header.data(), header.size());
    env.dir_hash = hash64(dir.data(), dir.size());
    // 5. bytes
    TempFile tmp(path);
    Out out(tmp.fd(), path);
    uint8_t e[kEnvelopeSize];
    env.encode(e);
    out.put(e, sizeof e);
    out.put(header.data(), header.size());
    out.put(dir.data(), dir.size());
    out.pad_to(data_off);
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
        out.pad_to(data_off + offs[i]);
        out.put(plan.tensors[i]->data, plan.tensors[i]->nbytes);
        crash_point("payload");
    }
    out.put(masks.data(), masks.size());
    if (plan.vocab) out.put(plan.vocab->data(), plan.vocab->size());
    out.put(index.data(), index.size());
    out.flush();
    tmp.commit();
}

bj::value parse_json_object(const std::string &text, const char *what) {
    boost::system::error_code ec;
    bj::value v = bj::parse(text, ec);
    if (ec) throw Error(CMF_ERR_PARSE, std::string(what) + " is not valid JSON: " + ec.message());
    if (!v.is_object()) throw Error(CMF_ERR_PARSE, std::string(what) + " must be a JSON object");
    return v;
}

}  // namespace

Writer::Writer(Runtime &rt, std::string path, const std::string &header_json, uint64_t shard_max_bytes,
               std::optional<std::string> default_task)
    : rt_(&rt), path_(std::move(path)), shard_max_bytes_(shard_max_bytes), default_task_(std::move(default_task)) {
    header_ = parse_json_object(header_json, "header JSON");
    // The reader's rules apply to what we are about to write.
    std::string text = json::emit_header(header_);
    parse_header(reinterpret_cast<const uint8_t *>(text.data()), text.size());
    if (shard_max_bytes_ > 0 && (path_.size() < 5 || path_.compare(path_.size() - 4, 4, ".cmf") != 0))
        throw Error(CMF_ERR_INVALID_ARGUMENT, "a sharded output path must end in .cmf: '" + path_ + "'");
}

void Writer::add_tensor(const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape, const void *data,
                        uint64_t nbytes) {
    if (finished_) throw Error(CMF_ERR_INVALID_ARGUMENT, "writer already finished");
    if (ndim > CMF_MAX_DIMS) throw Error(CMF_ERR_PARSE, "tensor '" + name + "': ndim " + std::to_string(ndim) + " > 6");
    if (name.empty() || name.size() > 65535) throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor name must be 1..65535 bytes");
    if (!simdjson::validate_utf8(name.data(), name.size())) throw Error(CMF_ERR_PARSE, "tensor name is not valid UTF-8");
    if (dtype < 0 || dtype > kMaxDtypeId) throw Error(CMF_ERR_UNKNOWN_DTYPE, "tensor '" + name + "': unknown dtype id " + std::to_string(dtype));
    if (nbytes > 0 && data == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor '" + name + "': NULL data");
    PendingTensor t;
    t.name = name;
    t.dtype = dtype;
    t.ndim = ndim;
    for (uint32_t k = 0; k < ndim; ++k) {
        if (shape[k] > UINT32_MAX) throw Error(CMF_ERR_BOUNDS, "tensor '" + name + "': dimension " + std::to_string(shape[k]) + " does not fit u32");
        t.shape[k] = shape[k];
    }
    t.data = static_cast<const uint8_t *>(data);
    t.nbytes = nbytes;
    // Size and structure exactly as the reader will check them.
    TensorRec probe;
    probe.name = name;
    probe.dtype = dtype;
    probe.ndim = ndim;
    std::copy(t.shape, t.shape + CMF_MAX_DIMS, probe.shape);
    probe.data = t.data;
    probe.nbytes = nbytes;
    probe.off = 0;
    check_tensor_payload(*rt_, probe);
    t.hash = hash64(data, size_t(nbytes));
    tensors_.push_back(std::move(t));
}

void Writer::set_vocab(const void *data, uint64_t len) {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    if (len > 0 && p == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "vocab: NULL data");
    vocab_ = std::vector<uint8_t>(p, p + len);
}

void Writer::finish() {
    if (finished_) throw Error(CMF_ERR_INVALID_ARGUMENT, "writer already finished");
    finished_ = true;
    if (append_) return finish_append();
    {
        std::unordered_map<std::string_view, int> seen;
        for (auto &t : tensors_)
            if (!seen.emplace(t.name, 0).second) throw Error(CMF_ERR_PARSE, "duplicate tensor name '" + t.name + "'");
    }
    const std::string default_task = default_task_ ? *default_task_ : (masks_.empty() ? "general" : masks_.front().name);
    if (shard_max_bytes_ == 0) {
        FilePlan plan;
        plan.header = header_;
        for (auto &t : tensors_) plan.tensors.push_back(&t);
        plan.masks = &masks_;
        plan.default_task = default_task;
        plan.vocab = vocab_ ? &*vocab_ : nullptr;
        write_w1(path_, plan);
        return;
    }
    // Greedy split in the given order (spec §10); a shard holds at least one tensor.
    std::vector<std::vector<const PendingTensor *>> parts(1);
    uint64_t size = 0;
    for (auto &t : tensors_) {
        if (!parts.back().empty() && size + t.nbytes > shard_max_bytes_) {
            parts.emplace_back();
            size = 0;
        }
        parts.back().push_back(&t);
        size += t.nbytes;
    }
    const std::string stem = path_.substr(0, path_.size() - 4);
    const uint64_t count = parts.size();
    for (uint64_t i = 0; i < count; ++i) {
        FilePlan plan;
        plan.header = header_;
        bj::object &h = plan.header.as_object();
        h["shard"] = bj::object{{"no", i + 1}, {"count", count}};
        plan.tensors = parts[i];
        if (i == 0) {
            plan.masks = &masks_;
            plan.default_task = default_task;
            plan.vocab = vocab_ ? &*vocab_ : nullptr;
        } else {  // masks, vocab, index, chat bundle and skills live in shard 1 only
            h.erase("tokenizer_config");
            h.erase("skills");
            h.erase("section_hashes");
        }
        write_w1(shard_name(stem, i + 1, count), plan);
    }
}

Writer Writer::for_append(Runtime &rt, std::string path, const std::string *header_json) {
    Writer w(rt, std::move(path));
    w.append_ = true;
    if (header_json) {
        w.header_ = parse_json_object(*header_json, "header JSON");
        std::string text = json::emit_header(w.header_);
        parse_header(reinterpret_cast<const uint8_t *>(text.data()), text.size());
    } else {
        w.keep_header_bytes_ = true;
    }
    return w;
}

void Writer::finish_append() {
    // The current file, fully validated; its mapping is read-only and we only
    // ever write past its end (and the envelope last).
    Shard old = open_shard(*rt_, path_, true, nullptr, nullptr, nullptr, nullptr);
    std::unordered_map<std::string_view, int> seen;
    for (auto &t : old.tensors) seen.emplace(t.name, 0);
    for (auto &t : tensors_)
        if (!seen.emplace(t.name, 0).second) throw Error(CMF_ERR_PARSE, "duplicate tensor name '" + t.name + "'");

    int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) io_fail("cannot open for append", path_, errno);
    struct Closer { int fd; ~Closer() { ::close(fd); } } closer{fd};
    const uint64_t old_size = old.file->size();
    if (::lseek(fd, off_t(old_size), SEEK_SET) < 0) io_fail("cannot seek in", path_, errno);
    Out out(fd, path_, old_size);

    Envelope env = old.env;
    const uint64_t data_off = env.len[kData] > 0 ? env.off[kData] : align_up(old_size, kDataAlign);
    std::vector<PendingTensor> all;
    std::vector<uint64_t> offs;
    for (auto &t : old.tensors) {
        PendingTensor p;
        p.name = t.name;
        p.dtype = t.dtype;
        p.ndim = t.ndim;
        std::copy(t.shape, t.shape + CMF_MAX_DIMS, p.shape);
        p.nbytes = t.nbytes;
        p.hash = t.hash;
        all.push_back(std::move(p));
        offs.push_back(t.off);
    }
    uint64_t end = std::max(old_size, data_off);
    for (auto &t : tensors_) {
        uint64_t off = align_up(end - data_off, t.nbytes >= kLargeTensor ? kPageTensorAlign : kTensorAlign);
        out.pad_to(data_off + off);
        out.put(t.data, t.nbytes);
        crash_point("payload");
        end = data_off + off + t.nbytes;
        all.push_back(t);
        offs.push_back(off);
        env.required_features |= quant_bit(t.dtype);
    }
    std::vector<const PendingTensor *> ptrs;
    for (auto &t : all) ptrs.push_back(&t);
    std::vector<uint8_t> dir = build_directory(ptrs, offs);
    std::string header;
    if (keep_header_bytes_) {
        header.assign(reinterpret_cast<const char *>(old.section(kHeader)), size_t(old.env.len[kHeader]));
    } else {
        bj::object &h = header_.as_object();
        h.erase("section_hashes");
        bj::object sh;  // sections stay where they are: hash them as they are
        if (env.len[kMasks]) sh["masks"] = hex16(hash64(old.section(kMasks), env.len[kMasks]));
        if (env.len[kVocab]) sh["vocab"] = hex16(hash64(old.section(kVocab), env.len[kVocab]));
        if (env.len[kIndex]) sh["index"] = hex16(hash64(old.section(kIndex), env.len[kIndex]));
        if (!sh.empty()) h["section_hashes"] = std::move(sh);
        header = json::emit_header(header_);
        Header parsed = parse_header(reinterpret_cast<const uint8_t *>(header.data()), header.size());
        if (parsed.skill_file) env.required_features |= CMF_FEATURE_SKILL_FILE;
    }
    env.off[kData] = data_off;
    env.len[kData] = end - data_off;
    env.off[kDir] = out.pos();
    env.len[kDir] = dir.size();
    out.put(dir.data(), dir.size());
    env.off[kHeader] = out.pos();
    env.len[kHeader] = header.size();
    out.put(header.data(), header.size());
    env.header_hash = hash64(header.data(), header.size());
    env.dir_hash = hash64(dir.data(), dir.size());
    out.flush();
    if (::fsync(fd) != 0) io_fail("cannot fsync", path_, errno);
    crash_point("before-envelope");
    // The commit point: one 128-byte write inside the first page.
    uint8_t e[kEnvelopeSize];
    env.encode(e);
    if (::pwrite(fd, e, sizeof e, 0) != ssize_t(sizeof e)) io_fail("cannot rewrite the envelope of", path_, errno);
    if (::fsync(fd) != 0) io_fail("cannot fsync", path_, errno);
}

void compact(Runtime &rt, const std::string &in, const std::string &out_path) {
    Model m;
    Model::open(m, rt, in, 0);
    bj::value header = parse_json_object(m.header_text(), "header JSON");
    header.as_object().erase("shard");  // the output is one file (COMPAT §10 note)
    header.as_object().erase("section_hashes");
    std::optional<std::string> task;
    if (!m.masks().empty()) task = m.default_task();
    Writer w(rt, out_path, json::emit_header(header), 0, task);
    for (auto &t : m.tensors()) w.add_tensor(t.name, t.dtype, t.ndim, t.shape, t.data, t.nbytes);
    for (auto &r : m.masks()) {
        PendingMask pm;
        pm.task_id = r.task_id;
        pm.name = r.name;
        if (r.has_description) pm.description = r.description;
        if (r.has_parent) pm.parent = r.parent;
        if (!r.quality_json.empty()) pm.quality = bj::parse(r.quality_json);
        pm.sparsity = r.sparsity;
        pm.priority = r.priority;
        pm.has_hot_pack = r.has_hot_pack;
        pm.has_expert_fields = r.has_expert_fields;
        pm.blob.assign(r.blob, r.blob + r.blob_len);
        w.add_mask(std::move(pm));
    }
    if (m.has_vocab()) w.set_vocab(m.vocab(), m.vocab_len());
    w.finish();
}

}  // namespace cmf::container
