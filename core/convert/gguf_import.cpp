#include "convert/gguf_import.hpp"

#include "common/error.hpp"
#include "convert/gguf.hpp"
#include "convert/gguf_tokenizer.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/json_writer.hpp>

#include <cmath>
#include <deque>

namespace cmf::convert {

namespace {
bool ends_with(const std::string &s, const char *suffix) {
    const size_t n = std::char_traits<char>::length(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
}  // namespace

namespace gguf {

namespace {

struct ArchMap {
    const char *gguf;        // general.architecture
    const char *model_type;  // the HF model_type it was converted from
    bool gemma;              // norms stored + 1, gelu-tanh, tied head
    bool moe;
};
const ArchMap kArchs[] = {
    {"qwen2", "qwen2", false, false},        {"qwen3", "qwen3", false, false},
    {"qwen2moe", "qwen2_moe", false, true},  {"qwen3moe", "qwen3_moe", false, true},
    {"gemma", "gemma", true, false},         {"gemma2", "gemma2", true, false},
    {"gemma3", "gemma3", true, false},
};

const ArchMap &arch_of(const File &f) {
    auto a = f.get_str("general.architecture");
    if (!a) throw Error(CMF_ERR_PARSE, f.path() + ": no general.architecture key");
    for (const auto &m : kArchs)
        if (*a == m.gguf) return m;
    if (*a == "qwen3next" || *a == "qwen35" || *a == "qwen35moe")
        throw Error(CMF_ERR_UNSUPPORTED, f.path() + ": architecture \"" + *a +
                                             "\" (a linear-attention hybrid) is not imported from GGUF; convert its Hugging Face "
                                             "checkpoint with `cmfhost convert` instead");
    std::string known;
    for (const auto &m : kArchs) known += (known.empty() ? "" : ", ") + std::string(m.gguf);
    throw Error(CMF_ERR_UNSUPPORTED, f.path() + ": architecture \"" + *a + "\" is not imported from GGUF (supported: " + known + ")");
}

uint64_t need_u64(const File &f, const std::string &key) {
    auto v = f.get_u64(key);
    if (!v) throw Error(CMF_ERR_PARSE, f.path() + ": missing metadata key " + key);
    return *v;
}

// A count that llama.cpp allows per layer (an array): these archs use one value.
std::optional<uint64_t> per_model_u64(const File &f, const std::string &key) {
    const Value *v = f.get(key);
    if (v && v->type == ARRAY) {
        if (v->ints.empty()) throw Error(CMF_ERR_PARSE, f.path() + ": metadata key " + key + " is an empty array");
        for (int64_t x : v->ints)
            if (x != v->ints[0])
                throw Error(CMF_ERR_UNSUPPORTED, f.path() + ": metadata key " + key + " varies by layer, which these architectures do not");
        if (v->ints[0] < 0) throw Error(CMF_ERR_PARSE, f.path() + ": metadata key " + key + " is negative");
        return static_cast<uint64_t>(v->ints[0]);
    }
    return f.get_u64(key);
}

// Per-layer roles whose llama.cpp name is not the HF one spelled differently
// for every arch.
const std::pair<const char *, const char *> kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"ffn_gate_exps.weight", "mlp.experts.{}.gate_proj.weight"},
    {"ffn_up_exps.weight", "mlp.experts.{}.up_proj.weight"},
    {"ffn_down_exps.weight", "mlp.experts.{}.down_proj.weight"},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
};

}  // namespace

std::string hf_name(const std::string &arch, const std::string &g) {
    if (g == "token_embd.weight") return "model.embed_tokens.weight";
    if (g == "output_norm.weight") return "model.norm.weight";
    if (g == "output.weight") return "lm_head.weight";
    if (g == "rope_freqs.weight") return "";  // computed from the config, not learned
    const bool sandwich = arch == "gemma2" || arch == "gemma3";
    if (g.rfind("blk.", 0) == 0) {
        const size_t dot = g.find('.', 4);
        if (dot != std::string::npos && dot > 4 && g.find_first_not_of("0123456789", 4) == dot) {
            const std::string layer = g.substr(4, dot - 4), role = g.substr(dot + 1);
            std::string hf;
            // Gemma 2/3 norm the attention output before the residual add
            // (post_attention_norm) and the MLP input (ffn_norm); elsewhere
            // ffn_norm is the post-attention norm.
            if (role == "ffn_norm.weight") hf = sandwich ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight";
            else if (role == "post_attention_norm.weight" && sandwich) hf = "post_attention_layernorm.weight";
            else
                for (auto [from, to] : kLayerNames)
                    if (role == from) hf = to;
            if (!hf.empty()) return "model.layers." + std::to_string(std::stoull(layer)) + "." + hf;
        }
    }
    throw Error(CMF_ERR_UNSUPPORTED, "GGUF tensor \"" + g + "\" has no Hugging Face counterpart in a " + arch + " model");
}

std::string hf_config(const File &f) {
    const ArchMap &am = arch_of(f);
    const std::string a = std::string(am.gguf) + ".";
    json::Writer w;
    w.begin_object();
    w.key("model_type").string(am.model_type);
    const uint64_t hidden = need_u64(f, a + "embedding_length");
    const uint64_t layers = need_u64(f, a + "block_count");
    auto heads = per_model_u64(f, a + "attention.head_count");
    if (!heads) throw Error(CMF_ERR_PARSE, f.path() + ": missing metadata key " + a + "attention.head_count");
    const uint64_t kv = per_model_u64(f, a + "attention.head_count_kv").value_or(*heads);
    w.key("hidden_size").u64(hidden);
    w.key("num_hidden_layers").u64(layers);
    w.key("num_attention_heads").u64(*heads);
    w.key("num_key_value_heads").u64(kv);
    auto key_len = f.get_u64(a + "attention.key_length");
    auto value_len = f.get_u64(a + "attention.value_length");
    if (key_len && value_len && *key_len != *value_len)
        throw Error(CMF_ERR_UNSUPPORTED, f.path() + ": attention.key_length " + std::to_string(*key_len) + " differs from value_length " +
                                             std::to_string(*value_len));
    if (key_len) w.key("head_dim").u64(*key_len);
    const uint64_t head_dim = key_len ? *key_len : (*heads ? hidden / *heads : 0);

    auto ffn = per_model_u64(f, a + "feed_forward_length");
    if (am.moe) {
        const uint64_t experts = need_u64(f, a + "expert_count");
        const uint64_t used = need_u64(f, a + "expert_used_count");
        auto moe_ffn = f.get_u64(a + "expert_feed_forward_length");
        if (!moe_ffn) {
            // Older files: the expert width is the stacked tensors' rows.
            if (const TensorInfo *t = f.find("blk.0.ffn_gate_exps.weight"); t && t->dims.size() == 3) moe_ffn = t->dims[1];
            else throw Error(CMF_ERR_PARSE, f.path() + ": missing metadata key " + a + "expert_feed_forward_length");
        }
        w.key("num_experts").u64(experts);
        w.key("num_experts_per_tok").u64(used);
        w.key("moe_intermediate_size").u64(*moe_ffn);
        w.key("intermediate_size").u64(ffn ? *ffn : *moe_ffn);
        // llama.cpp renormalises qwen3moe's top-k weights unless told otherwise.
        w.key("norm_topk_prob").boolean(f.get_bool(a + "expert_weights_norm").value_or(std::string(am.gguf) == "qwen3moe"));
        std::optional<uint64_t> shared = f.get_u64(a + "expert_shared_feed_forward_length");
        if (!shared)
            if (const TensorInfo *t = f.find("blk.0.ffn_up_shexp.weight"); t && t->dims.size() == 2) shared = t->dims[1];
        if (shared) w.key("shared_expert_intermediate_size").u64(*shared);
    } else {
        if (!ffn) throw Error(CMF_ERR_PARSE, f.path() + ": missing metadata key " + a + "feed_forward_length");
        w.key("intermediate_size").u64(*ffn);
    }

    // vocab_size: the embedding's rows (llama.cpp's gemma3 converter drops
    // the padding rows past the tokenizer), at least the tokenizer's size.
    uint64_t vocab = 0;
    if (const TensorInfo *t = f.find("token_embd.weight"); t && t->dims.size() == 2) vocab = t->dims[1];
    if (const Value *toks = f.get("tokenizer.ggml.tokens")) vocab = std::max(vocab, toks->count);
    if (auto v = f.get_u64(a + "vocab_size")) vocab = std::max(vocab, *v);
    if (!vocab) throw Error(CMF_ERR_PARSE, f.path() + ": no token_embd.weight and no tokenizer.ggml.tokens: the vocabulary size is unknown");
    w.key("vocab_size").u64(vocab);
    w.key("max_position_embeddings").u64(need_u64(f, a + "context_length"));
    w.key("rms_norm_eps").f64(f.get_f64(a + "attention.layer_norm_rms_epsilon").value_or(1e-6));
    w.key("rope_theta").f64(f.get_f64(a + "rope.freq_base").value_or(10000.0));
    w.key("tie_word_embeddings").boolean(f.find("output.weight") == nullptr);
    if (auto kind = f.get_str(a + "rope.scaling.type"); kind && *kind != "none") {
        w.key("rope_scaling").begin_object();
        w.key("rope_type").string(*kind);
        if (auto v = f.get_f64(a + "rope.scaling.factor")) w.key("factor").f64(*v);
        if (auto v = f.get_u64(a + "rope.scaling.original_context_length")) w.key("original_max_position_embeddings").u64(*v);
        w.end_object();
    }

    if (am.gemma) {
        const std::string g = am.gguf;
        w.key("hidden_activation").string("gelu_pytorch_tanh");
        if (g == "gemma2" || g == "gemma3") {
            // 1/sqrt(query_pre_attn_scalar) scales the scores. A file may say
            // it (attention.scale); else llama.cpp's rule: the 27B models use
            // hidden/heads, the others head_dim.
            double q;
            if (auto s = f.get_f64(a + "attention.scale"); s && *s > 0) {
                q = 1.0 / (*s * *s);
                if (std::abs(q - std::round(q)) < 1e-3 * q) q = std::round(q);
            } else {
                const bool is_27b = (g == "gemma2" && layers == 46) || (g == "gemma3" && layers == 62);
                q = static_cast<double>(is_27b ? hidden / *heads : head_dim);
            }
            w.key("query_pre_attn_scalar").f64(q);
            if (auto sw = f.get_u64(a + "attention.sliding_window")) w.key("sliding_window").u64(*sw);
            if (auto v = f.get_f64(a + "final_logit_softcapping")) w.key("final_logit_softcapping").f64(*v);
            if (auto v = f.get_f64(a + "attn_logit_softcapping")) w.key("attn_logit_softcapping").f64(*v);
        }
        if (g == "gemma3") {
            // Which layers slide: attention.sliding_window_pattern as a
            // period (every Nth layer is global) or one bool per layer;
            // without it llama.cpp's fixed period of 6.
            std::vector<bool> sliding(layers);
            uint64_t period = 6;
            const Value *p = f.get(a + "attention.sliding_window_pattern");
            if (p && p->type == ARRAY) {
                if (p->count != layers)
                    throw Error(CMF_ERR_PARSE, f.path() + ": " + a + "attention.sliding_window_pattern has " + std::to_string(p->count) +
                                                   " entries for " + std::to_string(layers) + " layers");
                for (uint64_t i = 0; i < layers; ++i) sliding[i] = p->ints[i] != 0;
            } else {
                if (p) period = *f.get_u64(a + "attention.sliding_window_pattern");
                if (period == 0) throw Error(CMF_ERR_PARSE, f.path() + ": " + a + "attention.sliding_window_pattern is 0");
                for (uint64_t i = 0; i < layers; ++i) sliding[i] = (i + 1) % period != 0;
                w.key("sliding_window_pattern").u64(period);
            }
            w.key("layer_types").begin_array();
            for (bool s : sliding) w.string(s ? "sliding_attention" : "full_attention");
            w.end_array();
            w.key("rope_local_base_freq").f64(f.get_f64(a + "rope.freq_base_swa").value_or(10000.0));
        }
    }
    w.end_object();
    return w.take();
}

}  // namespace gguf

namespace {

struct GgufModel {
    std::unique_ptr<gguf::File> file;
    std::deque<SourceTensor> views;  // stable addresses for SourceModel::tensors
};

}  // namespace

SourceModel load_gguf(Runtime &rt, const std::string &path) {
    auto holder = std::make_shared<GgufModel>();
    holder->file = std::make_unique<gguf::File>(path);
    const gguf::File &f = *holder->file;
    SourceModel m;
    m.config_json = gguf::hf_config(f);
    m.config_label = path + " (metadata of general.architecture)";
    m.provenance_source_key = "source";
    const std::string arch = *f.get_str("general.architecture");
    const bool gemma = arch.rfind("gemma", 0) == 0;

    for (const gguf::TensorInfo &t : f.tensors()) {
        const std::string name = gguf::hf_name(arch, t.name);
        if (name.empty()) continue;
        const gguf::TypeInfo *ti = gguf::type_info(t.type);
        if (!ti->decodable)
            throw Error(CMF_ERR_UNKNOWN_DTYPE, path + ": tensor \"" + t.name + "\": unsupported GGUF type " + ti->name +
                                                   " (import-gguf reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q2_K-Q6_K)");
        SourceTensor s;
        s.dtype = t.type == gguf::F32 ? SourceDtype::F32 : t.type == gguf::F16 ? SourceDtype::F16 : t.type == gguf::BF16 ? SourceDtype::BF16 : SourceDtype::Ggml;
        s.ggml_type = t.type;
        s.shape.assign(t.dims.rbegin(), t.dims.rend());
        s.file = path;
        s.owner = &f;
        if (gemma && ends_with(name, "norm.weight")) s.add = -1.0f;
        if (name.find("{}") != std::string::npos) {
            // [E, rows, cols] stacked experts: one view per expert, each a
            // whole number of rows (so of blocks) of the stack.
            if (s.shape.size() != 3)
                throw Error(CMF_ERR_PARSE, path + ": tensor \"" + t.name + "\" holds stacked experts but has " + std::to_string(s.shape.size()) + " dimensions, not 3");
            const uint64_t experts = s.shape[0], per = t.elements / experts, per_bytes = t.nbytes / experts;
            for (uint64_t e = 0; e < experts; ++e) {
                SourceTensor v = s;
                v.name = name;
                v.name.replace(v.name.find("{}"), 2, std::to_string(e));
                v.shape.erase(v.shape.begin());
                v.elements = per;
                v.nbytes = per_bytes;
                v.data = t.data + e * per_bytes;
                holder->views.push_back(std::move(v));
            }
            continue;
        }
        // HF's shared-expert gate is a [1, hidden] Linear; llama.cpp may keep it 1-D.
        if (ends_with(name, ".mlp.shared_expert_gate.weight") && s.shape.size() == 1) s.shape.insert(s.shape.begin(), 1);
        s.name = name;
        s.elements = t.elements;
        s.nbytes = t.nbytes;
        s.data = t.data;
        holder->views.push_back(std::move(s));
    }
    for (const auto &v : holder->views) m.tensors.push_back(&v);
    m.source_tensor_count = f.tensors().size();

    GgufTokenizer tok = build_gguf_tokenizer(f);
    if (tok.tokenizer_json.empty()) rt.log(CMF_LOG_WARN, path + ": no tokenizer.ggml.tokens: the file will have no vocab section");
    m.vocab_bytes = std::move(tok.tokenizer_json);
    m.tokenizer_config_json = std::move(tok.tokenizer_config_json);
    m.keep = holder;
    return m;
}

}  // namespace cmf::convert
