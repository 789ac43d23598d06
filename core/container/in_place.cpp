#include "container/in_place.hpp"

#include "common/hash64.hpp"
#include "container/format.hpp"
#include "container/writer_parts.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cmf::container {

namespace {

constexpr char kJournalMagic[8] = {'C', 'M', 'F', 'J', 'R', 'N', 'L', '1'};

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

void pread_all(int fd, uint8_t *dst, uint64_t n, uint64_t off, const std::string &path) {
    while (n > 0) {
        ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(off));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) parts::io_fail("cannot read", path, errno);
        if (r == 0) throw Error(CMF_ERR_BOUNDS, path + ": unexpected end of file at byte " + std::to_string(off));
        dst += r;
        off += static_cast<uint64_t>(r);
        n -= static_cast<uint64_t>(r);
    }
}

void pwrite_all(int fd, const uint8_t *src, uint64_t n, uint64_t off, const std::string &path) {
    while (n > 0) {
        ssize_t r = ::pwrite(fd, src, n, static_cast<off_t>(off));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) parts::io_fail("cannot write", path, errno);
        src += r;
        off += static_cast<uint64_t>(r);
        n -= static_cast<uint64_t>(r);
    }
}

void fsync_or_fail(int fd, const std::string &path) {
    if (::fsync(fd) != 0) parts::io_fail("cannot sync", path, errno);
}

struct Write {
    uint64_t off;
    std::vector<uint8_t> bytes;
};

struct Journal {
    uint64_t file_size = 0, hash_before = 0, hash_after = 0;
    std::vector<Write> writes;
};

void put64(std::vector<uint8_t> &b, uint64_t v) {
    b.resize(b.size() + 8);
    wr64(b.data() + b.size() - 8, v);
}

std::vector<uint8_t> encode(const Journal &j) {
    std::vector<uint8_t> b(8);
    std::memcpy(b.data(), kJournalMagic, 8);
    put64(b, j.file_size);
    put64(b, j.hash_before);
    put64(b, j.hash_after);
    put64(b, j.writes.size());
    for (const auto &w : j.writes) {
        put64(b, w.off);
        put64(b, w.bytes.size());
        b.insert(b.end(), w.bytes.begin(), w.bytes.end());
    }
    put64(b, hash64(b.data(), b.size()));
    return b;
}

// Throws Parse for anything but a complete journal written by encode().
Journal decode(const std::vector<uint8_t> &b, const std::string &path) {
    auto bad = [&](const std::string &what) -> Journal { throw Error(CMF_ERR_PARSE, path + ": not a complete in-place journal: " + what); };
    if (b.size() < 48 || std::memcmp(b.data(), kJournalMagic, 8) != 0) return bad("bad magic or too short");
    if (hash64(b.data(), b.size() - 8) != rd64(b.data() + b.size() - 8)) return bad("checksum mismatch");
    Journal j;
    j.file_size = rd64(b.data() + 8);
    j.hash_before = rd64(b.data() + 16);
    j.hash_after = rd64(b.data() + 24);
    uint64_t n = rd64(b.data() + 32), at = 40;
    const uint64_t end = b.size() - 8;
    for (uint64_t i = 0; i < n; ++i) {
        if (end - at < 16) return bad("truncated write header");
        Write w;
        w.off = rd64(b.data() + at);
        const uint64_t len = rd64(b.data() + at + 8);
        at += 16;
        if (len > end - at) return bad("truncated write");
        uint64_t stop;
        if (!add_ok(w.off, len, stop) || stop > j.file_size) return bad("a write past the end of the file");
        w.bytes.assign(b.data() + at, b.data() + at + len);
        at += len;
        j.writes.push_back(std::move(w));
    }
    if (at != end) return bad("trailing bytes");
    return j;
}

std::vector<uint8_t> read_whole(const std::string &path) {
    Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0) parts::io_fail("cannot open", path, errno);
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) parts::io_fail("cannot stat", path, errno);
    std::vector<uint8_t> b(static_cast<size_t>(st.st_size));
    pread_all(f.fd, b.data(), b.size(), 0, path);
    return b;
}

// Writes the journal's writes into the file and syncs it.
void apply(const Journal &j, int fd, const std::string &file) {
    for (size_t i = 0; i < j.writes.size(); ++i) {
        pwrite_all(fd, j.writes[i].bytes.data(), j.writes[i].bytes.size(), j.writes[i].off, file);
        if (i == 0) parts::crash_point("in-place-first-write");
    }
    fsync_or_fail(fd, file);
    parts::crash_point("in-place-applied");
}

uint64_t dir_hash_of(int fd, const std::string &file) {
    uint8_t h[8];
    pread_all(fd, h, 8, 0x78, file);
    return rd64(h);
}

}  // namespace

std::string journal_path(const std::string &file) { return file + ".journal"; }

