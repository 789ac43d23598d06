// The codecs plugin: registers every Dtype of this module as a cmf codec.
// Each init (one per runtime) gets its own state, so several runtimes in one
// process each hold their own host table.
#include "dtype.hpp"
#include "dtypes/common.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <algorithm>
#include <memory>
#include <vector>

namespace {

using cmf::codecs::Dtype;

struct PluginState;

struct CodecCtx {
    PluginState *state;
    const Dtype *dtype;
    cmf_codec_vt vt;
};

struct PluginState {
    const cmf_host_api *host;
    std::vector<std::unique_ptr<Dtype>> dtypes;
    std::vector<std::unique_ptr<CodecCtx>> codecs;
};

CodecCtx *as_codec(void *ctx) { return static_cast<CodecCtx *>(ctx); }

cmf_error *vt_expected_size(void *ctx, uint32_t ndim, const uint64_t *shape, uint64_t *out) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (ndim > CMF_MAX_DIMS) cmf::codecs::fail(CMF_ERR_PARSE, "ndim > 6");
        *out = c->dtype->expected_size(cmf::codecs::Shape(shape, ndim));
    });
}

cmf_error *vt_validate(void *ctx, const cmf_tensor_view *t) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] { c->dtype->validate(*t); });
}

cmf_error *vt_validate_facts(void *ctx, const cmf_tensor_view *t, uint32_t *facts) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (t == nullptr || facts == nullptr) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "validate_facts: NULL argument");
        *facts = 0;
        *facts = c->dtype->validate_facts(*t);
    });
}

cmf_error *vt_dequantize_rows(void *ctx, const cmf_tensor_view *t, uint64_t r0, uint64_t r1, float *dst) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (r0 > r1 || r1 > cmf::sdk::rows_of(*t)) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "row range out of bounds");
        // No rows, no work: codecs size per-row scratch by the row length,
        // which a file may set to billions in a tensor of zero rows.
        if (r0 == r1) return;
        c->dtype->dequantize_rows(*t, r0, r1, dst);
    });
}

cmf_error *vt_quantize(void *ctx, uint32_t ndim, const uint64_t *shape, const float *src,
                       const cmf_quantize_params *params, const cmf_byte_sink *out) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (ndim > CMF_MAX_DIMS) cmf::codecs::fail(CMF_ERR_PARSE, "ndim > 6");
        std::vector<uint8_t> bytes;
        c->dtype->quantize(cmf::codecs::Shape(shape, ndim), src, params, bytes);
        cmf::sdk::sink_append(out, bytes.data(), bytes.size());
    });
}

// Row-chunked encoding for the row-separable layouts (Dtype::row_sections):
// the rows are quantized as a tensor of their own and that payload is split
// into its sections, which equals the whole tensor's sections restricted to
// these rows because each row encodes on its own.
cmf_error *vt_quantize_rows(void *ctx, uint32_t ndim, const uint64_t *shape, uint64_t r0, uint64_t r1,
                            const float *src, const cmf_quantize_params *params, const cmf_byte_sink *out,
                            uint32_t *n_sections) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (ndim > CMF_MAX_DIMS) cmf::codecs::fail(CMF_ERR_PARSE, "ndim > 6");
        if (ndim == 0) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "quantize_rows needs a tensor with rows");
        const cmf::codecs::Shape whole(shape, ndim);
        const size_t n = c->dtype->row_sections(whole).size();
        *n_sections = n <= CMF_MAX_ROW_SECTIONS ? static_cast<uint32_t>(n) : 0;
        if (out == nullptr || *n_sections == 0) return;
        if (r0 >= r1 || r1 > shape[0]) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "row range out of bounds");
        uint64_t sub_shape[CMF_MAX_DIMS];
        std::copy(shape, shape + ndim, sub_shape);
        sub_shape[0] = r1 - r0;
        const cmf::codecs::Shape sub(sub_shape, ndim);
        std::vector<uint8_t> bytes;
        c->dtype->quantize(sub, src, params, bytes);
        const std::vector<uint64_t> sizes = c->dtype->row_sections(sub);
        uint64_t at = 0;
        for (uint64_t s : sizes) at += s;
        if (sizes.size() != n || at != bytes.size())
            cmf::codecs::fail(CMF_ERR_INTERNAL, std::string(c->dtype->name()) + ": row sections do not add up to the payload");
        at = 0;
        for (size_t k = 0; k < n; ++k) {
            cmf::sdk::sink_append(&out[k], bytes.data() + at, sizes[k]);
            at += sizes[k];
        }
    });
}

cmf_error *vt_matmul_rows(void *ctx, const cmf_tensor_view *w, const float *x, uint64_t ldx, uint64_t n_batch,
                          uint64_t r0, uint64_t r1, float *y, uint64_t ldy) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (r0 == r1 || n_batch == 0) return;  // no work (see vt_dequantize_rows)
        c->dtype->matmul_rows(*w, x, ldx, n_batch, r0, r1, y, ldy);
    });
}

cmf_error *vt_matmul_rows_x(void *ctx, const cmf_tensor_view *w, const float *x, uint64_t ldx, uint64_t n_batch,
                            uint64_t r0, uint64_t r1, float *y, uint64_t ldy, uint64_t x_id) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (r0 == r1 || n_batch == 0) return;  // no work (see vt_dequantize_rows)
        cmf::codecs::XIdScope scope(x_id, x);
        c->dtype->matmul_rows(*w, x, ldx, n_batch, r0, r1, y, ldy);
    });
}

