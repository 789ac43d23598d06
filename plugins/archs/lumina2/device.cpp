#include "device.hpp"

#include "../common/binder.hpp"

#include <cmf/plugin.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

namespace cmf::archs::lumina2 {

using cmf::sdk::Error;

void require_image_ops(const cmf_backend_vt *be) {
    if (be == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: NULL backend");
    const std::string name = be->name ? be->name : "?";
    if (be->struct_size < offsetof(cmf_backend_vt, upsample2x) + sizeof(void *))
        throw Error(CMF_ERR_UNSUPPORTED, "lumina2: backend '" + name + "' predates the image operations (cmf_backend_vt.modulate .. upsample2x)");
#define CMF_OP(op) {#op, reinterpret_cast<const void *>(be->op)}
    const std::pair<const char *, const void *> ops[] = {
        CMF_OP(weight_bind), CMF_OP(matmul),     CMF_OP(buffer_alloc),   CMF_OP(buffer_free), CMF_OP(buffer_write),
        CMF_OP(buffer_read), CMF_OP(copy),       CMF_OP(rms_norm),       CMF_OP(rope),        CMF_OP(attention),
        CMF_OP(gated_act),   CMF_OP(add),        CMF_OP(add_bias),       CMF_OP(embed),       CMF_OP(modulate),
        CMF_OP(add_gated),   CMF_OP(activation), CMF_OP(layer_norm),     CMF_OP(rope_table),  CMF_OP(attention_full),
        CMF_OP(conv2d),      CMF_OP(group_norm), CMF_OP(upsample2x)};
#undef CMF_OP
    for (const auto &[op, fn] : ops)
        if (fn == nullptr)
            throw Error(CMF_ERR_UNSUPPORTED, "lumina2: backend '" + name + "' lacks the " + op + " operation");
}

Buffer &Buffer::operator=(Buffer &&o) noexcept {
    if (this != &o) {
        release();
        d_ = o.d_, p_ = o.p_, n_ = o.n_;
        o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
}

void Buffer::ensure(const Device &d, uint64_t floats) {
    if (p_ != nullptr && floats <= n_) return;
    release();
    d_ = d;
    check(d.be->buffer_alloc(d.ctx, std::max<uint64_t>(floats, 1) * sizeof(float), &p_));
    n_ = floats;
}

void Buffer::release() noexcept {
    if (p_ != nullptr) d_.be->buffer_free(d_.ctx, p_);
    p_ = nullptr;
    n_ = 0;
}

void Buffer::write(const float *host, uint64_t n, uint64_t offset) {
    if (offset + n > n_) throw Error(CMF_ERR_INTERNAL, "lumina2: buffer write past the end");
    check(d_.be->buffer_write(d_.ctx, p_ + offset, host, n * sizeof(float)));
}

void Buffer::read(float *host, uint64_t n, uint64_t offset) const {
    if (offset + n > n_) throw Error(CMF_ERR_INTERNAL, "lumina2: buffer read past the end");
    check(d_.be->buffer_read(d_.ctx, host, p_ + offset, n * sizeof(float)));
}

}  // namespace cmf::archs::lumina2
