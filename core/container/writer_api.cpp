// C entry points of the writer section of cmf.h.
#include "common/c_api_util.hpp"
#include "container/writer.hpp"
#include "plugin_host/runtime.hpp"

#include <boost/json.hpp>

#include <cmf/cmf.h>

#include <memory>

using cmf::Error;
using cmf::guard;
using namespace cmf::container;

struct cmf_writer {
    std::unique_ptr<TensorWriter> w;
};

extern "C" {

CMF_API void cmf_writer_options_init(cmf_writer_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}
CMF_API void cmf_mask_spec_init(cmf_mask_spec *s) {
    if (!s) return;
    std::memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
}

CMF_API cmf_error *cmf_writer_create(cmf_runtime *rt, const char *path, const char *header_json, size_t header_len,
                                     const cmf_writer_options *opts, cmf_writer **out) {
    return guard([&] {
        if (!rt || !path || !header_json || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_writer_create: NULL argument");
        cmf_writer_options o = cmf::capi::copy_in(opts, cmf_writer_options_init);
        std::optional<std::string> task;
        if (o.default_task) task = o.default_task;
        if (o.flags & ~CMF_WRITER_STREAM)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_writer_create: unknown flags " + std::to_string(o.flags & ~CMF_WRITER_STREAM));
        auto w = std::make_unique<cmf_writer>();
        const std::string header(header_json, header_len);
        if (o.flags & CMF_WRITER_STREAM)
            w->w = std::make_unique<StreamWriter>(*rt, path, header, o.expected_tensors, o.shard_max_bytes, task);
        else
            w->w = std::make_unique<Writer>(*rt, path, header, o.shard_max_bytes, task);
        *out = w.release();
    });
}

CMF_API cmf_error *cmf_writer_open_append(cmf_runtime *rt, const char *path, const char *header_json, size_t header_len,
                                          cmf_writer **out) {
    return guard([&] {
        if (!rt || !path || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_writer_open_append: NULL argument");
        std::string h = header_json ? std::string(header_json, header_len) : std::string();
        auto w = std::make_unique<cmf_writer>();
        w->w = std::make_unique<Writer>(Writer::for_append(*rt, path, header_json ? &h : nullptr));
        *out = w.release();
    });
}

CMF_API cmf_error *cmf_writer_add_tensor(cmf_writer *w, const char *name, int32_t dtype, uint32_t ndim,
                                         const uint64_t *shape, const void *data, uint64_t nbytes) {
    return guard([&] {
        if (!w || !name || (ndim > 0 && !shape)) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_writer_add_tensor: NULL argument");
        w->w->add_tensor(name, dtype, ndim, shape, data, nbytes);
    });
}

CMF_API cmf_error *cmf_writer_add_mask(cmf_writer *w, const cmf_mask_spec *spec) {
    return guard([&] {
        if (!w || !spec) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_writer_add_mask: NULL argument");
        cmf_mask_spec s = cmf::capi::copy_in(spec, cmf_mask_spec_init);
        if (!s.name) throw Error(CMF_ERR_INVALID_ARGUMENT, "mask without a name");
        if (s.blob_len > 0 && !s.blob) throw Error(CMF_ERR_INVALID_ARGUMENT, "mask '" + std::string(s.name) + "': NULL blob");
        PendingMask m;
        m.task_id = s.task_id;
        m.name = s.name;
        if (s.description) m.description = s.description;
        if (s.parent) m.parent = s.parent;
        if (s.quality_json) {
            boost::system::error_code ec;
            boost::json::value q = boost::json::parse(s.quality_json, ec);
            if (ec || !q.is_object()) throw Error(CMF_ERR_PARSE, "mask '" + m.name + "': quality_json is not a JSON object");
            m.quality = std::move(q);
        }
        m.sparsity = s.sparsity;
        m.priority = s.priority ? s.priority : "Normal";
        if (m.priority != "Fallback" && m.priority != "Normal" && m.priority != "Primary")
            throw Error(CMF_ERR_INVALID_ARGUMENT, "mask '" + m.name + "': priority must be Fallback, Normal or Primary");
        m.has_hot_pack = s.has_hot_pack != 0;
        m.has_expert_fields = s.has_expert_fields != 0;
        const uint8_t *b = static_cast<const uint8_t *>(s.blob);
        m.blob.assign(b, b + s.blob_len);
        w->w->add_mask(std::move(m));
    });
}

CMF_API cmf_error *cmf_writer_set_vocab(cmf_writer *w, const void *data, uint64_t len) {
    return guard([&] {
        if (!w) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_writer_set_vocab: NULL writer");
        w->w->set_vocab(data, len);
    });
}

CMF_API cmf_error *cmf_writer_finish(cmf_writer *w) {
    return guard([&] {
        if (!w) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_writer_finish: NULL writer");
        w->w->finish();
    });
}

CMF_API void cmf_writer_free(cmf_writer *w) { delete w; }

CMF_API cmf_error *cmf_compact(cmf_runtime *rt, const char *in_path, const char *out_path) {
    return guard([&] {
        if (!rt || !in_path || !out_path) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_compact: NULL argument");
        compact(*rt, in_path, out_path);
    });
}

}  // extern "C"
