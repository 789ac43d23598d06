#include "convert/gguf.hpp"

#include "common/error.hpp"
#include "container/mapped_file.hpp"

// f16/bf16 decoding exactly as the codecs (IEEE binary16, exact in f32).
#include "half.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>


namespace cmf::convert::gguf {

namespace {

constexpr uint32_t kMaxDims = 4;        // GGML_MAX_DIMS
constexpr uint64_t kMaxName = 64;       // tensor names (the GGUF spec's limit)
constexpr uint64_t kMaxKey = 65535;     // metadata keys (the GGUF spec's limit)

const TypeInfo kTypes[] = {
    /* 0 */ {"F32", 1, 4, true},       /* 1 */ {"F16", 1, 2, true},       /* 2 */ {"Q4_0", 32, 18, true},
    /* 3 */ {"Q4_1", 32, 20, true},    /* 4 */ {nullptr, 0, 0, false},     /* 5 */ {nullptr, 0, 0, false},
    /* 6 */ {"Q5_0", 32, 22, true},    /* 7 */ {"Q5_1", 32, 24, true},    /* 8 */ {"Q8_0", 32, 34, true},
    /* 9 */ {"Q8_1", 32, 36, false},   /* 10 */ {"Q2_K", 256, 84, true},  /* 11 */ {"Q3_K", 256, 110, true},
    /* 12 */ {"Q4_K", 256, 144, true}, /* 13 */ {"Q5_K", 256, 176, true}, /* 14 */ {"Q6_K", 256, 210, true},
    /* 15 */ {"Q8_K", 256, 292, false}, /* 16 */ {"IQ2_XXS", 256, 66, false}, /* 17 */ {"IQ2_XS", 256, 74, false},
    /* 18 */ {"IQ3_XXS", 256, 98, false}, /* 19 */ {"IQ1_S", 256, 50, false}, /* 20 */ {"IQ4_NL", 32, 18, false},
    /* 21 */ {"IQ3_S", 256, 110, false}, /* 22 */ {"IQ2_S", 256, 82, false}, /* 23 */ {"IQ4_XS", 256, 136, false},
    /* 24 */ {"I8", 1, 1, false},      /* 25 */ {"I16", 1, 2, false},     /* 26 */ {"I32", 1, 4, false},
    /* 27 */ {"I64", 1, 8, false},     /* 28 */ {"F64", 1, 8, false},     /* 29 */ {"IQ1_M", 256, 56, false},
    /* 30 */ {"BF16", 1, 2, true},     /* 31 */ {nullptr, 0, 0, false},   /* 32 */ {nullptr, 0, 0, false},
    /* 33 */ {nullptr, 0, 0, false},   /* 34 */ {"TQ1_0", 256, 54, false}, /* 35 */ {"TQ2_0", 256, 66, false},
    /* 36 */ {nullptr, 0, 0, false},   /* 37 */ {nullptr, 0, 0, false},   /* 38 */ {nullptr, 0, 0, false},
    /* 39 */ {"MXFP4", 32, 17, false},
};

const char *const kValueTypeNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

std::string value_type_name(uint32_t t) {
    return t < sizeof kValueTypeNames / sizeof *kValueTypeNames ? kValueTypeNames[t] : "type " + std::to_string(t);
}

// Size in bytes of a scalar value type; 0 for string/array/unknown.
uint64_t scalar_size(uint32_t t) {
    switch (t) {
    case U8: case I8v: case BOOL: return 1;
    case U16: case I16v: return 2;
    case U32: case I32v: case F32v: return 4;
    case U64: case I64v: case F64v: return 8;
    default: return 0;
    }
}

uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
float h2f(const uint8_t *p) { return codecs::f16_to_f32(rd16(p)); }

// A bounds-checked reader over the file image.
struct Cursor {
    const uint8_t *b;
    uint64_t size, pos = 0;
    const std::string &path;