bool recover_in_place(const std::string &file) {
    const std::string jp = journal_path(file), tmp = jp + ".tmp";
    struct stat st {};
    if (::stat(tmp.c_str(), &st) == 0) {
        // Never renamed into place: the rewrite had not begun touching the file.
        if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) parts::io_fail("cannot remove the unfinished journal", tmp, errno);
    }
    if (::stat(jp.c_str(), &st) != 0) return false;
    const Journal j = decode(read_whole(jp), jp);
    Fd f{::open(file.c_str(), O_RDWR | O_CLOEXEC)};
    if (f.fd < 0)
        throw Error(CMF_ERR_IO, file + ": an interrupted in-place rewrite (" + jp + ") must be completed, but the file cannot be opened for writing: " +
                                    std::strerror(errno));
    struct stat fs {};
    if (::fstat(f.fd, &fs) != 0) parts::io_fail("cannot stat", file, errno);
    const uint64_t now = dir_hash_of(f.fd, file);
    if (static_cast<uint64_t>(fs.st_size) != j.file_size || (now != j.hash_before && now != j.hash_after))
        throw Error(CMF_ERR_PARSE, jp + ": this in-place journal does not belong to " + file +
                                       " as it is now (size or directory hash differ); remove it if the file was replaced");
    apply(j, f.fd, file);
    if (::unlink(jp.c_str()) != 0 && errno != ENOENT) parts::io_fail("cannot remove", jp, errno);
    parts::fsync_dir(file);
    return true;
}

void rewrite_in_place(const std::string &file, const std::vector<SlotPatch> &patches) {
    recover_in_place(file);  // a previous interrupted rewrite completes first
    Fd f{::open(file.c_str(), O_RDWR | O_CLOEXEC)};
    if (f.fd < 0) {
        const int err = errno;
        throw Error(err == ENOENT ? CMF_ERR_FILE_NOT_FOUND : CMF_ERR_IO, file + ": cannot open for writing: " + std::strerror(err));
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) parts::io_fail("cannot stat", file, errno);
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < kEnvelopeSize) throw Error(CMF_ERR_BOUNDS, file + ": shorter than the 128-byte envelope");
    uint8_t head[kEnvelopeSize];
    pread_all(f.fd, head, kEnvelopeSize, 0, file);
    if (std::memcmp(head, kMagic, 4) != 0) throw Error(CMF_ERR_INVALID_MAGIC, file + ": not a CMF file");
    Envelope env = Envelope::decode(head);
    uint64_t dir_end, data_end;
    if (!add_ok(env.off[kDir], env.len[kDir], dir_end) || dir_end > size || env.len[kDir] < 16 ||
        !add_ok(env.off[kData], env.len[kData], data_end) || data_end > size)
        throw Error(CMF_ERR_BOUNDS, file + ": directory or data section outside the file");
    std::vector<uint8_t> dir(env.len[kDir]);
    pread_all(f.fd, dir.data(), dir.size(), env.off[kDir], file);
    const uint64_t count = rd64(dir.data());
    if (count > (dir.size() - 16) / kDirRecordSize) throw Error(CMF_ERR_BOUNDS, file + ": directory count overflows the directory");

    Journal j;
    j.file_size = size;
    j.hash_before = env.dir_hash;
    for (const SlotPatch &p : patches) {
        if (p.record >= count)
            throw Error(CMF_ERR_BOUNDS, file + ": record " + std::to_string(p.record) + " is outside the directory's " + std::to_string(count));
        if (p.dtype < 0 || p.dtype > kMaxDtypeId) throw Error(CMF_ERR_UNKNOWN_DTYPE, file + ": dtype id " + std::to_string(p.dtype));
        uint8_t *r = dir.data() + 16 + p.record * kDirRecordSize;
        const uint64_t off = rd64(r + 32), slot = rd64(r + 40);
        uint64_t end;
        if (!add_ok(off, slot, end) || end > env.len[kData])
            throw Error(CMF_ERR_BOUNDS, file + ": record " + std::to_string(p.record) + "'s payload lies outside the data section");
        if (p.payload.size() > slot)
            throw Error(CMF_ERR_BOUNDS, file + ": record " + std::to_string(p.record) + ": the new payload of " + std::to_string(p.payload.size()) +
                                            " bytes does not fit its " + std::to_string(slot) + "-byte slot");
        r[6] = static_cast<uint8_t>(p.dtype);
        wr64(r + 40, p.payload.size());
        wr64(r + 48, hash64(p.payload.data(), p.payload.size()));
        env.required_features |= parts::quant_bit(p.dtype);
        j.writes.push_back(Write{env.off[kData] + off, p.payload});
    }
    env.dir_hash = hash64(dir.data(), dir.size());
    j.hash_after = env.dir_hash;
    uint8_t new_head[kEnvelopeSize];
    env.encode(new_head);
    j.writes.push_back(Write{env.off[kDir], std::move(dir)});
    j.writes.push_back(Write{0, std::vector<uint8_t>(new_head, new_head + kEnvelopeSize)});

    // 1. The journal, complete and synced, under its final name.
    const std::string jp = journal_path(file), tmp = jp + ".tmp";
    {
        const std::vector<uint8_t> bytes = encode(j);
        Fd jf{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
        if (jf.fd < 0) parts::io_fail("cannot create the journal", tmp, errno);
        pwrite_all(jf.fd, bytes.data(), bytes.size(), 0, tmp);
        fsync_or_fail(jf.fd, tmp);
    }
    parts::crash_point("in-place-journal-written");
    if (::rename(tmp.c_str(), jp.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        parts::io_fail("cannot rename the journal to", jp, err);
    }
    parts::fsync_dir(jp);
    parts::crash_point("in-place-journal-committed");
    // 2. The file; 3. the journal goes.
    apply(j, f.fd, file);
    if (::unlink(jp.c_str()) != 0) parts::io_fail("cannot remove", jp, errno);
    parts::fsync_dir(jp);
}

}  // namespace cmf::container
