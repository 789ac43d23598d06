// Pieces shared by the two writers of this folder: W1 (writer.cpp, the
// whole file laid out at finish) and W2 (stream_writer.cpp,
// payloads written as they come); docs/container.md describes both. Internal to core/container.
#pragma once

#include "container/format.hpp"
#include "container/header.hpp"
#include "container/writer.hpp"

#include <boost/json/value.hpp>

#include <sys/types.h>

#include <string>
#include <vector>

namespace cmf { class Runtime; }

namespace cmf::container::parts {

void crash_point(const char *point);
// fsync the directory holding `path` (best effort), after a rename or unlink in it.
void fsync_dir(const std::string &path);
[[noreturn]] void io_fail(const std::string &what, const std::string &path, int err);

// Buffered sequential writes to an fd, tracking the file position.
class Out {
public:
    Out(int fd, std::string path, uint64_t pos = 0);
    void put(const void *p, uint64_t n);
    void zeros(uint64_t n);
    void pad_to(uint64_t target);  // zeros up to an absolute position (never backwards)
    uint64_t pos() const { return pos_; }
    void flush();

private:
    static constexpr uint64_t kChunk = uint64_t(2) << 20;  // see put()
    int fd_;
    std::string path_;
    uint64_t pos_;
    std::vector<uint8_t> buf_;
};

// The file a writer fills before it appears at `path`: an unnamed file
// (O_TMPFILE) in path's directory, so a writer killed mid-file leaves
// nothing behind at all; on filesystems without O_TMPFILE (or without
// /proc to link it from), a hidden `.NAME.tmp.XXXXXX` next to it, unlinked
// unless committed. Committing gives it a name and renames that over
// `path` in one step, so `path` is always the old file or the new one.
class TempFile {
public:
    explicit TempFile(const std::string &path, mode_t mode = 0644);
    ~TempFile();
    TempFile(const TempFile &) = delete;
    TempFile &operator=(const TempFile &) = delete;
    int fd() const { return fd_; }
    const std::string &final_path() const { return final_; }
    void set_final_path(std::string p) { final_ = std::move(p); }  // before rename_now
    // fsync + rename into place. Or in two steps: sync, then rename_now.
    void commit();
    void sync();
    void rename_now();
    // sync + put the file at its path only if nothing is there (a key file
    // must never replace another): CMF_ERR_IO "... already exists" if it is.
    void commit_new();

private:
    void link_named();  // an unnamed file gets its hidden temp name
    std::string final_, tmp_;
    int fd_ = -1;
    bool anonymous_ = false;
    bool committed_ = false;
};

boost::json::value parse_json_object(const std::string &text, const char *what);

// A tensor checked exactly as the reader will check it (name, ndim, shape,
// dtype id, payload size and structure through the codec), hashed.
PendingTensor checked_tensor(Runtime &rt, const std::string &name, int32_t dtype, uint32_t ndim, const uint64_t *shape,
                             const void *data, uint64_t nbytes);
// For a payload that arrives in pieces (StreamWriter::begin_tensor): the
// same checks without the payload, so the dtype must have a fixed size,
// which nbytes must equal; structure beyond the size is the producer's
// promise (the converter's codecs encode it). hash and data are left 0.
PendingTensor checked_tensor_header(Runtime &rt, const std::string &name, int32_t dtype, uint32_t ndim,
                                    const uint64_t *shape, uint64_t nbytes);

uint32_t quant_bit(int32_t dtype);  // QUANT_2F for the dtypes that need it
void check_mask(const ArchInfo &arch, const PendingMask &m);
std::vector<uint8_t> build_masks(const std::string &default_task, const std::vector<PendingMask> &masks);
std::vector<uint8_t> build_index(const ArchInfo &arch, const std::vector<PendingMask> &masks);
std::vector<uint8_t> build_directory(const std::vector<const PendingTensor *> &ts, const std::vector<uint64_t> &offs);

// Everything a file carries after its payloads, and the header describing
// it: masks + sparse index (from one catalog), vocab, section_hashes set as
// the original sets them (spec §8.1), the header text, and the feature bits W1 and W2 set.
struct Tail {
    std::vector<uint8_t> masks, index;
    const std::vector<uint8_t> *vocab = nullptr;  // null: absent
    std::string header;
    uint64_t required_features = 0;
};
Tail build_tail(boost::json::value &header, const std::vector<const PendingTensor *> &tensors,
                const std::vector<PendingMask> *masks, const std::string &default_task,
                const std::vector<uint8_t> *vocab, bool allow_skill_file);

// The envelope of a file laid out as both writers lay it out: header at
// 128, directory right after it, data at data_off (4096-aligned), then
// masks, vocab and index packed (offset 0 for an absent section), hashes.
Envelope envelope_for(const Tail &tail, const std::vector<uint8_t> &dir, uint64_t data_off, uint64_t data_len);

// Data-relative offset of the next payload of `nbytes` after `cursor`
// (64-byte rule of spec §4; the original's writers page-align payloads
// >= 16 KiB to 4096).
inline uint64_t place_payload(uint64_t cursor, uint64_t nbytes) {
    return align_up(cursor, nbytes >= kLargeTensor ? kPageTensorAlign : kTensorAlign);
}

}  // namespace cmf::container::parts
