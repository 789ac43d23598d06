// W2, the original's streaming writer (docs/container.md): what `cortiq convert` uses, so
// that converting a model never holds more than one tensor in memory.
#include "common/hash64.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"
#include "container/writer.hpp"
#include "container/writer_parts.hpp"

#include <boost/json.hpp>

#include <cerrno>
#include <cstring>
#include <unistd.h>

namespace cmf::container {

namespace bj = boost::json;
using namespace parts;

struct StreamWriter::Part {
    std::unique_ptr<TempFile> tmp;
    std::unique_ptr<Out> out;
    std::vector<PendingTensor> tensors;  // data pointers cleared once written
    std::vector<uint64_t> offs;          // data-relative
    uint64_t cursor = 0;                 // data-relative end of the last payload
    uint64_t payload_bytes = 0;          // sum of nbytes: what the shard limit counts
};

uint64_t StreamWriter::gap_bytes(uint64_t source_tensor_count) {
    const uint64_t n = 2 * std::max<uint64_t>(source_tensor_count, 4096);
    const uint64_t gap = std::max<uint64_t>(align_up(3 * (128 + 16 + n * (56 + 6 + 96) + (1u << 20)), 4096), 1u << 20);
    return align_up(std::max<uint64_t>(gap, 129), kDataAlign);
}

StreamWriter::StreamWriter(Runtime &rt, std::string path, const std::string &header_json, uint64_t source_tensor_count,
                           uint64_t shard_max_bytes, std::optional<std::string> default_task)
    : TensorWriter(std::move(default_task)),
      rt_(&rt),
      path_(std::move(path)),
      data_off_(gap_bytes(source_tensor_count)),
      shard_max_bytes_(shard_max_bytes) {
    header_ = parse_json_object(header_json, "header JSON");
    std::string text = json::emit_header(header_);  // the reader's rules apply to what we will write
    parse_header(reinterpret_cast<const uint8_t *>(text.data()), text.size());
    if (shard_max_bytes_ > 0 && (path_.size() < 5 || path_.compare(path_.size() - 4, 4, ".cmf") != 0))
        throw Error(CMF_ERR_INVALID_ARGUMENT, "a sharded output path must end in .cmf: '" + path_ + "'");
    open_part();
}

StreamWriter::~StreamWriter() = default;  // unfinished temp files are unlinked by ~TempFile

StreamWriter::Part &StreamWriter::open_part() {
    auto p = std::make_unique<Part>();
    // The final name is not known yet when sharding (it carries the count).
    p->tmp = std::make_unique<TempFile>(path_);
    p->out = std::make_unique<Out>(p->tmp->fd(), path_);
    p->out->zeros(data_off_);  // the gap, filled at finish
    parts_.push_back(std::move(p));
    return *parts_.back();
}

void StreamWriter::add_tensor(const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape,
                              const void *data, uint64_t nbytes) {
    if (finished_) throw Error(CMF_ERR_INVALID_ARGUMENT, "writer already finished");
    if (open_) throw Error(CMF_ERR_INVALID_ARGUMENT, "add_tensor while tensor '" + open_->name + "' is still being written");
    PendingTensor t = checked_tensor(*rt_, name, dtype, ndim, shape, data, nbytes);
    Part &p = place(std::move(t));
    p.out->put(data, nbytes);
    close_open();
}

void StreamWriter::begin_tensor(const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape,
                                uint64_t nbytes) {
    if (finished_) throw Error(CMF_ERR_INVALID_ARGUMENT, "writer already finished");
    if (open_) throw Error(CMF_ERR_INVALID_ARGUMENT, "begin_tensor while tensor '" + open_->name + "' is still being written");
    place(checked_tensor_header(*rt_, name, dtype, ndim, shape, nbytes));
    open_hash_ = Hash64Stream{};
}

void StreamWriter::append(const void *data, uint64_t n) {
    if (!open_) throw Error(CMF_ERR_INVALID_ARGUMENT, "append without begin_tensor");
    if (n > open_->nbytes - open_hash_.length())
        throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor '" + open_->name + "': pieces exceed the announced " +
                                                  std::to_string(open_->nbytes) + " bytes");
    parts_.back()->out->put(data, n);
    open_hash_.update(data, size_t(n));
}

