// The CPU backend plugin: the default compute path. Weights stay where the
// file mapping has them (zero copy); every parallel loop runs on the
// runtime's pool through host->parallel_for.
//
// How a matmul over a stored weight is computed, first match wins:
//  1. this backend's own kernel for the dtype (f32 today);
//  2. the codec's matmul_rows kernel;
//  3. dequantize tiles of rows into a per-chunk buffer, then the f32 kernel.
#include "kernels.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <memory>
#include <string>
#include <vector>

struct cmf_backend_weight {
    cmf_tensor_view view;
    const cmf_codec_vt *codec;  // NULL for dtypes with a native kernel
    void *codec_ctx;
    uint64_t rows;
    uint64_t cols;
};

namespace {

using cmf::sdk::Error;

struct Backend {
    const cmf_host_api *host;
    std::string description;
    cmf_backend_vt vt;
};

Backend *as_backend(void *ctx) { return static_cast<Backend *>(ctx); }

cmf_error *weight_bind(void *ctx, const cmf_tensor_view *t, cmf_backend_weight **out) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (t == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "weight_bind: NULL argument");
        if (t->ndim != 2) throw Error(CMF_ERR_UNSUPPORTED, "weight_bind: a matmul weight must be 2-D");
        auto w = std::make_unique<cmf_backend_weight>();
        w->view = *t;
        w->rows = t->shape[0];
        w->cols = t->shape[1];
        w->codec = nullptr;
        w->codec_ctx = nullptr;
        if (t->dtype != CMF_DTYPE_F32) {
            w->codec = be->host->find_codec(be->host->host_ctx, t->dtype, &w->codec_ctx);
            if (w->codec == nullptr)
                throw Error(CMF_ERR_UNKNOWN_DTYPE, "no codec plugin provides dtype " + std::to_string(t->dtype));
        } else if (t->nbytes != w->rows * w->cols * sizeof(float)) {
            throw Error(CMF_ERR_BOUNDS, "weight_bind: f32 payload size does not match its shape");
        }
        *out = w.release();
    });
}

void weight_free(void *, cmf_backend_weight *w) { delete w; }

struct MatmulJob {
    const cmf_backend_weight *w;
    const float *x;
    uint64_t n_batch;
    float *y;
    const cmf_host_api *host;
    cmf_error *error;  // first error of any chunk (see record_error)
};

void record_error(MatmulJob *job, cmf_error *e) {
    // Chunks run concurrently: keep the first error, release the others.
    cmf_error *expected = nullptr;
    if (!__atomic_compare_exchange_n(&job->error, &expected, e, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        job->host->error_free(e);
}

void matmul_chunk_native(void *user, uint64_t r0, uint64_t r1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    cmf::cpu::kernels().matmul_f32(static_cast<const float *>(w->view.data), w->cols, job->x, w->cols, job->n_batch,
                                   r0, r1, job->y, w->rows);
}

void matmul_chunk_codec(void *user, uint64_t r0, uint64_t r1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    if (cmf_error *e = w->codec->matmul_rows(w->codec_ctx, &w->view, job->x, w->cols, job->n_batch, r0, r1, job->y,
                                             w->rows))
        record_error(job, e);
}

void matmul_chunk_dequant(void *user, uint64_t r0, uint64_t r1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    constexpr uint64_t kTileRows = 16;
    std::vector<float> tile(kTileRows * w->cols);
    for (uint64_t t0 = r0; t0 < r1; t0 += kTileRows) {
        uint64_t t1 = std::min(r1, t0 + kTileRows);
        if (cmf_error *e = w->codec->dequantize_rows(w->codec_ctx, &w->view, t0, t1, tile.data())) {
            record_error(job, e);
            return;
        }
        // The tile holds rows t0..t1; write them to their columns of y.
        cmf::cpu::kernels().matmul_f32(tile.data() - t0 * w->cols, w->cols, job->x, w->cols, job->n_batch, t0, t1,
                                       job->y, w->rows);
    }
}

cmf_error *matmul(void *ctx, const cmf_backend_weight *w, const float *x, uint64_t n_batch, float *y) {
    Backend *be = as_backend(ctx);
    if (w == nullptr || x == nullptr || y == nullptr)
        return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul: NULL argument");
    MatmulJob job{w, x, n_batch, y, be->host, nullptr};
    cmf_range_fn fn = matmul_chunk_native;
    if (w->codec != nullptr) fn = w->codec->matmul_rows ? matmul_chunk_codec : matmul_chunk_dequant;
    // Enough rows per chunk to amortise scheduling, few enough to balance.
    uint64_t grain = std::max<uint64_t>(1, 16384 / std::max<uint64_t>(1, w->cols));
    be->host->parallel_for(be->host->host_ctx, 0, w->rows, grain, fn, &job);
    return job.error;
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "cpu backend needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto be = std::make_unique<Backend>();
    be->host = host;
    be->description = std::string("x86-64 CPU, kernels: ") + cmf::cpu::kernels().isa;
    cmf_backend_vt &vt = be->vt;
    vt = cmf_backend_vt{};
    vt.struct_size = sizeof vt;
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "cpu";
    vt.version = CMF_CPU_VERSION;
    vt.description = be->description.c_str();
    vt.weight_bind = weight_bind;
    vt.weight_free = weight_free;
    vt.matmul = matmul;
    if (cmf_error *e = host->register_backend(reg, &be->vt, be.get())) return e;
    *plugin_state = be.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) { delete static_cast<Backend *>(plugin_state); }
