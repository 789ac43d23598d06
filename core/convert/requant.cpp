#include "convert/requant.hpp"

#include "common/byte_views.hpp"
#include "common/error.hpp"
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

RequantStats requant(Runtime &rt, const RequantOptions &opts) {
    if (opts.input.empty() || opts.output.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "requant: input and output paths are required");
    QuantPolicy policy(opts.quant);  // validates the name first
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
        if (dtype == t.dtype) {
            w.add_tensor(t.name, t.dtype, t.ndim, t.shape, t.data, t.nbytes);
        } else {
            uint64_t count = 1;
            for (uint32_t d = 0; d < t.ndim; ++d) count *= t.shape[d];
            std::vector<float> f32(count);
            const uint64_t rows = t.ndim >= 2 ? t.shape[0] : 1;
            m.dequantize(i, 0, rows, f32.data(), count);
            const CodecEntry *codec = rt.codec(dtype);
            if (!codec || !codec->vt.quantize)
                throw Error(CMF_ERR_UNKNOWN_DTYPE, "requant: no codec can write " + dtype_name(dtype));
            std::vector<uint8_t> bytes;
            cmf_quantize_params params{sizeof(cmf_quantize_params), 0, options.empty() ? nullptr : options.c_str(), nullptr, 0};
            cmf_byte_sink bs = vector_sink(bytes);
            throw_if_error(codec->vt.quantize(codec->ctx, t.ndim, t.shape, f32.data(), &params, &bs),
                           "tensor \"" + t.name + "\" (" + dtype_name(dtype) + ")");
            owned.push_back(std::move(bytes));
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
