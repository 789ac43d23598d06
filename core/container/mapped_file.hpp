// A whole file, read-only: memory-mapped, or read into memory when mapping
// is not wanted (CMF_OPEN_NO_MMAP) or not possible (pipes, some FUSE mounts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cmf::container {

class MappedFile {
public:
    // Throws cmf::Error: FileNotFound when the path does not exist, Io otherwise.
    MappedFile(const std::string &path, bool allow_mmap);
    ~MappedFile();
    MappedFile(const MappedFile &) = delete;
    MappedFile &operator=(const MappedFile &) = delete;

    const uint8_t *data() const noexcept { return data_; }
    uint64_t size() const noexcept { return size_; }
    bool mapped() const noexcept { return mapped_; }
    const std::string &path() const noexcept { return path_; }

private:
    std::string path_;
    const uint8_t *data_ = nullptr;
    uint64_t size_ = 0;
    bool mapped_ = false;
    std::vector<uint8_t> buffer_;  // the read() fallback
};

}  // namespace cmf::container
