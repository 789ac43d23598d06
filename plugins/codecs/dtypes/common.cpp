#include "dtypes/common.hpp"

#include "kernels/kernels.hpp"

#include <cmf/options.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace cmf::codecs {

namespace {

struct Delta {
    uint16_t arg;
    int8_t delta;
};

// f16 arguments where glibc 2.36's exp2f is one ulp above the correctly
// rounded value (found by an exhaustive check over all f16; tests/codecs
// repeats it against this machine's glibc). Sorted for binary search.
constexpr uint16_t kExp2PlusOne[] = {
    0x1bf5, 0x21a6, 0x22d3, 0x2d80, 0x3263, 0x3352, 0x3749, 0x3959, 0x3c58, 0x402c, 0x422c,
    0x4416, 0x4516, 0x4616, 0x4716, 0x480b, 0x488b, 0x490b, 0x498b, 0x4a0b, 0x4a8b, 0x4b0b,
    0x4b8b, 0x9df8, 0x9f35, 0xb54e, 0xbb50, 0xbfa8, 0xc1d4, 0xc3d4, 0xc4ea, 0xc5ea, 0xc6ea,
    0xc7ea, 0xc875, 0xc8f5, 0xc975, 0xc9f5, 0xca75, 0xcaf5, 0xcb75, 0xcbf5};

// Same for log2f, with the sign of the difference.
constexpr Delta kLog2Delta[] = {
    {0x361c, +1}, {0x3a5e, +1}, {0x3b5f, +1}, {0x3bc9, +1}, {0x3bdd, +1}, {0x3bde, +1}, {0x3bdf, +1},
    {0x3bed, -1}, {0x3bf6, -1}, {0x3bfb, -1}, {0x3c07, -1}, {0x3c16, +1}, {0x3c19, +1}, {0x3c21, -1},
    {0x3ca7, -1}, {0x3d16, +1}, {0x3d9a, -1}, {0x3e12, +1}, {0x3e97, +1}, {0x3f18, -1}, {0x421c, -1}};

float add_ulps(float r, int delta) noexcept {
    return f32_from_bits(static_cast<uint32_t>(static_cast<int64_t>(f32_bits(r)) + delta));
}

float exp2f_f16_computed(uint16_t h) noexcept {
    // The double result rounds correctly to f32 for every f16 argument: the
    // true value is exact or far (>= 11 000 double ulps) from an f32 rounding
    // boundary.
    float r = static_cast<float>(std::exp2(static_cast<double>(f16_to_f32(h))));
    if (std::binary_search(std::begin(kExp2PlusOne), std::end(kExp2PlusOne), h)) r = add_ulps(r, +1);
    return r;
}

}  // namespace

const float *exp2f_f16_table() noexcept {
    // Every f16 argument's value, computed once (256 KiB, a few ms): q4tp /
    // q2tp decode needs two per weight row, and the double exp2 plus the
    // search cost about as much as the row's whole dot product.
    // Static storage: no allocation (this is noexcept), no 256 KiB stack temporary.
    static const struct Table {
        float v[65536];
        Table() noexcept {
            for (uint32_t i = 0; i < 65536; ++i) v[i] = exp2f_f16_computed(static_cast<uint16_t>(i));
        }
    } table;
    return table.v;
}

float exp2f_f16(uint16_t h) noexcept { return exp2f_f16_table()[h]; }

float log2f_f16(uint16_t h) noexcept {
    float r = static_cast<float>(std::log2(static_cast<double>(f16_to_f32(h))));
    auto it = std::lower_bound(std::begin(kLog2Delta), std::end(kLog2Delta), h,
                               [](const Delta &d, uint16_t v) { return d.arg < v; });
    if (it != std::end(kLog2Delta) && it->arg == h) r = add_ulps(r, it->delta);
    return r;
}

Matrix require_2d_groups(Shape shape, const char *dtype) {
    if (shape.size() != 2)
        fail(CMF_ERR_INVALID_ARGUMENT,
             std::string(dtype) + " needs a 2-D shape, got " + std::to_string(shape.size()) + "-D");
    if (shape[1] == 0 || shape[1] % 32 != 0)
        fail(CMF_ERR_INVALID_ARGUMENT, std::string(dtype) + " needs cols to be a positive multiple of 32, got " +
                                           std::to_string(shape[1]));
    elements(shape);
    return {shape[0], shape[1]};
}

Matrix require_rows(Shape shape, const char *dtype) {
    if (shape.size() < 2)
        fail(CMF_ERR_INVALID_ARGUMENT,
             std::string(dtype) + " needs a 2-D shape, got " + std::to_string(shape.size()) + "-D");
    uint64_t n = elements(shape);
    uint64_t rows = shape[0];
    return {rows, rows ? n / rows : 0};
}

uint64_t checked_mad(uint64_t a, uint64_t b, uint64_t c, const char *dtype) {
    uint64_t p;
    if (__builtin_mul_overflow(a, b, &p) || __builtin_add_overflow(p, c, &p))
        fail(CMF_ERR_BOUNDS, std::string(dtype) + " payload size overflows 64 bits");
    return p;
}