    [[noreturn]] void fail(const std::string &what) const {
        throw Error(CMF_ERR_PARSE, path + ": " + what + " (at byte " + std::to_string(pos) + ")");
    }
    uint64_t left() const { return size - pos; }
    const uint8_t *take(uint64_t n, const char *what) {
        if (n > left())
            throw Error(CMF_ERR_BOUNDS, path + ": truncated: " + what + " needs " + std::to_string(n) + " bytes at byte " +
                                            std::to_string(pos) + " but the file has " + std::to_string(left()) + " left");
        const uint8_t *p = b + pos;
        pos += n;
        return p;
    }
    uint32_t u32(const char *what) { return rd32(take(4, what)); }
    uint64_t u64(const char *what) { return rd64(take(8, what)); }
    std::string str(const char *what, uint64_t max_len) {
        const uint64_t n = u64(what);
        if (n > left())
            throw Error(CMF_ERR_BOUNDS, path + ": " + what + " claims " + std::to_string(n) + " bytes at byte " + std::to_string(pos) +
                                            " but the file has " + std::to_string(left()) + " left");
        if (n > max_len) fail(std::string(what) + " is " + std::to_string(n) + " bytes long; at most " + std::to_string(max_len) + " are allowed");
        const uint8_t *p = take(n, what);
        return std::string(reinterpret_cast<const char *>(p), n);
    }
};

void read_scalar(Cursor &c, uint32_t t, Value &v, const std::string &key) {
    const uint8_t *p = c.take(scalar_size(t), "a metadata value");
    switch (t) {
    case U8: v.u = p[0]; v.i = p[0]; break;
    case I8v: v.i = static_cast<int8_t>(p[0]); v.is_signed = true; break;
    case U16: v.u = rd16(p); v.i = static_cast<int64_t>(v.u); break;
    case I16v: v.i = static_cast<int16_t>(rd16(p)); v.is_signed = true; break;
    case U32: v.u = rd32(p); v.i = static_cast<int64_t>(v.u); break;
    case I32v: v.i = static_cast<int32_t>(rd32(p)); v.is_signed = true; break;
    case U64: v.u = rd64(p); v.i = static_cast<int64_t>(v.u); break;
    case I64v: v.i = static_cast<int64_t>(rd64(p)); v.is_signed = true; break;
    case F32v: {
        // An f32 value reads as the shortest decimal that rounds to it: the
        // number it was written from (1e-6, not 9.99999997e-07), so a
        // config built from it matches the original's.
        float f;
        std::memcpy(&f, p, 4);
        char buf[32];
        auto r = std::to_chars(buf, buf + sizeof buf - 1, f);
        *r.ptr = 0;
        v.f = std::isfinite(f) ? std::strtod(buf, nullptr) : static_cast<double>(f);
        break;
    }
    case F64v: std::memcpy(&v.f, p, 8); break;
    case BOOL:
        if (p[0] > 1) c.fail("metadata key \"" + key + "\": bool value " + std::to_string(p[0]) + " is neither 0 nor 1");
        v.u = p[0];
        v.i = p[0];
        break;
    default: c.fail("metadata key \"" + key + "\": unknown value type " + std::to_string(t));
    }
    if (v.is_signed && v.i >= 0) v.u = static_cast<uint64_t>(v.i);
    if (t != F32v && t != F64v) v.f = v.is_signed ? static_cast<double>(v.i) : static_cast<double>(v.u);
}

}  // namespace

const TypeInfo *type_info(uint32_t type) noexcept {
    if (type >= sizeof kTypes / sizeof *kTypes || !kTypes[type].name) return nullptr;
    return &kTypes[type];
}

std::string type_name(uint32_t type) {
    const TypeInfo *t = type_info(type);
    return t ? t->name : "type " + std::to_string(type);
}

std::string nearest_quant(uint32_t type) {
    switch (type) {
    case F32: return "f32";
    case F16: return "f16";
    case BF16: return "bf16";
    // 5-, 6- and 8-bit codes lose nothing worth keeping in q8_row's 8 bits.
    case Q8_0: case Q5_0: case Q5_1: case Q5_K: case Q6_K: return "q8";
    // 4 bits and fewer: q4tp (4-bit codes, a per-row scale ladder). The
    // 2- and 3-bit types go up to 4 bits, not down to q2tp, whose 2-bit grid
    // would add its own error on top of theirs.
    case Q4_0: case Q4_1: case Q4_K: case Q3_K: case Q2_K: return "q4tp";
    default: throw Error(CMF_ERR_UNKNOWN_DTYPE, "unsupported GGUF type " + type_name(type));
    }
}

// ---- dequantization --------------------------------------------------------
//
// Written from the block layouts (ggml-common.h) and the reference decoders
// (ggml-quants.c); each expression keeps ggml's operand order so that every
// f32 rounding happens exactly where ggml's does (the build compiles this
// file with -ffp-contract=off: a fused multiply-add would round once where
// ggml's reference rounds twice).

namespace {

void get_scale_min_k4(int j, const uint8_t *q, uint8_t &d, uint8_t &m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void deq_q4_0(const uint8_t *b, float *y) {  // d f16, qs[16]
    const float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; ++j) {
        const int x0 = (qs[j] & 0x0F) - 8, x1 = (qs[j] >> 4) - 8;
        y[j] = static_cast<float>(x0) * d;
        y[j + 16] = static_cast<float>(x1) * d;
    }
}
void deq_q4_1(const uint8_t *b, float *y) {  // d, m f16, qs[16]
    const float d = h2f(b), m = h2f(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; ++j) {
        const int x0 = qs[j] & 0x0F, x1 = qs[j] >> 4;
        y[j] = static_cast<float>(x0) * d + m;
        y[j + 16] = static_cast<float>(x1) * d + m;
    }
}
void deq_q5_0(const uint8_t *b, float *y) {  // d f16, qh u32, qs[16]
    const float d = h2f(b);
    const uint32_t qh = rd32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; ++j) {
        const uint8_t xh0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
        const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
        const int x0 = ((qs[j] & 0x0F) | xh0) - 16, x1 = ((qs[j] >> 4) | xh1) - 16;
        y[j] = static_cast<float>(x0) * d;
        y[j + 16] = static_cast<float>(x1) * d;
    }
}
void deq_q5_1(const uint8_t *b, float *y) {  // d, m f16, qh u32, qs[16]
    const float d = h2f(b), m = h2f(b + 2);
    const uint32_t qh = rd32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; ++j) {
        const uint8_t xh0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
        const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
        const int x0 = (qs[j] & 0x0F) | xh0, x1 = (qs[j] >> 4) | xh1;
        y[j] = static_cast<float>(x0) * d + m;
        y[j + 16] = static_cast<float>(x1) * d + m;
    }
}
void deq_q8_0(const uint8_t *b, float *y) {  // d f16, qs[32] i8
    const float d = h2f(b);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}
