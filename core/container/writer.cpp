#include "container/writer.hpp"

#include "common/hash64.hpp"
#include "container/header.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"
#include "container/writer_parts.hpp"
#include "plugin_host/runtime.hpp"

#include <boost/json.hpp>
#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cmf::container {

namespace bj = boost::json;
using namespace parts;

namespace {

struct FilePlan {
    bj::value header;  // object
    std::vector<const PendingTensor *> tensors;
    const std::vector<PendingMask> *masks = nullptr;  // null or empty: none
    std::string default_task;
    const std::vector<uint8_t> *vocab = nullptr;      // null: absent
};

// One complete W1 file (layout in docs/container.md), written to a temp file and renamed.
void write_w1(const std::string &path, FilePlan &plan) {
    // 1. payload layout
    std::vector<uint64_t> offs;
    uint64_t cursor = 0;
    for (auto *t : plan.tensors) {
        cursor = place_payload(cursor, t->nbytes);
        offs.push_back(cursor);
        cursor += t->nbytes;
    }
    const uint64_t data_len = cursor;
    // 2. directory; 3. masks, index, section_hashes, header text
    std::vector<uint8_t> dir = build_directory(plan.tensors, offs);
    Tail tail = build_tail(plan.header, plan.tensors, plan.masks, plan.default_task, plan.vocab, true);
    // 4. envelope
    const uint64_t data_off = align_up(kEnvelopeSize + tail.header.size() + dir.size(), kDataAlign);
    const Envelope env = envelope_for(tail, dir, data_off, data_len);
    // 5. bytes
    TempFile tmp(path);
    Out out(tmp.fd(), path);
    uint8_t e[kEnvelopeSize];
    env.encode(e);
    out.put(e, sizeof e);
    out.put(tail.header.data(), tail.header.size());
    out.put(dir.data(), dir.size());
    out.pad_to(data_off);
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
        out.pad_to(data_off + offs[i]);
        out.put(plan.tensors[i]->data, plan.tensors[i]->nbytes);
        crash_point("payload");
    }
    out.put(tail.masks.data(), tail.masks.size());
    if (tail.vocab) out.put(tail.vocab->data(), tail.vocab->size());
    out.put(tail.index.data(), tail.index.size());
    out.flush();
    tmp.commit();
}

}  // namespace

Writer::Writer(Runtime &rt, std::string path, const std::string &header_json, uint64_t shard_max_bytes,
               std::optional<std::string> default_task)
    : TensorWriter(std::move(default_task)), rt_(&rt), path_(std::move(path)), shard_max_bytes_(shard_max_bytes) {
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
    tensors_.push_back(checked_tensor(*rt_, name, dtype, ndim, shape, data, nbytes));
}

void TensorWriter::set_vocab(const void *data, uint64_t len) {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    if (len > 0 && p == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "vocab: NULL data");
    vocab_ = std::vector<uint8_t>(p, p + len);
}

std::string TensorWriter::default_task() const {
    return default_task_ ? *default_task_ : (masks_.empty() ? "general" : masks_.front().name);
}

void TensorWriter::set_shard(bj::value &header, uint64_t no, uint64_t count) {
    bj::object &h = header.as_object();
    h["shard"] = bj::object{{"no", no}, {"count", count}};
    if (no > 1) {  // masks, vocab, index, chat bundle and skills live in shard 1 only
        h.erase("tokenizer_config");
        h.erase("skills");
        h.erase("section_hashes");
    }
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
    const std::string default_task = this->default_task();
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
        set_shard(plan.header, i + 1, count);
        plan.tensors = parts[i];
        if (i == 0) {
            plan.masks = &masks_;
            plan.default_task = default_task;
            plan.vocab = vocab_ ? &*vocab_ : nullptr;
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
    for (auto &t : old.tensors)
        if (!dropped_.count(t.name)) seen.emplace(t.name, 0);
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
        if (dropped_.count(t.name)) continue;
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
        uint64_t off = place_payload(end - data_off, t.nbytes);
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

void copy_masks_and_vocab(const Model &m, TensorWriter &w) {
    copy_masks(m, w);
    if (m.has_vocab()) w.set_vocab(m.vocab(), m.vocab_len());
}

PendingMask pending_mask_of(const MaskRec &r) {
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
    return pm;
}

void copy_masks(const Model &m, TensorWriter &w) {
    for (auto &r : m.masks()) w.add_mask(pending_mask_of(r));
}

void compact(Runtime &rt, const std::string &in, const std::string &out_path) {
    Model m;
    Model::open(m, rt, in, 0);
    bj::value header = parse_json_object(m.header_text(), "header JSON");
    header.as_object().erase("shard");  // the output is one file (spec §10)
    header.as_object().erase("section_hashes");
    std::optional<std::string> task;
    if (!m.masks().empty()) task = m.default_task();
    Writer w(rt, out_path, json::emit_header(header), 0, task);
    for (auto &t : m.tensors()) w.add_tensor(t.name, t.dtype, t.ndim, t.shape, m.verified(t), t.nbytes);
    copy_masks_and_vocab(m, w);
    w.finish();
}

}  // namespace cmf::container
