// The backend as the lumina2 components use it: its vtable and context, the
// check that it has every operation they call, and owned buffers.
#pragma once

#include <cmf/cmf_plugin.h>

#include <cstdint>

namespace cmf::archs::lumina2 {

struct Device {
    const cmf_host_api *host = nullptr;
    const cmf_backend_vt *be = nullptr;
    void *ctx = nullptr;
};

// CMF_ERR_UNSUPPORTED naming the first operation the backend lacks among
// those a text-to-image pipeline calls (the transformer operations the
// text encoder needs, and the image operations).
void require_image_ops(const cmf_backend_vt *be);

// A device buffer of floats, freed with its owner; grown by ensure().
class Buffer {
public:
    Buffer() = default;
    Buffer(const Device &d, uint64_t floats) { ensure(d, floats); }
    ~Buffer() { release(); }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    Buffer(Buffer &&o) noexcept : d_(o.d_), p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
    Buffer &operator=(Buffer &&o) noexcept;

    // At least `floats` floats (contents are lost when it grows).
    void ensure(const Device &d, uint64_t floats);
    void release() noexcept;
    float *get() const { return p_; }
    uint64_t size() const { return n_; }
    // Host <-> device, floats [offset, offset + n).
    void write(const float *host, uint64_t n, uint64_t offset = 0);
    void read(float *host, uint64_t n, uint64_t offset = 0) const;

private:
    Device d_;
    float *p_ = nullptr;
    uint64_t n_ = 0;
};

}  // namespace cmf::archs::lumina2
