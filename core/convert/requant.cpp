#include "convert/requant.hpp"

#include "common/byte_views.hpp"
#include "common/error.hpp"
#include "container/in_place.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"
#include "container/writer.hpp"
#include "convert/dtype_policy.hpp"
#include "plugin_host/runtime.hpp"

#include <boost/json.hpp>

#include <cmf/cmf_plugin.h>

#include <algorithm>

namespace cmf::convert {

namespace bj = boost::json;

std::vector<uint8_t> encode_tensor(Runtime &rt, const std::string &name, int32_t dtype, const std::string &options, uint32_t ndim,
                                   const uint64_t *shape, const float *values) {
    const CodecEntry *codec = rt.codec(dtype);
    if (!codec || !codec->vt.quantize) throw Error(CMF_ERR_UNKNOWN_DTYPE, "tensor \"" + name + "\": no codec can write " + dtype_name(dtype));
    std::vector<uint8_t> bytes;
    cmf_quantize_params params{sizeof(cmf_quantize_params), 0, options.empty() ? nullptr : options.c_str(), nullptr, 0};
    cmf_byte_sink bs = vector_sink(bytes);
    throw_if_error(codec->vt.quantize(codec->ctx, ndim, shape, values, &params, &bs), "tensor \"" + name + "\" (" + dtype_name(dtype) + ")");
    return bytes;
}

namespace {

uint64_t elements_of(const container::TensorRec &t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
    return n;
}

// The index of `t` in its own shard's directory (what an in-place record is).
uint64_t record_in_shard(const container::Model &m, const container::TensorRec &t) {
    const auto &recs = m.shards()[t.shard].tensors;
    for (uint64_t i = 0; i < recs.size(); ++i)
        if (recs[i].name == t.name) return i;
    throw Error(CMF_ERR_INTERNAL, "tensor \"" + t.name + "\" is not in its shard's directory");
}

RequantStats requant_in_place(Runtime &rt, const RequantOptions &opts, const QuantPolicy &policy) {
    container::Model m;
    container::Model::open(m, rt, opts.input, 0);
    const auto &ts = m.tensors();
    bool has_experts = false;
    for (const auto &t : ts) has_experts = has_experts || t.name.find(".mlp.experts.") != std::string::npos;
    struct Job {
        size_t index;
        DtypeChoice to;
    };
    std::vector<Job> jobs;
    std::string too_big;
    size_t n_too_big = 0;
    // Pass 1: every new payload must fit its slot before anything is written.
    for (size_t i = 0; i < ts.size(); ++i) {
        const auto &t = ts[i];
        if (!opts.only.empty() && !name_matches(opts.only, t.name)) continue;
        DtypeChoice c = policy.choose(t.name, std::vector<uint64_t>(t.shape, t.shape + t.ndim), has_experts);
        if (c.dtype == t.dtype) continue;
        const CodecEntry *codec = rt.codec(c.dtype);
        if (!codec || !codec->vt.quantize) throw Error(CMF_ERR_UNKNOWN_DTYPE, "requant: no codec can write " + dtype_name(c.dtype));
        uint64_t size = CMF_SIZE_VARIABLE;
        if (codec->vt.expected_size) throw_if_error(codec->vt.expected_size(codec->ctx, t.ndim, t.shape, &size), "tensor \"" + t.name + "\"");
        if (size == CMF_SIZE_VARIABLE) {
            std::vector<float> f32(elements_of(t));
            m.dequantize(i, 0, t.ndim >= 2 ? t.shape[0] : 1, f32.data(), f32.size());
            size = encode_tensor(rt, t.name, c.dtype, c.options, t.ndim, t.shape, f32.data()).size();
        }
        if (size > t.nbytes) {
            if (n_too_big++ < 3)
                too_big += (too_big.empty() ? "" : "; ") + t.name + " " + std::to_string(t.nbytes) + " -> " + std::to_string(size) + " bytes (" +
                           dtype_name(t.dtype) + " -> " + dtype_name(c.dtype) + ")";
            continue;
        }
        jobs.push_back(Job{i, std::move(c)});
    }
    if (n_too_big)
        throw Error(CMF_ERR_BOUNDS, "requant --in-place: " + std::to_string(n_too_big) + " tensor(s) would not fit their slots (" + too_big +
                                        (n_too_big > 3 ? "; ..." : "") + "); nothing was written: use --output");
    // Pass 2: one journaled rewrite per tensor, so a crash loses at most the
    // tensor in flight (and the next open completes it).
    RequantStats st;
    st.tensors = ts.size();
    uint64_t total = 0, done = 0;
    for (const Job &j : jobs) total += ts[j.index].nbytes;
    for (const Job &j : jobs) {
        const auto &t = ts[j.index];
        std::vector<float> f32(elements_of(t));
        m.dequantize(j.index, 0, t.ndim >= 2 ? t.shape[0] : 1, f32.data(), f32.size());
        container::SlotPatch p{record_in_shard(m, t), j.to.dtype, encode_tensor(rt, t.name, j.to.dtype, j.to.options, t.ndim, t.shape, f32.data())};
        container::rewrite_in_place(m.shards()[t.shard].file->path(), {p});
        ++st.reencoded;
        done += t.nbytes;
        if (opts.on_progress) opts.on_progress(st.reencoded, jobs.size(), done, total);
    }
    return st;
}

}  // namespace

RequantStats requant(Runtime &rt, const RequantOptions &opts) {
    if (opts.input.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "requant: an input path is required");
    if (opts.in_place && !opts.output.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "requant: --in-place and an output path exclude each other");
    if (!opts.in_place && opts.output.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "requant: an output path (or in-place) is required");
    QuantPolicy policy(opts.quant);  // validates the name first
    if (opts.in_place) return requant_in_place(rt, opts, policy);
    container::Model m;
    container::Model::open(m, rt, opts.input, 0);

    bj::error_code ec;
    bj::value header = bj::parse(m.header_text(), ec);
    if (ec || !header.is_object()) throw Error(CMF_ERR_PARSE, opts.input + ": header is not a JSON object");
    header.as_object().erase("section_hashes");
    header.as_object().erase("shard");
    // With --only the file mixes dtypes; quant_type keeps naming the bulk.
    if (opts.only.empty()) header.as_object()["quant_type"] = header_quant_type(policy.base());

    std::optional<std::string> task;
    if (!m.masks().empty()) task = m.default_task();
    container::Writer w(rt, opts.output, container::json::emit_header(header), opts.shard_max_bytes, task);

    RequantStats st;
    uint64_t total_bytes = 0, done_bytes = 0;
    for (auto &t : m.tensors()) total_bytes += t.nbytes;
    std::vector<std::vector<uint8_t>> owned;  // the writer borrows payloads until finish
    owned.reserve(m.tensors().size());
    const auto &ts = m.tensors();
    const bool has_experts = std::any_of(ts.begin(), ts.end(), [](const auto &t) { return is_routed_expert(t.name); });
    for (size_t i = 0; i < ts.size(); ++i) {
        const auto &t = ts[i];
        std::vector<uint64_t> shape(t.shape, t.shape + t.ndim);
        int32_t dtype = t.dtype;
        std::string options;
        if (opts.only.empty() || name_matches(opts.only, t.name)) {
            DtypeChoice c = policy.choose(t.name, shape, has_experts);
            dtype = c.dtype;
            options = std::move(c.options);
        }
        // f32 tensors the policy keeps whole (e.g. tid2eid) and unchanged dtypes are copied byte for byte.
        const uint8_t *bytes = m.verified(t);
        if (dtype == t.dtype) {
            w.add_tensor(t.name, t.dtype, t.ndim, t.shape, bytes, t.nbytes);
        } else {
            uint64_t count = 1;
            for (uint32_t d = 0; d < t.ndim; ++d) count *= t.shape[d];
            std::vector<float> f32(count);
            const uint64_t rows = t.ndim >= 2 ? t.shape[0] : 1;
            m.dequantize(i, 0, rows, f32.data(), count);
            owned.push_back(encode_tensor(rt, t.name, dtype, options, t.ndim, t.shape, f32.data()));
            w.add_tensor(t.name, dtype, t.ndim, t.shape, owned.back().data(), owned.back().size());
            ++st.reencoded;
        }
        ++st.tensors;
        done_bytes += t.nbytes;
        if (opts.on_progress) opts.on_progress(i + 1, ts.size(), done_bytes, total_bytes);
    }
    container::copy_masks_and_vocab(m, w);
    w.finish();
    return st;
}

}  // namespace cmf::convert
