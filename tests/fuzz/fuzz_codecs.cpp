// libFuzzer target: every codec's decoding of an arbitrary payload.
// Input: u8 dtype id, u8 ndim (0-4 used), ndim x u32 LE dims, payload. A
// shape of more than 2^16 elements is skipped (the bound that keeps an input
// fast). The payload goes through what open() checks (the codec's size for
// the shape, then its validate) and, when accepted, through everything that
// reads payloads: dequantize_rows over all rows, int8_rows, matmul_rows and
// matmul_rows_x against a batch of two activation rows. Decoding an accepted
// payload must never read outside it or fail in any way but a clean error.
//
// With CMF_FUZZ_WRITE_SEEDS=DIR and CMF_FUZZ_FIXTURES=tests/fixtures/upstream/sample.f32dir
// the binary instead encodes every fixture tensor with the codec of its
// dtype and writes one seed per tensor to DIR (run.sh does this first).
#include "fuzz_util.hpp"

#include "common/error.hpp"
#include "container/model.hpp"
#include "plugin_host/runtime.hpp"

#include <cstring>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <vector>

namespace {

cmf::Runtime &rt() { return *cmf::fuzz::runtime(); }

// A payload in its own 64-aligned allocation of exactly its size, as a
// container payload is aligned, so a read past its end is caught.
struct Payload {
    uint8_t *p;
    size_t n;
    Payload(const uint8_t *src, size_t len) : p(static_cast<uint8_t *>(::operator new(len ? len : 1, std::align_val_t(64)))), n(len) {
        if (len) std::memcpy(p, src, len);
    }
    ~Payload() { ::operator delete(p, std::align_val_t(64)); }
};

void exercise(const cmf::CodecEntry &c, const cmf::container::TensorRec &t) {
    cmf_tensor_view v{};
    v.struct_size = sizeof v;
    v.dtype = t.dtype;
    v.ndim = t.ndim;
    std::memcpy(v.shape, t.shape, sizeof v.shape);
    v.data = t.data;
    v.nbytes = t.nbytes;
    const uint64_t rows = t.ndim >= 2 ? t.shape[0] : 1;
    uint64_t row_len = 1;
    for (uint32_t d = t.ndim >= 2 ? 1 : 0; d < t.ndim; ++d) row_len *= t.shape[d];
    std::vector<float> out(rows * row_len);
    cmf_error_free(c.vt.dequantize_rows(c.ctx, &v, 0, rows, out.data()));
    if (t.ndim != 2 || rows == 0 || row_len == 0) return;
    if (c.vt.struct_size > offsetof(cmf_codec_vt, int8_rows) && c.vt.int8_rows) {
        if (cmf_error *e = c.vt.int8_rows(c.ctx, &v, 0, rows, nullptr, nullptr)) {
            cmf_error_free(e);
        } else {
            const uint64_t nb = (row_len + CMF_INT8_BLOCK - 1) / CMF_INT8_BLOCK;
            std::vector<int8_t> codes(rows * nb * CMF_INT8_BLOCK);
            std::vector<float> scales(rows * nb);
            cmf_error_free(c.vt.int8_rows(c.ctx, &v, 0, rows, codes.data(), scales.data()));
        }
    }
    std::vector<float> x(2 * row_len, 0.5f), y(2 * rows);
    if (c.vt.matmul_rows) cmf_error_free(c.vt.matmul_rows(c.ctx, &v, x.data(), row_len, 2, 0, rows, y.data(), rows));
    if (c.vt.struct_size > offsetof(cmf_codec_vt, matmul_rows_x) && c.vt.matmul_rows_x) {
        // A fresh id per call, as the contract asks: an id covers one x and
        // weights whose bytes do not change (each input here is another
        // payload, often at the address the last one had).
        static uint64_t x_id = 0;
        cmf_error_free(c.vt.matmul_rows_x(c.ctx, &v, x.data(), row_len, 2, 0, rows, y.data(), rows, ++x_id));
    }
}

void write_seeds(const char *dir, const char *fixtures) {
    DIR *d = opendir(fixtures);
    if (!d) {
        std::fprintf(stderr, "fuzz_codecs: cannot list %s\n", fixtures);
        std::exit(1);
    }
    int written = 0;
    while (dirent *e = readdir(d)) {
        // t.<dtype>[_variant].<AxB...>.orig.f32
        std::string name = e->d_name;
        if (name.size() < 9 || name.compare(name.size() - 9, 9, ".orig.f32") != 0) continue;
        size_t a = name.find('.'), b = name.find('.', a + 1), c = name.find('.', b + 1);
        std::string dtype = name.substr(a + 1, b - a - 1), dims = name.substr(b + 1, c - b - 1);
        for (const char *variant : {"_special", "_ovl", "_ef"})
            if (size_t at = dtype.find(variant); at != std::string::npos) dtype.erase(at);
        std::vector<uint64_t> shape;
        for (size_t p = 0; p <= dims.size();) {
            size_t q = dims.find('x', p);
            shape.push_back(std::stoull(dims.substr(p, q == std::string::npos ? std::string::npos : q - p)));
            if (q == std::string::npos) break;
            p = q + 1;
        }
        std::ifstream in(std::string(fixtures) + "/" + name, std::ios::binary);
        std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::vector<float> src(raw.size() / 4);
        std::memcpy(src.data(), raw.data(), src.size() * 4);
        for (int32_t id = 0; id < 256; ++id) {
            const cmf::CodecEntry *codec = rt().codec(id);
            if (!codec || dtype != codec->vt.name || !codec->vt.quantize) continue;
            std::string payload;
            cmf_byte_sink sink{sizeof(cmf_byte_sink), 0, &payload, [](void *u, const void *p, size_t n) -> cmf_error * {
                                   static_cast<std::string *>(u)->append(static_cast<const char *>(p), n);
                                   return nullptr;
                               }};
            cmf_quantize_params qp{};
            qp.struct_size = sizeof qp;
            qp.options = "";
            if (cmf_error *err = codec->vt.quantize(codec->ctx, uint32_t(shape.size()), shape.data(), src.data(), &qp, &sink)) {
                cmf_error_free(err);
                continue;
            }
            std::string seed(1, char(id));
            seed += char(shape.size());
            for (uint64_t s : shape) {
                uint32_t s32 = uint32_t(s);
                seed.append(reinterpret_cast<const char *>(&s32), 4);
            }
            seed += payload;
            std::ofstream(std::string(dir) + "/" + name.substr(0, name.size() - 9) + ".seed", std::ios::binary) << seed;
            ++written;
        }
    }
    closedir(d);
    std::fprintf(stderr, "fuzz_codecs: %d seeds written to %s\n", written, dir);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    if (const char *dir = std::getenv("CMF_FUZZ_WRITE_SEEDS")) {
        const char *fixtures = std::getenv("CMF_FUZZ_FIXTURES");
        write_seeds(dir, fixtures ? fixtures : "tests/fixtures/upstream/sample.f32dir");
        std::exit(0);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    cmf::container::TensorRec t;
    t.name = "fuzz";
    t.dtype = data[0];
    t.ndim = data[1] % 5;
    size_t at = 2;
    uint64_t elements = 1;
    for (uint32_t d = 0; d < t.ndim; ++d) {
        if (size < at + 4) return 0;
        uint32_t dim;
        std::memcpy(&dim, data + at, 4);
        at += 4;
        t.shape[d] = dim;
        elements *= dim;
        if (elements > (1u << 16)) return 0;
    }
    const cmf::CodecEntry *codec = rt().codec(t.dtype);
    if (!codec) return 0;
    Payload p(data + at, size - at);
    t.data = p.p;
    t.nbytes = p.n;
    try {
        cmf::container::check_tensor_payload(rt(), t);
    } catch (const cmf::Error &) {
        return 0;
    }
    exercise(*codec, t);
    return 0;
}
