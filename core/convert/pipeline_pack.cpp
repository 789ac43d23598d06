#include "convert/pipeline_pack.hpp"

#include "common/error.hpp"
#include "convert/plan.hpp"
#include "convert/safetensors.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/json_writer.hpp>

#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <functional>

namespace cmf::convert {

namespace fs = std::filesystem;
namespace dom = simdjson::dom;

namespace {

// What the large matrices of --quant become (F32: everything stays exact).
int32_t pack_level(const std::string &quant) {
    if (quant == "q8" || quant == "q8_row") return CMF_DTYPE_Q8_ROW;
    if (quant == "q4t" || quant == "q4_tiled" || quant == "q4") return CMF_DTYPE_Q4_TILED;
    if (quant == "f32") return CMF_DTYPE_F32;
    throw Error(CMF_ERR_INVALID_ARGUMENT, "imagine-pack --quant \"" + quant + "\": expected q8, q4t or f32");
}

// A 2-D matrix at `level`: q4t needs columns in whole 32-blocks, else q8_row.
int32_t matrix_dtype(int32_t level, const std::vector<uint64_t> &shape) {
    if (shape.size() != 2) return CMF_DTYPE_F32;
    if (level == CMF_DTYPE_Q4_TILED && shape[1] % 32 != 0) return CMF_DTYPE_Q8_ROW;
    return level;
}

bool ends_with(const std::string &s, const std::string &tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A component's output name and dtype for one of its tensors, or "" to drop it.
struct Pick {
    std::string name;
    int32_t dtype = CMF_DTYPE_F32;
};

Pick pick_te(const std::string &src, const std::vector<uint64_t> &shape, int32_t level) {
    const std::string n = src.rfind("model.", 0) == 0 ? src.substr(6) : src;
    if (n == "lm_head.weight") return {};  // the encoder never projects logits
    if (level == CMF_DTYPE_F32) return {"te." + n, CMF_DTYPE_F32};
    if (n == "embed_tokens.weight") return {"te." + n, matrix_dtype(CMF_DTYPE_Q8_ROW, shape)};
    if (ends_with(n, "_proj.weight")) return {"te." + n, matrix_dtype(level, shape)};
    return {"te." + n, CMF_DTYPE_F32};
}

Pick pick_dit(const std::string &n, const std::vector<uint64_t> &shape, int32_t level) {
    if (level == CMF_DTYPE_F32) return {"dit." + n, CMF_DTYPE_F32};
    if (ends_with(n, "norm1.linear.weight")) return {"dit." + n, matrix_dtype(CMF_DTYPE_Q8_ROW, shape)};  // adaLN
    const bool big = shape.size() == 2 && shape[1] >= 1024 &&
                     (n.find(".attn.to_") != std::string::npos || n.find(".feed_forward.") != std::string::npos);
    if (ends_with(n, "caption_embedder.1.weight") || big) return {"dit." + n, matrix_dtype(level, shape)};
    return {"dit." + n, CMF_DTYPE_F32};
}

Pick pick_vae(const std::string &n, const std::vector<uint64_t> &shape, int32_t level, bool post_quant_conv) {
    // The encoder half is not needed to make images.
    if (n.rfind("decoder.", 0) != 0 && !(post_quant_conv && n.rfind("post_quant_conv.", 0) == 0)) return {};
    if (shape.size() == 4 && level != CMF_DTYPE_F32) return {"vae." + n, CMF_DTYPE_F16};
    return {"vae." + n, CMF_DTYPE_F32};
}

std::string read_required(const fs::path &p, const char *what) {
    auto text = read_file_if_exists(p);
    if (!text) throw Error(CMF_ERR_FILE_NOT_FOUND, p.string() + ": not found (" + what + ")");
    return *text;
}

dom::element parse_json(dom::parser &parser, const std::string &text, const fs::path &p) {
    dom::element doc;
    if (auto err = parser.parse(text).get(doc)) throw Error(CMF_ERR_PARSE, p.string() + ": not valid JSON: " + simdjson::error_message(err));
    if (!doc.is_object()) throw Error(CMF_ERR_PARSE, p.string() + ": not a JSON object");
    return doc;
}

bool has(dom::element o, const char *key) {
    dom::element e;
    return !o[key].get(e) && !e.is_null();
}

uint64_t need_u64(dom::element o, const char *key, const fs::path &p) {
    uint64_t v;
    if (o[key].get_uint64().get(v)) throw Error(CMF_ERR_PARSE, p.string() + ": \"" + key + "\" must be a non-negative integer");
    return v;
}

// The header `arch` block: the text encoder's dimensions under the
// pipeline's arch name, as the original packer writes it.
std::string arch_json(const std::string &te_config, const fs::path &p) {
    dom::parser parser;
    const dom::element c = parse_json(parser, te_config, p);
    const uint64_t hidden = need_u64(c, "hidden_size", p), layers = need_u64(c, "num_hidden_layers", p);
    const uint64_t heads = need_u64(c, "num_attention_heads", p);
    // layer_types below has one entry per layer: a corrupt count must not
    // loop for hours (the arch plugins' import refuses the same).
    constexpr uint64_t kMaxLayers = 65536;
    if (layers > kMaxLayers)
        throw Error(CMF_ERR_PARSE, p.string() + ": \"num_hidden_layers\" " + std::to_string(layers) + " is beyond " +
                                       std::to_string(kMaxLayers));
    uint64_t kv = heads, head_dim = heads ? hidden / heads : 0;
    if (has(c, "num_key_value_heads")) kv = need_u64(c, "num_key_value_heads", p);
    if (has(c, "head_dim")) head_dim = need_u64(c, "head_dim", p);
    double eps = 1e-6;
    if (has(c, "rms_norm_eps") && c["rms_norm_eps"].get_double().get(eps))
        throw Error(CMF_ERR_PARSE, p.string() + ": \"rms_norm_eps\" must be a number");
    json::Writer w;
    w.begin_object();
    w.key("arch_name").string("lumina2-image");
    w.key("hidden_size").u64(hidden);
    w.key("intermediate_size").u64(need_u64(c, "intermediate_size", p));
    w.key("num_layers").u64(layers);
    w.key("num_attention_heads").u64(heads);
    w.key("num_kv_heads").u64(kv);
    w.key("head_dim").u64(head_dim);
    w.key("vocab_size").u64(need_u64(c, "vocab_size", p));
    w.key("layer_types").begin_array();
    for (uint64_t i = 0; i < layers; ++i) w.string("FullAttention");
    w.end_array();
    w.key("rms_norm_eps").f64(eps);
    w.key("max_position_embeddings").u64(need_u64(c, "max_position_embeddings", p));
    w.key("linear_conv_kernel_dim").u64(0);
    w.key("linear_num_key_heads").u64(0);
    w.key("linear_num_value_heads").u64(0);
    w.end_object();
    return w.take();
}

// A component's tensors into r.outs, in natural name order.
void plan_component(Planned &r, const fs::path &dir, const std::function<Pick(const SourceTensor &)> &pick) {
    auto owned = std::make_shared<Checkpoint>(
        dir.string(), fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json")
                          ? "model"
                          : "diffusion_pytorch_model");
    const Checkpoint &ck = *owned;
    r.keep.push_back(std::move(owned));
    r.source_tensors += ck.tensors().size();
    std::vector<OutTensor> outs;
    for (const SourceTensor *t : ck.tensors()) {
        Pick pk = pick(*t);
        if (pk.name.empty()) continue;
        if (t->shape.size() > CMF_MAX_DIMS)
            throw Error(CMF_ERR_PARSE, t->file + ": tensor \"" + t->name + "\" has more than 6 dimensions");
        OutTensor o;
        o.src = t;
        o.elements = t->elements;
        o.p.name = pk.name;
        o.p.dtype = pk.dtype;
        o.p.shape = t->shape;
        o.p.source = t->name;
        outs.push_back(std::move(o));
    }
    if (outs.empty()) throw Error(CMF_ERR_PARSE, dir.string() + ": the component holds no tensors to pack");
    std::stable_sort(outs.begin(), outs.end(), [](const OutTensor &a, const OutTensor &b) { return canonical_less(a.p.name, b.p.name); });
    for (OutTensor &o : outs) r.outs.push_back(std::move(o));
}

// A config.json as a u8 tensor.
void plan_config(Planned &r, const std::string &name, std::string bytes) {
    OutTensor o;
    o.p.name = name;
    o.p.dtype = CMF_DTYPE_U8;
    o.p.shape = {bytes.size()};
    o.p.source = "config.json";
    o.bytes = std::move(bytes);
    r.source_tensors += 1;
    r.outs.push_back(std::move(o));
}

Planned make_pipeline_plan(Runtime &rt, const ConvertOptions &opts) {
    if (!opts.quant_map.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "imagine-pack takes no --quant-map");
    const int32_t level = pack_level(opts.quant);
    const fs::path dir(opts.model_dir);
    const fs::path index_path = dir / "model_index.json";
    const std::string index = read_required(index_path, "expected a diffusers pipeline directory");
    {
        dom::parser parser;
        const dom::element doc = parse_json(parser, index, index_path);
        std::string_view cls;
        if (doc["_class_name"].get_string().get(cls)) throw Error(CMF_ERR_PARSE, index_path.string() + ": no \"_class_name\" string");
        if (cls != "Lumina2Pipeline" && cls != "Lumina2Text2ImgPipeline")
            throw Error(CMF_ERR_UNSUPPORTED, index_path.string() + ": pipeline \"" + std::string(cls) +
                                                 "\" is not packed by imagine-pack (it packs Lumina2Pipeline)");
    }
    for (const char *c : {"text_encoder", "tokenizer", "transformer", "vae"})
        if (!fs::is_directory(dir / c)) throw Error(CMF_ERR_FILE_NOT_FOUND, (dir / c).string() + ": the pipeline's " + c + " directory is missing");

    Planned r;
    const std::string te_cfg = read_required(dir / "text_encoder" / "config.json", "the text encoder's config");
    const std::string dit_cfg = read_required(dir / "transformer" / "config.json", "the transformer's config");
    const std::string vae_cfg = read_required(dir / "vae" / "config.json", "the VAE's config");
    auto sched_cfg = read_file_if_exists(dir / "scheduler" / "scheduler_config.json");
    bool post_quant_conv = true;  // AutoencoderKL's default
    {
        dom::parser parser;
        const dom::element v = parse_json(parser, vae_cfg, dir / "vae" / "config.json");
        bool b;
        if (!v["use_post_quant_conv"].get_bool().get(b)) post_quant_conv = b;
    }

    json::Writer h;
    h.begin_object();
    h.key("format").string("cmf");
    h.key("version").u64(2);
    h.key("arch").raw(arch_json(te_cfg, dir / "text_encoder" / "config.json"));
    h.key("quant_type").string(level == CMF_DTYPE_F32 ? "F32" : level == CMF_DTYPE_Q8_ROW ? "Q8_ROW" : "Q4_BLOCK");
    h.key("provenance").begin_object();
    h.key("components").begin_object();
    h.key("dit").string("next-dit");
    h.key("te").string("gemma-2 encoder");
    h.key("vae").string("flux-vae decoder");
    h.end_object();
    h.key("packed_from").string(opts.source_name.empty() ? opts.model_dir : opts.source_name);
    h.key("pipeline").string("lumina-image-2.0");
    h.key("quant").string(opts.quant);
    h.key("tool").string(opts.tool);
    h.end_object();
    h.key("tokenizer_config").null();
    h.end_object();
    r.plan.header_json = h.take();
    auto vocab = tokenizer_json_of(rt, dir / "tokenizer");
    if (!vocab) throw Error(CMF_ERR_FILE_NOT_FOUND, (dir / "tokenizer").string() + ": no tokenizer.json or tokenizer.model");
    r.plan.vocab_bytes = std::move(*vocab);

    plan_config(r, "te.config_json", te_cfg);
    plan_component(r, dir / "text_encoder", [&](const SourceTensor &t) { return pick_te(t.name, t.shape, level); });
    plan_config(r, "dit.config_json", dit_cfg);
    plan_component(r, dir / "transformer", [&](const SourceTensor &t) { return pick_dit(t.name, t.shape, level); });
    plan_config(r, "vae.config_json", vae_cfg);
    plan_component(r, dir / "vae", [&](const SourceTensor &t) { return pick_vae(t.name, t.shape, level, post_quant_conv); });
    if (sched_cfg) plan_config(r, "scheduler.config_json", *sched_cfg);
    for (const OutTensor &o : r.outs) r.plan.tensors.push_back(o.p);
    return r;
}

}  // namespace

ConvertPlan plan_pipeline_pack(Runtime &rt, const ConvertOptions &opts) { return make_pipeline_plan(rt, opts).plan; }

ConvertStats pack_pipeline(Runtime &rt, const ConvertOptions &opts, TensorSink &sink) {
    try {
        Planned pl = make_pipeline_plan(rt, opts);
        return write_planned(rt, pl, opts, sink);
    } catch (...) {
        sink.abort();
        throw;
    }
}

}  // namespace cmf::convert