void StreamWriter::end_tensor() {
    if (!open_) throw Error(CMF_ERR_INVALID_ARGUMENT, "end_tensor without begin_tensor");
    if (open_hash_.length() != open_->nbytes)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor '" + open_->name + "': " + std::to_string(open_hash_.length()) +
                                                  " bytes written of the announced " + std::to_string(open_->nbytes));
    open_->hash = open_hash_.value();
    close_open();
}

// Names the tensor, picks its shard and pads to its offset; its bytes follow.
StreamWriter::Part &StreamWriter::place(PendingTensor t) {
    if (!names_.insert(t.name).second) throw Error(CMF_ERR_PARSE, "duplicate tensor name '" + t.name + "'");
    Part *p = parts_.back().get();
    // Greedy split in push order (spec §10); a shard holds at least one tensor.
    if (shard_max_bytes_ > 0 && !p->tensors.empty() && p->payload_bytes + t.nbytes > shard_max_bytes_) p = &open_part();
    open_off_ = place_payload(p->cursor, t.nbytes);
    p->out->pad_to(data_off_ + open_off_);
    t.data = nullptr;
    open_ = std::move(t);
    return *p;
}

void StreamWriter::close_open() {
    crash_point("payload");
    Part &p = *parts_.back();
    p.cursor = open_off_ + open_->nbytes;
    p.payload_bytes += open_->nbytes;
    p.tensors.push_back(std::move(*open_));
    p.offs.push_back(open_off_);
    open_.reset();
}

void StreamWriter::finish() {
    if (finished_) throw Error(CMF_ERR_INVALID_ARGUMENT, "writer already finished");
    if (open_) throw Error(CMF_ERR_INVALID_ARGUMENT, "finish while tensor '" + open_->name + "' is still being written");
    finished_ = true;
    const std::string default_task = this->default_task();
    const uint64_t count = parts_.size();
    const std::string stem = count > 1 || shard_max_bytes_ > 0 ? path_.substr(0, path_.size() - 4) : std::string();
    for (uint64_t i = 0; i < count; ++i) {
        Part &p = *parts_[i];
        bj::value header = header_;
        const bool first = i == 0;
        if (shard_max_bytes_ > 0) set_shard(header, i + 1, count);
        std::vector<const PendingTensor *> ptrs;
        for (auto &t : p.tensors) ptrs.push_back(&t);
        // The original's W2 never sets SKILL_FILE.
        Tail tail = build_tail(header, ptrs, first ? &masks_ : nullptr, default_task,
                               first && vocab_ ? &*vocab_ : nullptr, false);
        // After the last payload: masks, vocab, index, packed.
        p.out->pad_to(data_off_ + p.cursor);
        p.out->put(tail.masks.data(), tail.masks.size());
        if (tail.vocab) p.out->put(tail.vocab->data(), tail.vocab->size());
        p.out->put(tail.index.data(), tail.index.size());
        p.out->flush();
        // Into the gap: envelope, header, directory.
        std::vector<uint8_t> dir = build_directory(ptrs, p.offs);
        const uint64_t front = kEnvelopeSize + tail.header.size() + dir.size();
        if (front > data_off_)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "header and directory (" + std::to_string(front) +
                                                      " bytes) do not fit the reserved gap of " + std::to_string(data_off_) +
                                                      " bytes; pass the real source tensor count");
        const Envelope env = envelope_for(tail, dir, data_off_, p.cursor);
        uint8_t e[kEnvelopeSize];
        env.encode(e);
        std::vector<uint8_t> bytes(e, e + kEnvelopeSize);
        bytes.insert(bytes.end(), tail.header.begin(), tail.header.end());
        bytes.insert(bytes.end(), dir.begin(), dir.end());
        size_t done = 0;
        while (done < bytes.size()) {
            ssize_t w = ::pwrite(p.tmp->fd(), bytes.data() + done, bytes.size() - done, off_t(done));
            if (w < 0) {
                if (errno == EINTR) continue;
                io_fail("cannot write", path_, errno);
            }
            done += size_t(w);
        }
        p.tmp->sync();
    }
    // Every shard is complete on disk; only now do names appear.
    for (uint64_t i = 0; i < count; ++i) {
        if (shard_max_bytes_ > 0) parts_[i]->tmp->set_final_path(shard_name(stem, i + 1, count));
        parts_[i]->tmp->rename_now();
    }
}

}  // namespace cmf::container