Options::Options(const cmf_quantize_params *params, const char *dtype, std::initializer_list<const char *> allowed)
    : dtype_(dtype) {
    for (const cmf::sdk::OptionItem &item : cmf::sdk::split_options(params ? params->options : nullptr)) {
        if (!item.has_value || item.key.empty())
            fail(CMF_ERR_INVALID_ARGUMENT, dtype_ + " option '" + item.text + "' is not key=value");
        const std::string &key = item.key;
        bool known = false;
        std::string list;
        for (const char *a : allowed) {
            known |= key == a;
            list += list.empty() ? a : std::string(", ") + a;
        }
        if (!known)
            fail(CMF_ERR_INVALID_ARGUMENT, dtype_ + " has no option '" + key + "'" +
                                               (list.empty() ? std::string(" (it takes none)") : " (known: " + list + ")"));
        values_[key] = item.value;
    }
}

float Options::get_float(const std::string &key, float fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    const char *b = it->second.c_str();
    char *e = nullptr;
    errno = 0;
    float v = std::strtof(b, &e);
    if (e == b || *e != '\0' || errno == ERANGE || !std::isfinite(v))
        fail(CMF_ERR_INVALID_ARGUMENT, dtype_ + " option " + key + "='" + it->second + "' is not a finite number");
    return v;
}

bool Options::get_bool(const std::string &key, bool fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    if (it->second == "1" || it->second == "true") return true;
    if (it->second == "0" || it->second == "false") return false;
    fail(CMF_ERR_INVALID_ARGUMENT, dtype_ + " option " + key + "='" + it->second + "' is not 0/1/true/false");
}

namespace {
thread_local uint64_t current_x_id = 0;
thread_local const float *current_x = nullptr;  // the x current_x_id speaks for
}  // namespace

XIdScope::XIdScope(uint64_t id, const float *x) : saved_id_(current_x_id), saved_x_(current_x) {
    current_x_id = id;
    current_x = x;
}
XIdScope::~XIdScope() {
    current_x_id = saved_id_;
    current_x = saved_x_;
}
uint64_t current_matmul_id() { return current_x_id; }

const QuantizedX &quantized_x(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, kernels::XOrder order) {
    struct Cache {
        std::vector<float> x;  // n_batch * cols, the activations the result was made from
        uint64_t n_batch = 0, cols = 0;
        kernels::XOrder order = kernels::XOrder::natural;
        uint64_t x_id = 0;  // the matmul_rows_x id it was last used under (0: none)
        QuantizedX result;
    };
    thread_local Cache cache;
    // Another array than the caller's x (derived from it, under the same
    // id: one id covers every weight of a fused matmul_multi) has no id.
    const uint64_t id = x == current_x ? current_x_id : 0;
    bool same = cache.n_batch == n_batch && cache.cols == cols && cache.order == order;
    // The same call's next row range: one 4-12 KB memcmp per range was
    // 1.3 % of a q4 decode step's CPU time (perf, 0.6B shape, 16 ranges
    // per matmul).
    if (same && id != 0 && id == cache.x_id) return cache.result;
    for (uint64_t b = 0; same && b < n_batch; ++b)
        same = std::memcmp(cache.x.data() + b * cols, x + b * ldx, cols * sizeof(float)) == 0;
    if (same) {
        cache.x_id = id;
        return cache.result;
    }
    cache.n_batch = cache.cols = 0;  // not a valid entry until filled below
    cache.x_id = 0;
    QuantizedX &r = cache.result;
    static thread_local uint64_t serials = 0;
    r.serial = ++serials;
    r.blocks = kernels::x_blocks(cols);
    cache.x.resize(n_batch * cols);
    r.codes.resize(n_batch * 32 * r.blocks);
    r.scales.resize(n_batch * r.blocks);
    const bool pairs = order == kernels::XOrder::q4_pair_blocks, natural = order == kernels::XOrder::natural,
               quads = order == kernels::XOrder::q2_quads;
    r.offsets_per_row = pairs ? 8 * (r.blocks / 2) : natural || quads ? 8 * r.blocks : 0;
    r.offsets.resize(n_batch * r.offsets_per_row);
    r.block_offsets.resize(natural ? n_batch * r.blocks : 0);
    for (uint64_t b = 0; b < n_batch; ++b) {
        std::memcpy(cache.x.data() + b * cols, x + b * ldx, cols * sizeof(float));
        kernels::quantize_x(x + b * ldx, cols, order, r.codes.data() + b * 32 * r.blocks, r.scales.data() + b * r.blocks);
        int32_t *off = r.offsets.data() + b * r.offsets_per_row;
        if (pairs) kernels::q4_pair_offset(r.q(b), r.blocks, off);
        if (natural) {
            kernels::i8_offset(r.q(b), r.blocks, off);
            kernels::i8_block_offsets(r.q(b), r.blocks, r.block_offsets.data() + b * r.blocks);
        }
        if (quads) kernels::q2_offset(r.q(b), r.blocks, off);
    }
    cache.n_batch = n_batch, cache.cols = cols, cache.order = order, cache.x_id = id;
    return r;
}

void matmul_by_decode(const Dtype &d, const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch,
                      uint64_t r0, uint64_t r1, float *y, uint64_t ldy) {
    uint64_t cols = sdk::row_len_of(w);
    std::vector<float> row(cols);
    for (uint64_t r = r0; r < r1; ++r) {
        d.dequantize_rows(w, r, r + 1, row.data());
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = kernels::dot_f32(row.data(), x + b * ldx, cols);
    }
}

}  // namespace cmf::codecs