void deq_q2_k(const uint8_t *b, float *y) {  // scales[16], qs[64], d, dmin
    const uint8_t *scales = b, *q = b + 16;
    const float d = h2f(b + 80), min = h2f(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
            uint8_t sc = scales[is++];
            float dl = d * static_cast<float>(sc & 0xF), ml = min * static_cast<float>(sc >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l] >> shift) & 3)) - ml;
            sc = scales[is++];
            dl = d * static_cast<float>(sc & 0xF);
            ml = min * static_cast<float>(sc >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16] >> shift) & 3)) - ml;
            shift += 2;
        }
        q += 32;
    }
}
void deq_q3_k(const uint8_t *b, float *y) {  // hmask[32], qs[64], scales[12], d
    const uint8_t *hm = b, *q = b + 32;
    const float d_all = h2f(b + 108);
    // The 16 six-bit scales: low 4 bits in scales[0..7] (two per byte),
    // high 2 bits in scales[8..11].
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t aux[4];
    std::memcpy(aux, b + 96, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    std::memcpy(scales, aux, 16);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
            float dl = d_all * static_cast<float>(scales[is++] - 32);
            for (int l = 0; l < 16; ++l)
                *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            dl = d_all * static_cast<float>(scales[is++] - 32);
            for (int l = 0; l < 16; ++l)
                *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
            shift += 2;
            m = static_cast<uint8_t>(m << 1);
        }
        q += 32;
    }
}
void deq_q4_k(const uint8_t *b, float *y) {  // d, dmin, scales[12], qs[128]
    const float d = h2f(b), min = h2f(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < 256; j += 64) {
        get_scale_min_k4(is + 0, scales, sc, m);
        const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
        get_scale_min_k4(is + 1, scales, sc, m);
        const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}
void deq_q5_k(const uint8_t *b, float *y) {  // d, dmin, scales[12], qh[32], qs[128]
    const float d = h2f(b), min = h2f(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    int is = 0;
    uint8_t sc, m, u1 = 1, u2 = 2;
    for (int j = 0; j < 256; j += 64) {
        get_scale_min_k4(is + 0, scales, sc, m);
        const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
        get_scale_min_k4(is + 1, scales, sc, m);
        const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        is += 2;
        u1 = static_cast<uint8_t>(u1 << 2);
        u2 = static_cast<uint8_t>(u2 << 2);
    }
}
void deq_q6_k(const uint8_t *b, float *y) {  // ql[128], qh[64], scales[16] i8, d
    const float d = h2f(b + 208);
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192);
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int8_t q1 = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            const int8_t q2 = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            const int8_t q3 = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            const int8_t q4 = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            // (d * scale) * q, left to right, as ggml writes it.
            y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
            y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
            y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
            y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

}  // namespace

void dequantize(uint32_t type, const uint8_t *src, uint64_t n, float *dst) {
    const TypeInfo *ti = type_info(type);
    if (!ti || !ti->decodable) throw Error(CMF_ERR_UNKNOWN_DTYPE, "unsupported GGUF type " + type_name(type));
    if (n % ti->elems) throw Error(CMF_ERR_INTERNAL, "dequantize: " + std::to_string(n) + " values are not whole " + ti->name + " blocks");
    const uint64_t blocks = n / ti->elems;
    void (*fn)(const uint8_t *, float *) = nullptr;
    switch (type) {
    case F32: std::memcpy(dst, src, n * 4); return;
    case F16:
        for (uint64_t i = 0; i < n; ++i) dst[i] = h2f(src + 2 * i);
        return;
    case BF16:
        for (uint64_t i = 0; i < n; ++i) dst[i] = codecs::bf16_to_f32(rd16(src + 2 * i));
        return;
    case Q4_0: fn = deq_q4_0; break;
    case Q4_1: fn = deq_q4_1; break;
    case Q5_0: fn = deq_q5_0; break;
    case Q5_1: fn = deq_q5_1; break;
    case Q8_0: fn = deq_q8_0; break;
    case Q2_K: fn = deq_q2_k; break;
    case Q3_K: fn = deq_q3_k; break;
    case Q4_K: fn = deq_q4_k; break;
    case Q5_K: fn = deq_q5_k; break;
    case Q6_K: fn = deq_q6_k; break;
    default: throw Error(CMF_ERR_UNKNOWN_DTYPE, "unsupported GGUF type " + type_name(type));
    }
    for (uint64_t b = 0; b < blocks; ++b) fn(src + b * ti->bytes, dst + b * ti->elems);
}

// ---- the file --------------------------------------------------------------

File::File(const std::string &path) : path_(path) {
    // Mapped read-only (read into memory where mapping is refused), opened
    // as the container reader opens .cmf files.
    mapped_ = std::make_unique<container::MappedFile>(path, true);
    bytes_ = mapped_->data();
    size_ = mapped_->size();
    parse();
}

File::File(const uint8_t *bytes, uint64_t size, const std::string &label) : path_(label), bytes_(bytes), size_(size) { parse(); }

File::~File() = default;

void File::parse() {
    static const uint8_t empty = 0;
    Cursor c{bytes_ ? bytes_ : &empty, size_, 0, path_};
    if (size_ < 4 || std::memcmp(c.b, "GGUF", 4) != 0)
        throw Error(CMF_ERR_INVALID_MAGIC, path_ + ": not a GGUF file (the first 4 bytes are not \"GGUF\")");
    c.pos = 4;
    version_ = c.u32("the version");
    if (version_ == 1) throw Error(CMF_ERR_UNSUPPORTED_VERSION, path_ + ": GGUF version 1 is not supported (versions 2 and 3 are)");
    if (version_ != 2 && version_ != 3) {
        // A big-endian file reads its version byte-swapped here.
        const uint32_t swapped = __builtin_bswap32(version_);
        if (swapped == 2 || swapped == 3)
            throw Error(CMF_ERR_UNSUPPORTED_VERSION, path_ + ": a big-endian GGUF file; only little-endian files are supported");
        throw Error(CMF_ERR_UNSUPPORTED_VERSION, path_ + ": GGUF version " + std::to_string(version_) + " is not supported (versions 2 and 3 are)");
    }
    const uint64_t n_tensors = c.u64("the tensor count");
    const uint64_t n_kv = c.u64("the metadata count");
    // Every key/value takes at least 8 (key length) + 4 (type) + 1 bytes, every
    // tensor info at least 8 + 4 + 8 + 4 + 8: a count beyond what the rest of
    // the file could hold is corrupt, and is refused before anything is
    // allocated for it.
    if (n_kv > c.left() / 13)
        c.fail("metadata count " + std::to_string(n_kv) + " cannot fit in the " + std::to_string(c.left()) + " bytes that follow");
    if (n_tensors > c.left() / 32)
        c.fail("tensor count " + std::to_string(n_tensors) + " cannot fit in the " + std::to_string(c.left()) + " bytes that follow");

    for (uint64_t k = 0; k < n_kv; ++k) {
        std::string key = c.str("a metadata key", kMaxKey);
        if (key.empty()) c.fail("metadata key " + std::to_string(k) + " is empty");
        if (kv_.count(key)) c.fail("duplicate metadata key \"" + key + "\"");
        Value v;
        v.type = c.u32("a metadata value type");
        if (v.type == STRING) {
            v.s = c.str(("the value of \"" + key + "\"").c_str(), UINT64_MAX);
        } else if (v.type == ARRAY) {
            v.elem_type = c.u32("an array element type");
            v.count = c.u64("an array length");
            if (v.elem_type == ARRAY) c.fail("metadata key \"" + key + "\": nested arrays are not supported");
            const uint64_t esize = v.elem_type == STRING ? 8 : scalar_size(v.elem_type);
            if (esize == 0) c.fail("metadata key \"" + key + "\": unknown array element type " + std::to_string(v.elem_type));
            if (v.count > c.left() / esize)
                throw Error(CMF_ERR_BOUNDS, path_ + ": metadata key \"" + key + "\": array of " + std::to_string(v.count) + " " +
                                                value_type_name(v.elem_type) + " values cannot fit in the " + std::to_string(c.left()) +
                                                " bytes that follow");
            if (v.elem_type == STRING) {
                v.strs.reserve(v.count);
                for (uint64_t i = 0; i < v.count; ++i) v.strs.push_back(c.str(("an element of \"" + key + "\"").c_str(), UINT64_MAX));
            } else {
                v.nums.reserve(v.count);
                for (uint64_t i = 0; i < v.count; ++i) {
                    Value e;
                    read_scalar(c, v.elem_type, e, key);
                    v.nums.push_back(e.f);
                    v.ints.push_back(e.is_signed ? e.i : static_cast<int64_t>(e.u));
                }
            }
        } else if (scalar_size(v.type)) {
            read_scalar(c, v.type, v, key);
        } else {
            c.fail("metadata key \"" + key + "\": unknown value type " + std::to_string(v.type));
        }
        kv_.emplace(std::move(key), std::move(v));
    }

    if (const Value *a = get("general.alignment")) {
        if (a->type != U32) c.fail("general.alignment is a " + value_type_name(a->type) + ", not a u32");
        if (a->u == 0 || (a->u & (a->u - 1)) != 0)
            throw Error(CMF_ERR_PARSE, path_ + ": general.alignment " + std::to_string(a->u) + " is not a power of two");
        alignment_ = a->u;
    }

    tensors_.reserve(n_tensors);
    for (uint64_t k = 0; k < n_tensors; ++k) {
        TensorInfo t;
        t.name = c.str("a tensor name", kMaxName);
        if (t.name.empty()) c.fail("tensor " + std::to_string(k) + " has an empty name");
        const std::string where = "tensor \"" + t.name + "\": ";
        if (by_name_.count(t.name)) c.fail("duplicate tensor name \"" + t.name + "\"");
        const uint32_t nd = c.u32("a tensor's dimension count");
        if (nd == 0 || nd > kMaxDims) c.fail(where + std::to_string(nd) + " dimensions; GGUF tensors have 1 to 4");
        uint64_t n = 1;
        for (uint32_t d = 0; d < nd; ++d) {
            const uint64_t v = c.u64("a tensor dimension");
            if (v == 0) c.fail(where + "dimension " + std::to_string(d) + " is 0");
            if (v > INT64_MAX || n > static_cast<uint64_t>(INT64_MAX) / v)
                throw Error(CMF_ERR_BOUNDS, path_ + ": " + where + "the element count overflows 63 bits");
            n *= v;
            t.dims.push_back(v);
        }
        t.type = c.u32("a tensor type");
        const TypeInfo *ti = type_info(t.type);
        if (!ti) c.fail(where + "unknown GGUF tensor type " + std::to_string(t.type));
        if (t.dims[0] % ti->elems)
            c.fail(where + "a row of " + std::to_string(t.dims[0]) + " values is not a whole number of " + ti->name + " blocks (" +
                   std::to_string(ti->elems) + " values each)");
        t.offset = c.u64("a tensor offset");
        t.elements = n;
        const uint64_t blocks = n / ti->elems;
        if (blocks > UINT64_MAX / ti->bytes) throw Error(CMF_ERR_BOUNDS, path_ + ": " + where + "the byte size overflows 64 bits");
        t.nbytes = blocks * ti->bytes;
        if (t.offset % alignment_)
            throw Error(CMF_ERR_BOUNDS, path_ + ": " + where + "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                                            std::to_string(alignment_));
        by_name_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment.
    const uint64_t pad = (alignment_ - c.pos % alignment_) % alignment_;
    if (n_tensors == 0) {
        data_off_ = std::min(size_, c.pos + pad);
        return;
    }
    if (pad > c.left())
        throw Error(CMF_ERR_BOUNDS, path_ + ": truncated: the data section would start at byte " + std::to_string(c.pos + pad) +
                                        " of a " + std::to_string(size_) + "-byte file");
    data_off_ = c.pos + pad;
    const uint64_t data_len = size_ - data_off_;
    std::vector<const TensorInfo *> order;
    for (auto &t : tensors_) {
        if (t.offset > data_len || t.nbytes > data_len - t.offset)
            throw Error(CMF_ERR_BOUNDS, path_ + ": tensor \"" + t.name + "\" (" + type_name(t.type) + ", " + std::to_string(t.nbytes) +
                                            " bytes at offset " + std::to_string(t.offset) + ") ends past the data section's " +
                                            std::to_string(data_len) + " bytes (truncated file?)");
        t.data = bytes_ + data_off_ + t.offset;
        order.push_back(&t);
    }
    std::sort(order.begin(), order.end(), [](const TensorInfo *a, const TensorInfo *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < order.size(); ++i)
        if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
            throw Error(CMF_ERR_BOUNDS, path_ + ": tensors \"" + order[i - 1]->name + "\" and \"" + order[i]->name + "\" overlap in the data section");
}

const TensorInfo *File::find(const std::string &name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const Value *File::get(const std::string &key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::string &path, const std::string &key, const Value &v, const char *want) {
    throw Error(CMF_ERR_PARSE, path + ": metadata key \"" + key + "\" is a " + value_type_name(v.type) + ", expected " + want);
}
bool is_int(uint32_t t) { return t == U8 || t == I8v || t == U16 || t == I16v || t == U32 || t == I32v || t == U64 || t == I64v; }
}  // namespace

std::optional<uint64_t> File::get_u64(const std::string &key) const {
    const Value *v = get(key);
    if (!v) return std::nullopt;
    if (!is_int(v->type)) wrong_type(path_, key, *v, "an integer");
    if (v->is_signed && v->i < 0) throw Error(CMF_ERR_PARSE, path_ + ": metadata key \"" + key + "\" is negative (" + std::to_string(v->i) + ")");
    return v->u;
}

std::optional<double> File::get_f64(const std::string &key) const {
    const Value *v = get(key);
    if (!v) return std::nullopt;
    if (!is_int(v->type) && v->type != F32v && v->type != F64v) wrong_type(path_, key, *v, "a number");
    return v->f;
}

std::optional<std::string> File::get_str(const std::string &key) const {
    const Value *v = get(key);
    if (!v) return std::nullopt;
    if (v->type != STRING) wrong_type(path_, key, *v, "a string");
    return v->s;
}

std::optional<bool> File::get_bool(const std::string &key) const {
    const Value *v = get(key);
    if (!v) return std::nullopt;
    if (v->type != BOOL) wrong_type(path_, key, *v, "a bool");
    return v->u != 0;
}

void File::release_bytes(const uint8_t *from, const uint8_t *to) const {
    if (mapped_ && mapped_->mapped()) release_mapped_pages(mapped_->data(), from, to);
}

}  // namespace cmf::convert::gguf
