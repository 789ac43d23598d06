// C entry points of the convert section of cmf.h: the converter pipeline
// into the container writer, and re-encoding of an existing file.
#include "common/c_api_util.hpp"
#include "convert/container_sink.hpp"
#include "convert/convert.hpp"
#include "convert/gguf_import.hpp"
#include "convert/patch.hpp"
#include "convert/pipeline_pack.hpp"
#include "convert/requant.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <filesystem>

using cmf::Error;
using cmf::guard;

namespace {
std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> progress_fn(cmf_convert_progress_fn fn, void *user) {
    if (!fn) return {};
    return [fn, user](uint64_t t, uint64_t tt, uint64_t b, uint64_t bt) { fn(user, t, tt, b, bt); };
}
}  // namespace

extern "C" {

CMF_API void cmf_convert_options_init(cmf_convert_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API void cmf_requant_options_init(cmf_requant_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API cmf_error *cmf_convert(cmf_runtime *rt, const cmf_convert_options *opts) {
    return guard([&] {
        if (!rt || !opts) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_convert: NULL argument");
        cmf_convert_options o = cmf::capi::copy_in(opts, cmf_convert_options_init);
        if (!o.model_dir || !*o.model_dir) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_convert: no model directory given");
        if (!o.output || !*o.output) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_convert: no output path given");
        std::error_code ec;
        if (!std::filesystem::is_directory(o.model_dir, ec))
            throw Error(CMF_ERR_FILE_NOT_FOUND, std::string("model directory \"") + o.model_dir + "\" does not exist or is not a directory");
        cmf::convert::ConvertOptions c;
        c.model_dir = o.model_dir;
        if (o.quant) c.quant = o.quant;
        if (o.quant_map) c.quant_map = o.quant_map;
        if (o.defrag_dir) c.defrag_dir = o.defrag_dir;
        // Fail on a bad --quant / --quant-map before reading any tensor.
        cmf::convert::QuantPolicy check(c.quant, c.quant_map);
        c.on_progress = progress_fn(o.progress, o.progress_user);
        cmf::convert::ContainerSink sink(*rt, o.output, o.shard_max_bytes);
        cmf::convert::convert_checkpoint(*rt, c, sink);
    });
}

CMF_API cmf_error *cmf_imagine_pack(cmf_runtime *rt, const cmf_convert_options *opts) {
    return guard([&] {
        if (!rt || !opts) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_imagine_pack: NULL argument");
        cmf_convert_options o = cmf::capi::copy_in(opts, cmf_convert_options_init);
        if (!o.model_dir || !*o.model_dir) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_imagine_pack: no pipeline directory given");
        if (o.defrag_dir) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_imagine_pack: defrag_dir must be NULL (a pipeline has no dense FFN to defrag)");
        if (!o.output || !*o.output) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_imagine_pack: no output path given");
        std::error_code ec;
        if (!std::filesystem::is_directory(o.model_dir, ec))
            throw Error(CMF_ERR_FILE_NOT_FOUND, std::string("pipeline directory \"") + o.model_dir + "\" does not exist or is not a directory");
        cmf::convert::ConvertOptions c;
        c.model_dir = o.model_dir;
        if (o.quant) c.quant = o.quant;
        if (o.quant_map) c.quant_map = o.quant_map;
        c.tool = "cmfhost imagine-pack";
        c.on_progress = progress_fn(o.progress, o.progress_user);
        cmf::convert::ContainerSink sink(*rt, o.output, o.shard_max_bytes);
        cmf::convert::pack_pipeline(*rt, c, sink);
    });
}

CMF_API cmf_error *cmf_requant(cmf_runtime *rt, const cmf_requant_options *opts) {
    return guard([&] {
        if (!rt || !opts) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_requant: NULL argument");
        cmf_requant_options o = cmf::capi::copy_in(opts, cmf_requant_options_init);
        if (o.flags & ~CMF_REQUANT_IN_PLACE) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_requant: unknown flags");
        const bool in_place = o.flags & CMF_REQUANT_IN_PLACE;
        if (!o.input || !o.quant || in_place == (o.output != nullptr))
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_requant: input, quant and either output or CMF_REQUANT_IN_PLACE are required");
        std::error_code ec;
        if (o.output && std::filesystem::exists(o.output, ec) && std::filesystem::equivalent(o.input, o.output, ec))
            throw Error(CMF_ERR_INVALID_ARGUMENT, std::string("cmf_requant: output \"") + o.output + "\" is the input file");
        cmf::convert::RequantOptions r;
        r.input = o.input;
        r.in_place = in_place;
        if (o.output) r.output = o.output;
        r.quant = o.quant;
        if (o.only) r.only = o.only;
        r.shard_max_bytes = o.shard_max_bytes;
        r.on_progress = progress_fn(o.progress, o.progress_user);
        cmf::convert::requant(*rt, r);
    });
}

CMF_API void cmf_import_gguf_options_init(cmf_import_gguf_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API cmf_error *cmf_import_gguf(cmf_runtime *rt, const cmf_import_gguf_options *opts) {
    return guard([&] {
        if (!rt || !opts) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_import_gguf: NULL argument");
        cmf_import_gguf_options o = cmf::capi::copy_in(opts, cmf_import_gguf_options_init);
        if (!o.gguf || !*o.gguf) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_import_gguf: no GGUF file given");
        if (!o.output || !*o.output) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_import_gguf: no output path given");
        cmf::convert::ConvertOptions c;
        c.model_dir = o.gguf;
        c.quant = o.quant && *o.quant ? o.quant : "keep";
        if (o.quant_map) c.quant_map = o.quant_map;
        c.tool = "cmfhost import-gguf";
        // Fail on a bad --quant / --quant-map before reading the file.
        if (c.quant != "keep") cmf::convert::QuantPolicy check(c.quant, c.quant_map);
        else cmf::convert::QuantPolicy check("f16", c.quant_map);
        c.on_progress = progress_fn(o.progress, o.progress_user);
        cmf::convert::ContainerSink sink(*rt, o.output, o.shard_max_bytes);
        cmf::convert::SourceModel src;
        try {
            src = cmf::convert::load_gguf(*rt, o.gguf);
        } catch (...) {
            sink.abort();
            throw;
        }
        cmf::convert::convert_source(*rt, src, c, sink);
    });
}

CMF_API void cmf_patch_tensor_init(cmf_patch_tensor *p) {
    if (!p) return;
    std::memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
}

CMF_API void cmf_patch_options_init(cmf_patch_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API cmf_error *cmf_patch_tensors(cmf_runtime *rt, const cmf_patch_options *opts, const cmf_patch_tensor *patches, size_t n_patches) {
    return guard([&] {
        if (!rt || !opts || (n_patches && !patches)) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_patch_tensors: NULL argument");
        cmf_patch_options o = cmf::capi::copy_in(opts, cmf_patch_options_init);
        if (!o.model || !*o.model) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_patch_tensors: no model given");
        cmf::convert::PatchOptions p;
        p.model = o.model;
        if (o.output) p.output = o.output;
        if (o.dtype) p.dtype = o.dtype;
        std::vector<cmf::convert::PatchValues> values;
        for (size_t i = 0; i < n_patches; ++i) {
            cmf_patch_tensor t = cmf::capi::copy_in(&patches[i], cmf_patch_tensor_init);
            if (!t.name || (t.count && !t.values)) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_patch_tensors: patch " + std::to_string(i) + " lacks a name or values");
            values.push_back({t.name, t.values, t.count});
        }
        cmf::convert::patch_tensors(*rt, p, values);
    });
}

}  // extern "C"
