#include "container/mapped_file.hpp"

#include "common/error.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cmf::container {

namespace {
struct Fd {
    int fd;
    ~Fd() { if (fd >= 0) ::close(fd); }
};
[[noreturn]] void io_fail(const std::string &what, const std::string &path, int err) {
    throw Error(CMF_ERR_IO, what + " '" + path + "': " + std::strerror(err));
}
}  // namespace

MappedFile::MappedFile(const std::string &path, bool allow_mmap) : path_(path) {
    Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0) {
        int err = errno;
        if (err == ENOENT || err == ENOTDIR) throw Error(CMF_ERR_FILE_NOT_FOUND, "file not found: '" + path + "'");
        io_fail("cannot open", path, err);
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) io_fail("cannot stat", path, errno);
    if (S_ISDIR(st.st_mode)) throw Error(CMF_ERR_IO, "'" + path + "' is a directory, not a CMF file");
    if (allow_mmap && S_ISREG(st.st_mode) && st.st_size > 0) {
        void *p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, f.fd, 0);
        if (p != MAP_FAILED) {
            data_ = static_cast<const uint8_t *>(p);
            size_ = uint64_t(st.st_size);
            mapped_ = true;
            return;
        }
        // fall through to read(): some filesystems refuse mmap
    }
    // read() fallback: reads until EOF, so it also works for pipes.
    if (S_ISREG(st.st_mode)) buffer_.reserve(size_t(st.st_size));
    uint8_t chunk[1 << 16];
    for (;;) {
        ssize_t n = ::read(f.fd, chunk, sizeof chunk);
        if (n < 0) {
            if (errno == EINTR) continue;
            io_fail("cannot read", path, errno);
        }
        if (n == 0) break;
        buffer_.insert(buffer_.end(), chunk, chunk + n);
    }
    data_ = buffer_.data();
    size_ = buffer_.size();
}

MappedFile::~MappedFile() {
    if (mapped_) ::munmap(const_cast<uint8_t *>(data_), size_t(size_));
}

}  // namespace cmf::container