// The int8 view for int8 GEMMs (cmf_codec_vt.int8_rows); codes == scales
// == NULL asks whether this tensor has one.
cmf_error *vt_int8_rows(void *ctx, const cmf_tensor_view *t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (t == nullptr) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "int8_rows: NULL tensor");
        if (t->ndim != 2) cmf::codecs::fail(CMF_ERR_UNSUPPORTED, "int8_rows: the tensor is not 2-D");
        if (!c->dtype->int8_view(*t))
            cmf::codecs::fail(CMF_ERR_UNSUPPORTED,
                              std::string(c->dtype->name()) + ": this tensor has no exact int8 view");
        if (codes == nullptr && scales == nullptr) return;
        if (codes == nullptr || scales == nullptr) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "int8_rows: NULL output");
        if (r0 > r1 || r1 > t->shape[0]) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "int8_rows: row range out of bounds");
        if (r0 == r1) return;  // no work (see vt_dequantize_rows)
        c->dtype->int8_rows(*t, r0, r1, codes, scales);
    });
}

// Column selection (cmf_codec_vt.select_columns); out == NULL asks for the
// granularity only.
cmf_error *vt_select_columns(void *ctx, const cmf_tensor_view *t, const uint64_t *blocks, uint64_t n_blocks,
                             const cmf_byte_sink *out, uint64_t *block_cols) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (t == nullptr || block_cols == nullptr) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "select_columns: NULL argument");
        const uint64_t g = t->ndim == 2 ? c->dtype->column_block(*t) : 0;
        *block_cols = g;
        if (out == nullptr) return;
        if (g == 0)
            cmf::codecs::fail(CMF_ERR_UNSUPPORTED, std::string(c->dtype->name()) + ": cannot select columns of this tensor");
        if (n_blocks > 0 && blocks == nullptr) cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "select_columns: NULL blocks");
        const uint64_t nb = t->shape[1] / g;
        for (uint64_t i = 0; i < n_blocks; ++i)
            if (blocks[i] >= nb || (i > 0 && blocks[i] <= blocks[i - 1]))
                cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "select_columns: blocks must be ascending and below " + std::to_string(nb));
        c->dtype->validate(*t);
        std::vector<uint8_t> bytes;
        c->dtype->select_columns(*t, blocks, n_blocks, bytes);
        cmf::sdk::sink_append(out, bytes.data(), bytes.size());
    });
}

// A copy in a memory-only layout (cmf_codec_vt.decode_copy): its dtype and
// size, then (dst given) the copy itself.
cmf_error *vt_decode_copy(void *ctx, const cmf_tensor_view *t, void *dst, uint64_t dst_bytes, uint64_t *out_bytes,
                          int32_t *out_dtype) {
    CodecCtx *c = as_codec(ctx);
    return cmf::sdk::call(c->state->host, [&] {
        if (t == nullptr || out_bytes == nullptr || out_dtype == nullptr)
            cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "decode_copy: NULL argument");
        *out_dtype = -1;
        *out_bytes = 0;
        c->dtype->validate(*t);
        uint64_t n = 0;
        const int32_t id = c->dtype->decode_layout(*t, &n);
        if (id < 0 || dst == nullptr) {
            *out_dtype = id;
            *out_bytes = id < 0 ? 0 : n;
            return;
        }
        if (dst_bytes != n)
            cmf::codecs::fail(CMF_ERR_INVALID_ARGUMENT, "decode_copy: room for " + std::to_string(dst_bytes) +
                                                            " bytes, the copy has " + std::to_string(n));
        c->dtype->decode_copy(*t, static_cast<uint8_t *>(dst));
        *out_dtype = id;
        *out_bytes = n;
    });
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "codecs plugin needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto state = std::make_unique<PluginState>();
    state->host = host;
    cmf_error *err = cmf::sdk::call(host, [&] {
        state->dtypes = cmf::codecs::make_all_dtypes();
        for (const auto &d : state->dtypes) {
            auto c = std::make_unique<CodecCtx>();
            c->state = state.get();
            c->dtype = d.get();
            cmf_codec_vt &vt = c->vt;
            vt = cmf_codec_vt{};
            vt.struct_size = sizeof(cmf_codec_vt);
            vt.abi_version = CMF_PLUGIN_ABI_VERSION;
            vt.name = d->name();
            vt.version = CMF_CODECS_VERSION;
            vt.dtype_id = d->id();
            vt.flags = d->flags();
            vt.required_features = d->required_features();
            vt.expected_size = vt_expected_size;
            vt.validate = vt_validate;
            vt.dequantize_rows = vt_dequantize_rows;
            vt.quantize = d->can_quantize() ? vt_quantize : nullptr;
            vt.matmul_rows = d->has_matmul() ? vt_matmul_rows : nullptr;
            vt.quantize_rows = d->can_quantize() ? vt_quantize_rows : nullptr;
            vt.int8_rows = d->has_int8_rows() ? vt_int8_rows : nullptr;
            vt.matmul_rows_x = d->has_matmul() ? vt_matmul_rows_x : nullptr;
            vt.select_columns = vt_select_columns;
            vt.validate_facts = vt_validate_facts;
            vt.decode_copy = vt_decode_copy;
            state->codecs.push_back(std::move(c));
        }
    });
    if (err) return err;
    for (const auto &c : state->codecs)
        if (cmf_error *e = host->register_codec(reg, &c->vt, c.get())) return e;
    *plugin_state = state.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) {
    delete static_cast<PluginState *>(plugin_state);
}
