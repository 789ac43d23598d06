#include "decoder.hpp"
#include "decoder_parts.hpp"

#include <cmf/options.hpp>
#include <cmf/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>

namespace cmf::archs {

namespace {

using cmf::sdk::Error;

void require_backend(const cmf_backend_vt *be, const char *fam) {
    if (be == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(fam) + ": NULL backend");
    if (be->struct_size < offsetof(cmf_backend_vt, embed) + sizeof(void *))
        throw Error(CMF_ERR_UNSUPPORTED, std::string(fam) + ": backend '" + (be->name ? be->name : "?") +
                                             "' predates the transformer operations");
    const void *ops[] = {reinterpret_cast<const void *>(be->weight_bind), reinterpret_cast<const void *>(be->matmul),
                         reinterpret_cast<const void *>(be->buffer_alloc), reinterpret_cast<const void *>(be->buffer_read),
                         reinterpret_cast<const void *>(be->copy), reinterpret_cast<const void *>(be->rms_norm),
                         reinterpret_cast<const void *>(be->rope), reinterpret_cast<const void *>(be->attention),
                         reinterpret_cast<const void *>(be->gated_act), reinterpret_cast<const void *>(be->add),
                         reinterpret_cast<const void *>(be->add_bias), reinterpret_cast<const void *>(be->embed)};
    for (const void *op : ops)
        if (op == nullptr)
            throw Error(CMF_ERR_UNSUPPORTED, std::string(fam) + ": backend '" + (be->name ? be->name : "?") +
                                                 "' lacks an operation the " + fam + " arch needs");
}

bool has_kv_ops(const cmf_backend_vt *be) {
    return CMF_BACKEND_HAS(be, kv_write) && CMF_BACKEND_HAS(be, attention_kv);
}

bool has_ring_attention(const cmf_backend_vt *be) {
    return CMF_BACKEND_HAS(be, kv_write) && CMF_BACKEND_HAS(be, attention_ring);
}

// Model options ("key=value,..."): kv_cache=f32|f16|q8, the KV cache's
// dtype (q8: CMF_KV_DTYPE_Q8_32 blocks); mtp=on|off, the draft head
// (default: on when the file has one). Unknown keys, values and a backend
// without the cache operations a dtype needs are errors, never ignored.
struct ModelOptions {
    int32_t kv_dtype = CMF_DTYPE_F32;
    int mtp = -1;  // -1: when present, 0: off, 1: required
};

ModelOptions parse_model_options(const cmf_backend_vt *be, const std::string &fam, const char *options) {
    ModelOptions o;
    for (const cmf::sdk::OptionItem &item : cmf::sdk::split_options(options)) {
        const std::string &key = item.key, &value = item.value;
        if (key == "mtp") {
            if (value != "on" && value != "off")
                throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": mtp must be on or off, not \"" + value + "\"");
            o.mtp = value == "on";
            continue;
        }
        if (key != "kv_cache")
            throw Error(CMF_ERR_INVALID_ARGUMENT,
                        fam + ": unknown model option \"" + key + "\" (known: kv_cache=f32|f16|q8, mtp=on|off)");
        if (value == "f32") {
            o.kv_dtype = CMF_DTYPE_F32;
        } else if (value == "f16" || value == "q8") {
            if (!has_kv_ops(be))
                throw Error(CMF_ERR_UNSUPPORTED, fam + ": backend '" + (be->name ? be->name : "?") + "' has no " +
                                                     value + " KV cache (kv_write, attention_kv)");
            o.kv_dtype = value == "f16" ? CMF_DTYPE_F16 : CMF_KV_DTYPE_Q8_32;
        } else {
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": kv_cache must be f32, f16 or q8, not \"" + value + "\"");
        }
    }
    return o;
}

// Set bits of a mask row of n items, ascending.
std::vector<uint32_t> set_bits(const uint8_t *row, uint64_t n) {
    std::vector<uint32_t> out;
    for (uint64_t i = 0; i < n; ++i)
        if ((row[i / 8] >> (i % 8)) & 1) out.push_back(uint32_t(i));
    return out;
}

// idx * width + [0, width) for each idx: the rows of whole heads.
std::vector<uint32_t> head_rows(const std::vector<uint32_t> &heads, uint64_t width) {
    std::vector<uint32_t> out;
    for (uint32_t h : heads)
        for (uint64_t j = 0; j < width; ++j) out.push_back(uint32_t(h * width + j));
    return out;
}

// The mask must describe this model: its dimensions come from the same arch block.
void check_mask(const DecoderModel &m, const cmf_task_mask &t) {
    const ArchConfig &c = m.cfg;
    const std::string what = std::string(m.ch.family) + ": task mask '" + (t.name ? t.name : "?") + "' ";
    if (t.struct_size < sizeof(cmf_task_mask) || t.ffn == nullptr || t.heads == nullptr || t.gates == nullptr)
        throw Error(CMF_ERR_INVALID_ARGUMENT, what + "is incomplete");
    if (t.layers != c.num_layers || t.visits != c.num_layers * c.num_loops || t.head_bits != c.num_attention_heads ||
        t.ffn_bits != c.intermediate_size || t.ffn_row_bytes < (t.ffn_bits + 7) / 8 ||
        t.head_row_bytes < (t.head_bits + 7) / 8 ||
        (t.experts != nullptr && t.expert_row_bytes < (t.expert_bits + 7) / 8))
        throw Error(CMF_ERR_INVALID_ARGUMENT, what + "does not match the arch block (" + std::to_string(t.layers) +
                                                  " layers, " + std::to_string(t.visits) + " visits, " +
                                                  std::to_string(t.head_bits) + " heads, " + std::to_string(t.ffn_bits) +
                                                  " neurons)");
}

}  // namespace

namespace detail {

void build_layer_at(DecoderModel &m, Binder &b, const std::string &p, size_t index, Layer &L, const cmf_task_mask *mask,
                    uint64_t visit) {
    const ArchConfig &c = m.cfg;
    const std::string fam = m.ch.family;
    const std::string where = b.prefix() + p;
    const std::string name = index == SIZE_MAX ? std::string("the MTP layer") : "layer " + std::to_string(index);
    const uint64_t H = c.hidden_size, hd = c.head_dim;
    L.n_heads = uint32_t(c.num_attention_heads);
    L.n_kv_heads = uint32_t(c.num_kv_heads);
    L.q_dim = m.q_dim;
    L.kv_dim = m.kv_dim;
    // Live query heads, and the neurons of this visit's FFN row.
    std::vector<uint32_t> heads, neurons;
    bool all_heads = true, all_neurons = true;
    if (mask != nullptr) {
        heads = set_bits(mask->heads + index * mask->head_row_bytes, c.num_attention_heads);
        all_heads = heads.size() == c.num_attention_heads;
        neurons = set_bits(mask->ffn + visit * mask->ffn_row_bytes, mask->ffn_bits);
        all_neurons = neurons.size() == mask->ffn_bits;
        if (mask->experts != nullptr) {
            const uint8_t *row = mask->experts + index * mask->expert_row_bytes;
            if (set_bits(row, mask->expert_bits).size() != mask->expert_bits) {
                L.routable_experts.assign(row, row + mask->expert_row_bytes);
                for (uint64_t e = mask->expert_bits; e < 8 * mask->expert_row_bytes; ++e)  // padding: no expert
                    L.routable_experts[e / 8] &= uint8_t(~(1u << (e % 8)));
            }
        }
    }
    L.attn_on = all_heads || !heads.empty();
    const std::string masked = fam + ": task mask '" + (mask != nullptr && mask->name ? mask->name : "") + "' keeps ";
    L.in_norm = b.bind(p + "input_layernorm.weight", {H});
    // Sandwich norms (gemma2/3): post_attention_layernorm is applied to the
    // attention's output, pre_feedforward_layernorm before the FFN.
    const bool sandwich = b.present(p + "pre_feedforward_layernorm.weight");
    if (sandwich) {
        L.post_attn_norm = b.bind(p + "post_attention_layernorm.weight", {H});
        L.pre_ffn_norm = b.bind(p + "pre_feedforward_layernorm.weight", {H});
        if (!b.present(p + "post_feedforward_layernorm.weight"))
            throw Error(CMF_ERR_MISSING_TENSOR, where + "pre_feedforward_layernorm.weight is present but "
                                                        "post_feedforward_layernorm.weight is not (sandwich norms come in pairs)");
        L.post_ffn_norm = b.bind(p + "post_feedforward_layernorm.weight", {H});
    } else {
        L.pre_ffn_norm = b.bind(p + "post_attention_layernorm.weight", {H});
        if (b.present(p + "post_feedforward_layernorm.weight"))
            throw Error(CMF_ERR_MISSING_TENSOR, where + "post_feedforward_layernorm.weight is present but "
                                                        "pre_feedforward_layernorm.weight is not (sandwich norms come in pairs)");
    }
    if (L.mixer == MixerKind::DeltaNet) {
        if (!all_heads && L.attn_on)
            throw Error(CMF_ERR_UNSUPPORTED, masked + "some heads of " + name +
                                                 ", a gated delta net layer: head subsets run on attention layers");
        if (L.attn_on) bind_delta_net(m, b, p, where, L);
        L.kv_dim = 0;
    } else {
        if (b.present(p + "linear_attn.out_proj.weight"))
            throw Error(CMF_ERR_BOUNDS, fam + ": " + name + " has gated delta net tensors (linear_attn.*) but arch.layer_types "
                                              "says it is an attention layer");
        const uint64_t q_proj_rows = b.checked(p + "self_attn.q_proj.weight", {0, H}).shape[0];
        // Output-gated attention (Qwen3-Next / Qwen3.5): q_proj holds
        // [q_h | gate_h] per head, twice the rows.
        if (q_proj_rows == 2 * m.q_dim) {
            if (!CMF_BACKEND_HAS(m.be, gated_delta_net) || !CMF_BACKEND_HAS(m.be, copy_rows))
                throw Error(CMF_ERR_UNSUPPORTED, fam + ": " + name + " has output-gated attention, which needs the backend's "
                                                       "hybrid operations (copy_rows, gated_act with CMF_ACT_SIGMOID)");
            L.mixer = MixerKind::GatedAttention;
            if (!all_heads && L.attn_on)
                throw Error(CMF_ERR_UNSUPPORTED, masked + "some heads of " + name +
                                                     ", an output-gated attention layer: head subsets run on plain attention");
        } else if (q_proj_rows != m.q_dim) {
            throw Error(CMF_ERR_BOUNDS, where + "self_attn.q_proj.weight has " + std::to_string(q_proj_rows) +
                                            " rows, expected num_attention_heads*head_dim = " + std::to_string(m.q_dim) +
                                            " (or twice that, output-gated)");
        }
        int biases = b.present(p + "self_attn.q_proj.bias") + b.present(p + "self_attn.k_proj.bias") +
                     b.present(p + "self_attn.v_proj.bias");
        if (biases != 0 && biases != 3)
            throw Error(CMF_ERR_MISSING_TENSOR, where + "self_attn: q/k/v biases must be all present or all absent");
        if (biases == 3 && L.mixer == MixerKind::GatedAttention)
            throw Error(CMF_ERR_UNSUPPORTED, where + "self_attn: q/k/v biases with an output-gated q_proj");
        int norms = b.present(p + "self_attn.q_norm.weight") + b.present(p + "self_attn.k_norm.weight");
        if (norms == 1)
            throw Error(CMF_ERR_MISSING_TENSOR, where + "self_attn: q_norm and k_norm must be both present or both absent");
        // With every head off the attention adds nothing, its output bias included.
        if (L.attn_on && b.present(p + "self_attn.o_proj.bias")) L.o_bias = b.bind(p + "self_attn.o_proj.bias", {H});
        if (!L.attn_on) {
            L.kv_dim = 0;
        } else if (all_heads) {
            L.q = b.bind(p + "self_attn.q_proj.weight", {q_proj_rows, H});
            L.k = b.bind(p + "self_attn.k_proj.weight", {m.kv_dim, H});
            L.v = b.bind(p + "self_attn.v_proj.weight", {m.kv_dim, H});
            L.o = b.bind(p + "self_attn.o_proj.weight", {H, m.q_dim});
            if (biases == 3) {
                L.q_bias = b.bind(p + "self_attn.q_proj.bias", {m.q_dim});
                L.k_bias = b.bind(p + "self_attn.k_proj.bias", {m.kv_dim});
                L.v_bias = b.bind(p + "self_attn.v_proj.bias", {m.kv_dim});
            }
        } else {
            // The live heads' rows of q (and columns of o); K/V of the groups
            // they read. When every live group keeps the same number of heads,
            // GQA runs on the live groups as it is; otherwise each live head
            // gets its group's K/V rows of its own (plain multi-head attention
            // over the live heads: a group's K/V is computed once per live head).
            const uint64_t grp = c.num_attention_heads / c.num_kv_heads;
            std::vector<uint32_t> live_per_group(c.num_kv_heads, 0);
            for (uint32_t h : heads) ++live_per_group[h / grp];
            uint32_t common = 0;
            bool uniform = true;
            std::vector<uint32_t> kv_heads;
            for (uint64_t g = 0; g < c.num_kv_heads; ++g) {
                if (live_per_group[g] == 0) continue;
                if (common == 0) common = live_per_group[g];
                uniform = uniform && live_per_group[g] == common;
                kv_heads.push_back(uint32_t(g));
            }
            if (!uniform) {
                kv_heads.clear();
                for (uint32_t h : heads) kv_heads.push_back(uint32_t(h / grp));
            }
            const std::vector<uint32_t> q_rows = head_rows(heads, hd), kv_rows = head_rows(kv_heads, hd);
            L.n_heads = uint32_t(heads.size());
            L.n_kv_heads = uint32_t(kv_heads.size());
            L.q_dim = q_rows.size();
            L.kv_dim = kv_rows.size();
            L.k = b.bind_subset(p + "self_attn.k_proj.weight", {m.kv_dim, H}, 0, kv_rows);
            L.v = b.bind_subset(p + "self_attn.v_proj.weight", {m.kv_dim, H}, 0, kv_rows);
            L.q = b.bind_subset(p + "self_attn.q_proj.weight", {m.q_dim, H}, 0, q_rows);
            L.o = b.bind_subset(p + "self_attn.o_proj.weight", {H, m.q_dim}, 1, q_rows);
            if (biases == 3) {
                L.q_bias = b.bind_subset(p + "self_attn.q_proj.bias", {m.q_dim}, 0, q_rows);
                L.k_bias = b.bind_subset(p + "self_attn.k_proj.bias", {m.kv_dim}, 0, kv_rows);
                L.v_bias = b.bind_subset(p + "self_attn.v_proj.bias", {m.kv_dim}, 0, kv_rows);
            }
        }
        if (L.attn_on && norms == 2) {
            L.q_norm = b.bind(p + "self_attn.q_norm.weight", {hd});
            L.k_norm = b.bind(p + "self_attn.k_norm.weight", {hd});
        }
    }
    m.max_kv_dim = std::max(m.max_kv_dim, L.kv_dim);
    if (b.present(p + "mlp.gate.weight")) {
        L.ffn = FfnKind::Moe;
        if (neurons.empty() && !all_neurons) {
            L.ffn_on = false;
            return;
        }
        if (!all_neurons)
            throw Error(CMF_ERR_UNSUPPORTED, masked + "some FFN neurons of " + name +
                                                 ", a mixture-of-experts layer: its experts are masked by expert rows");
        bind_moe(m, b, p, where, L);
        if (!L.routable_experts.empty()) {
            uint64_t live = 0;
            for (uint64_t e = 0; e < L.moe.experts.size(); ++e) live += L.routable(e);
            if (live == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, masked + "no expert of " + name + " routable");
            L.moe.top_k = uint32_t(std::min<uint64_t>(L.moe.top_k, live));  // top-k among the routable ones
        }
        return;
    }
    const uint64_t width = b.checked(p + "mlp.gate_proj.weight", {0, H}).shape[0];  // the true FFN width (spec 11), not the nominal intermediate_size
    if (mask != nullptr && width != mask->ffn_bits)
        throw Error(CMF_ERR_BOUNDS, where + "mlp.gate_proj.weight has " + std::to_string(width) +
                                        " rows but the task mask's FFN rows have " + std::to_string(mask->ffn_bits) +
                                        " neurons");
    if (all_neurons) {
        L.gate = b.bind(p + "mlp.gate_proj.weight", {width, H});
        L.up = b.bind(p + "mlp.up_proj.weight", {width, H});
        L.down = b.bind(p + "mlp.down_proj.weight", {H, width});
        L.ffn_dim = width;
    } else if (neurons.empty()) {
        L.ffn_on = false;
    } else {
        L.gate = b.bind_subset(p + "mlp.gate_proj.weight", {width, H}, 0, neurons);
        L.up = b.bind_subset(p + "mlp.up_proj.weight", {width, H}, 0, neurons);
        L.down = b.bind_subset(p + "mlp.down_proj.weight", {H, width}, 1, neurons);
        L.ffn_dim = neurons.size();
    }
    m.max_ffn = std::max(m.max_ffn, L.ffn_dim);
}

}  // namespace detail

namespace {

// Visit v of physical layer i (v == i without loops), with what `mask`
// (or NULL) leaves of it.
void build_layer(DecoderModel &m, Binder &b, const DecoderNames &names, uint64_t v, uint64_t i,
                 const cmf_task_mask *mask) {
    const ArchConfig &c = m.cfg;
    const std::string fam = m.ch.family;
    Layer L;
    L.choice = m.ch.layers[i];
    L.physical = i;
    switch (c.layer_types[i]) {
    case LayerType::FullAttention:
    case LayerType::SlidingAttention: break;
    case LayerType::LinearAttention:
        if (c.linear_core_kind != "gated_delta_net")
            throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) + " is LinearAttention but arch.linear_core.kind is \"" +
                                                 c.linear_core_kind + "\" (only gated_delta_net runs)");
        L.mixer = MixerKind::DeltaNet;
        break;
    default:
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) + " has layer type " +
                                             c.layer_type_names[i] + ", which the " + fam + " arch does not run");
    }
    if (mask != nullptr && !((mask->gates[i / 8] >> (i % 8)) & 1)) {
        // Gated off: nothing of this layer runs, so nothing of it is bound.
        L.alive = L.attn_on = L.ffn_on = false;
        L.kv_dim = 0;
        m.layers.push_back(std::move(L));
        return;
    }
    detail::build_layer_at(m, b, names.body + "layers." + std::to_string(i) + ".", i, L, mask, v);
    m.layers.push_back(std::move(L));
}

}  // namespace

DecoderModel::~DecoderModel() {
    mtp.reset();
    for (auto *w : owned) be->weight_free(be_ctx, w);
}

void Scratch::release() {
    for (float **p : {&h, &xn, &q, &k, &v, &attn, &gate, &up, &tmp, &logits, &qg, &ogate, &router, &moe_x, &moe_g,
                      &moe_u, &moe_y, &lin_qkv, &lin_z, &lin_a, &lin_b, &lin_conv, &lin_out}) {
        be->buffer_free(be_ctx, *p);
        *p = nullptr;
    }
    capacity = logits_rows = 0;
}

DecoderState::~DecoderState() {
    scratch.release();
    const cmf_backend_vt *be = model->be;
    be->buffer_free(model->be_ctx, kv_block);
    for (RecurrentState &r : rec) detail::free_recurrent(*model, r);
    for (float *p : {mtp_k, mtp_v, mtp_hidden}) be->buffer_free(model->be_ctx, p);
}

std::unique_ptr<DecoderModel> create_decoder(const cmf_host_api *host, const cmf_model_source *src,
                                             const cmf_backend_vt *be, void *be_ctx, const char *options,
                                             const ArchConfig &cfg, DecoderChoices choices, const DecoderNames &names) {
    const std::string fam = choices.family;
    if (src == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL model source");
    require_backend(be, choices.family);
    if (choices.layers.size() != cfg.num_layers)
        throw Error(CMF_ERR_INTERNAL, fam + ": layer choices for " + std::to_string(choices.layers.size()) + " of " +
                                          std::to_string(cfg.num_layers) + " layers");
    auto m = std::make_unique<DecoderModel>();
    m->host = host;
    m->be = be;
    m->be_ctx = be_ctx;
    m->cfg = cfg;
    m->ch = std::move(choices);
    const ModelOptions opts = parse_model_options(be, fam, options);
    m->kv_dtype = opts.kv_dtype;
    m->fused_matmuls = CMF_BACKEND_HAS(be, matmul_multi);
    const ArchConfig &c = m->cfg;
    m->q_dim = c.num_attention_heads * c.head_dim;
    m->kv_dim = c.num_kv_heads * c.head_dim;
    m->rot_dim = c.rot_dim;
    m->scaled_rope = c.rope_scaling.scaled() && m->rot_dim > 0;
    if (m->scaled_rope && !CMF_BACKEND_HAS(be, rope_freqs))
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": arch.rope_scaling is " + rope::type_name(c.rope_scaling.type) +
                                             " but backend '" + (be->name ? be->name : "?") +
                                             "' has no rope_freqs (RoPE over a given frequency table)");
    m->max_kv_dim = m->kv_dim;
    m->physical_layers = c.num_layers;
    const cmf_task_mask *mask =
        src->struct_size >= offsetof(cmf_model_source, task_mask) + sizeof(void *) ? src->task_mask : nullptr;
    if (mask != nullptr) {
        check_mask(*m, *mask);
        if (!backend_has(be, offsetof(cmf_backend_vt, weight_bind_subset), be->weight_bind_subset))
            throw Error(CMF_ERR_UNSUPPORTED, fam + ": backend '" + (be->name ? be->name : "?") +
                                                 "' cannot bind parts of tensors (weight_bind_subset), so it cannot "
                                                 "run a task mask");
        m->task = mask->name ? mask->name : "";
    }
    m->norm_topk = c.moe_norm_topk_prob;
    Binder b(src, be, be_ctx, "", m->owned);
    // Pages read exactly (4 KiB, no read-ahead) where rows are skipped: a
    // model with experts (advised here) or a task mask (by the runtime).
    const bool exact_pages = detail::advise_expert_pages(b) || mask != nullptr;
    const std::string &body = names.body;
    const uint64_t H = c.hidden_size;
    m->embed = b.bind(body + "embed_tokens.weight", {0, H});
    for (uint64_t v = 0; v < c.num_layers * c.num_loops; ++v) build_layer(*m, b, names, v, v % c.num_layers, mask);
    m->final_norm = b.bind(body + "norm.weight", {H});
    if (names.head.empty()) {  // an encoder: hidden states only
        if (opts.mtp == 1) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": mtp=on for a model without an output head");
        if (exact_pages) detail::advise_whole_read_pages(b, body + "embed_tokens.weight");
        return m;
    }
    if (b.present(names.head))
        m->head = b.bind(names.head, {0, H});
    else if (c.tie_word_embeddings)
        m->head = m->embed;
    else
        throw Error(CMF_ERR_MISSING_TENSOR, "missing tensor " + names.head + " (and arch.tie_word_embeddings is false)");
    if (m->head.rows > c.vocab_size)
        throw Error(CMF_ERR_BOUNDS, "the output head has " + std::to_string(m->head.rows) +
                                        " rows, more than arch.vocab_size " + std::to_string(c.vocab_size));
    const bool has_mtp = b.present(body + "mtp.eh_proj.weight") || b.present(body + "mtp.layers.0.self_attn.q_proj.weight");
    if (opts.mtp == 1 && !has_mtp)
        throw Error(CMF_ERR_MISSING_TENSOR, fam + ": mtp=on but the model has no MTP head (" + body + "mtp.*)");
    if (has_mtp && opts.mtp != 0) detail::bind_mtp(*m, b, body);
    // The embedding is read a row per token unless it is also the head.
    if (exact_pages) detail::advise_whole_read_pages(b, b.present(names.head) ? body + "embed_tokens.weight" : "");
    return m;
}

std::unique_ptr<DecoderState> create_decoder_state(DecoderModel &m, uint64_t n_ctx) {
    const std::string fam = m.ch.family;
    if (n_ctx == 0) n_ctx = m.cfg.max_position_embeddings;
    if (n_ctx == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": n_ctx is 0 and the header gives no maximum");
    auto s = std::make_unique<DecoderState>();
    s->model = &m;
    s->n_ctx = n_ctx;
    s->scratch.be = m.be;
    s->scratch.be_ctx = m.be_ctx;
    if (m.scaled_rope) s->rope.emplace(m.cfg.rope_scaling, m.cfg.rope_theta, m.rot_dim);
    // The KV cache holds K after RoPE and V, per attention layer, in
    // m.kv_dtype; a gated delta net layer has its recurrent state instead. A
    // sliding layer's is a ring of window + chunk - 1 rows when that is
    // shorter than the context and the backend has attention_ring: a call
    // of at most `chunk` tokens then finds every key its queries see. A
    // layer whose attention does not run (a task mask) has none.
    const bool rings = has_ring_attention(m.be);
    s->chunk = m.ring_chunk();
    s->rec.resize(m.layers.size());
    s->route_counts.resize(m.layers.size());
    s->last_picks.resize(m.layers.size());
    for (size_t i = 0; i < m.layers.size(); ++i) {
        const Layer &L = m.layers[i];
        s->k_cache.push_back(nullptr);
        s->v_cache.push_back(nullptr);
        uint64_t rows = 0;
        bool ring = false;
        if (!L.attn_on) {
            // nothing to keep: the mixer does not run
        } else if (L.mixer == MixerKind::DeltaNet) {
            detail::alloc_recurrent(m, s->rec[i]);
        } else {
            const uint64_t window = L.choice.window;
            ring = rings && window > 0 && window + s->chunk - 1 < n_ctx;
            rows = ring ? window + s->chunk - 1 : n_ctx;
            if (m.kv_dtype == CMF_KV_DTYPE_Q8_32 && L.kv_dim % 32 != 0)
                throw Error(CMF_ERR_UNSUPPORTED, "kv_cache=q8 stores blocks of 32 values, and layer " + std::to_string(i) +
                                                     "'s K/V rows hold " + std::to_string(L.kv_dim) +
                                                     " (a multiple of 32 is needed): use kv_cache=f16");
        }
        s->cache_rows.push_back(rows);
        s->ring.push_back(ring);
        if (L.ffn == FfnKind::Moe) s->route_counts[i].assign(L.moe.experts.size(), 0);
    }
    // Every layer's K and V in one buffer, each 64-byte aligned: the caches
    // grow from their first rows, so in separate buffers of a few hundred KiB
    // (short contexts) none could sit in 2 MiB pages, and each new 4 KiB page
    // was a fault of its own (docs/performance.md, "KV caches in 2 MiB
    // pages"); together they fill 2 MiB pages from the first token.
    const auto cache_bytes = [&](size_t i) { return (s->cache_rows[i] * m.kv_row_bytes(m.layers[i]) + 63) / 64 * 64; };
    uint64_t kv_total = 0;
    for (size_t i = 0; i < m.layers.size(); ++i) kv_total += 2 * cache_bytes(i);
    if (kv_total > 0) {
        check(m.be->buffer_alloc(m.be_ctx, kv_total, &s->kv_block));
        uint8_t *at = reinterpret_cast<uint8_t *>(s->kv_block);
        for (size_t i = 0; i < m.layers.size(); ++i) {
            if (s->cache_rows[i] == 0) continue;
            s->k_cache[i] = reinterpret_cast<float *>(at);
            s->v_cache[i] = reinterpret_cast<float *>(at + cache_bytes(i));
            at += 2 * cache_bytes(i);
        }
    }
    if (m.mtp) detail::alloc_mtp_state(m, *s);
    return s;
}

void truncate_decoder_state(DecoderState &s, uint64_t n_keep) {
    const DecoderModel &m = *s.model;
    const std::string fam = m.ch.family;
    if (n_keep > s.n_past)
        throw Error(CMF_ERR_BOUNDS, fam + ": cannot keep " + std::to_string(n_keep) + " positions of " +
                                        std::to_string(s.n_past));
    if (n_keep == s.n_past) return;
    // Attention reads only positions < n_past, so dropping is just the count,
    // as long as every ring still holds the window before n_keep: the
    // position p of row p % rows is overwritten once p + rows < n_past.
    for (size_t i = 0; i < s.ring.size() && n_keep > 0; ++i) {
        if (!s.ring[i]) continue;
        const uint64_t window = s.model->layers[i].choice.window;
        const uint64_t first = n_keep > window ? n_keep - window : 0;  // the oldest position the next query needs
        if (first + s.cache_rows[i] < s.n_past)
            throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) + "'s sliding-window cache keeps " +
                                                 std::to_string(s.cache_rows[i]) + " positions and no longer holds " +
                                                 "the window before position " + std::to_string(n_keep) +
                                                 " (rolled back from " + std::to_string(s.n_past) + ")");
    }
    // The last forward call's last position is undone (a rejected draft):
    // recurrent layers go back to the state they kept, its routing picks
    // are uncounted.
    const bool undo = n_keep + 1 == s.n_past && s.undo_end == s.n_past;
    if (m.recurrent) {
        if (n_keep == 0) {
            for (RecurrentState &r : s.rec)
                if (r.s[0] != nullptr) detail::reset_recurrent(m, r);
        } else if (undo) {
            for (RecurrentState &r : s.rec) r.cur = 1 - r.cur;
        } else {
            throw Error(CMF_ERR_UNSUPPORTED, fam + ": the gated delta net layers keep one position of history; going back from " +
                                                 std::to_string(s.n_past) + " to " + std::to_string(n_keep) +
                                                 " positions means forwarding the kept tokens again");
        }
    }
    if (undo)
        for (size_t i = 0; i < s.last_picks.size(); ++i)
            for (int32_t e : s.last_picks[i]) --s.route_counts[i][size_t(e)];
    for (auto &picks : s.last_picks) picks.clear();
    s.undo_end = 0;
    // The draft head's entry p drafted from token p + 1, which must be kept.
    s.n_past = n_keep;
    s.tokens.resize(std::min<size_t>(s.tokens.size(), n_keep));
    s.mtp_len = std::min(s.mtp_len, n_keep == 0 ? 0 : n_keep - 1);
}

std::string route_stats_json(const DecoderState &s) {
    std::string out = "{";
    bool first = true;
    for (size_t i = 0; i < s.route_counts.size(); ++i) {
        if (s.model->layers[i].ffn != FfnKind::Moe) continue;
        out += (first ? "\"" : ",\"") + std::to_string(i) + "\":[";
        first = false;
        for (size_t e = 0; e < s.route_counts[i].size(); ++e)
            out += (e ? "," : "") + std::to_string(s.route_counts[i][e]);
        out += "]";
    }
    return out + "}";
}

namespace detail {

void ensure_scratch(const DecoderModel &m, Scratch &sc, uint64_t n, uint64_t logit_rows) {
    auto alloc = [&](float *&p, uint64_t floats) {
        sc.be->buffer_free(sc.be_ctx, p);
        p = nullptr;
        if (floats > 0) check(sc.be->buffer_alloc(sc.be_ctx, floats * sizeof(float), &p));
    };
    if (n > sc.capacity) {
        const uint64_t H = m.cfg.hidden_size;
        // The draft head's eh_proj reads [enorm(e) | hnorm(h)]: 2H per token.
        alloc(sc.h, n * H);
        alloc(sc.xn, n * H * (m.mtp ? 2 : 1));
        alloc(sc.tmp, n * H);
        alloc(sc.q, n * m.q_dim);
        alloc(sc.attn, n * m.q_dim);
        alloc(sc.k, n * m.max_kv_dim);
        alloc(sc.v, n * m.max_kv_dim);
        alloc(sc.gate, n * m.max_ffn);
        alloc(sc.up, n * m.max_ffn);
        bool gated = false;
        for (const Layer &L : m.layers) gated |= L.mixer == MixerKind::GatedAttention;
        if (m.mtp) gated |= m.mtp->layer.mixer == MixerKind::GatedAttention;
        alloc(sc.qg, gated ? n * 2 * m.q_dim : 0);
        alloc(sc.ogate, gated ? n * m.q_dim : 0);
        // Mixture of experts: every token picks top_k experts (plus the
        // shared expert, one row per token).
        const uint64_t picks = n * m.max_top_k;
        alloc(sc.router, m.max_experts ? n * (m.max_experts + 1) : 0);
        alloc(sc.moe_x, picks * H);
        alloc(sc.moe_g, picks * m.max_expert_width + n * m.max_shared_width);
        alloc(sc.moe_u, picks * m.max_expert_width + n * m.max_shared_width);
        alloc(sc.moe_y, m.max_experts ? (picks + n) * H : 0);
        const DeltaNetDims &g = m.gdn;
        const bool lin = m.recurrent;
        alloc(sc.lin_qkv, lin ? n * g.conv_dim() : 0);
        alloc(sc.lin_conv, lin ? n * g.conv_dim() : 0);
        alloc(sc.lin_z, lin ? n * g.value_dim() : 0);
        alloc(sc.lin_out, lin ? n * g.value_dim() : 0);
        alloc(sc.lin_a, lin ? n * g.nv : 0);
        alloc(sc.lin_b, lin ? n * g.nv : 0);
        sc.capacity = n;
    }
    if (logit_rows > sc.logits_rows) {
        alloc(sc.logits, logit_rows * m.head.rows);
        sc.logits_rows = logit_rows;
    }
}

// y_i = x · W_i^T for weights that read the same x: one backend call when
// the backend fuses them (one parallel loop instead of one per weight).
void matmuls(const DecoderModel &m, const float *x, uint64_t n,
             std::initializer_list<std::pair<const cmf_backend_weight *, float *>> outs) {
    if (m.fused_matmuls && outs.size() <= 4) {
        const cmf_backend_weight *ws[4];
        float *ys[4];
        uint32_t k = 0;
        for (const auto &[w, y] : outs) ws[k] = w, ys[k++] = y;
        check(m.be->matmul_multi(m.be_ctx, ws, k, x, n, ys));
        return;
    }
    for (const auto &[w, y] : outs) check(m.be->matmul(m.be_ctx, w, x, n, y));
}

}  // namespace detail

namespace {

using detail::LayerCache;
using detail::matmuls;

// One sequence's rows in a pass: a single forward is a pass of one, a
// forward_batch of several laid end to end in the activations.
struct SeqRows {
    DecoderState *s = nullptr;
    const int32_t *tokens = nullptr;
    uint64_t n = 0;           // tokens
    uint64_t pos = 0;         // position of tokens[0] (= s->n_past)
    uint64_t row0 = 0;        // first row in the pass's activations
    uint64_t logit_rows = 0;  // 0, 1 (the last token) or n
    float *logits = nullptr;  // host, logit_rows * vocab_size floats
};

// sc.tmp = attention(sc.xn) over every sequence's rows, sequence i on the
// KV cache caches[i]: the projections, biases and q/k-norm run once over
// all rows; RoPE, the cache write and attention per sequence, at its
// positions and on its own cache. With an output gate
// (MixerKind::GatedAttention) q_proj gives [q_h | gate_h] per head and the
// attention's output is multiplied by sigmoid(gate).
void attention_block(const DecoderModel &m, Scratch &sc, const Layer &L, std::span<const SeqRows> seqs,
                     std::span<const LayerCache> caches, uint64_t n) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    const ArchConfig &c = m.cfg;
    const uint32_t nh = L.n_heads, nkv = L.n_kv_heads, hd = uint32_t(c.head_dim);
    const uint64_t q_dim = L.q_dim, kv_dim = L.kv_dim;
    const int32_t style = m.ch.norm_style;
    const float eps = float(c.rms_norm_eps);
    const bool gated = L.mixer == MixerKind::GatedAttention;
    matmuls(m, sc.xn, n, {{L.q.w, gated ? sc.qg : sc.q}, {L.k.w, sc.k}, {L.v.w, sc.v}});
    if (gated) {  // de-interleave: rows of head_dim, 2*head_dim apart
        check(be->copy_rows(bc, sc.q, hd, sc.qg, 2 * uint64_t(hd), n * nh, hd));
        check(be->copy_rows(bc, sc.ogate, hd, sc.qg + hd, 2 * uint64_t(hd), n * nh, hd));
    }
    if (L.q_bias) {
        check(be->add_bias(bc, sc.q, L.q_bias.w, n, q_dim));
        check(be->add_bias(bc, sc.k, L.k_bias.w, n, kv_dim));
        check(be->add_bias(bc, sc.v, L.v_bias.w, n, kv_dim));
    }
    if (L.q_norm) {
        check(be->rms_norm(bc, sc.q, L.q_norm.w, n * nh, hd, eps, style, sc.q));
        check(be->rms_norm(bc, sc.k, L.k_norm.w, n * nkv, hd, eps, style, sc.k));
    }
    // Row strides are this layer's widths (a task mask narrows them).
    const float scale = m.ch.attn_scale, softcap = m.ch.attn_softcap;
    const uint32_t window = L.choice.window;
    for (size_t i = 0; i < seqs.size(); ++i) {
        const SeqRows &r = seqs[i];
        const LayerCache &lc = caches[i];
        const DecoderState &s = *r.s;
        float *q = sc.q + r.row0 * q_dim, *k = sc.k + r.row0 * kv_dim, *v = sc.v + r.row0 * kv_dim;
        float *attn = sc.attn + r.row0 * q_dim;
        if (m.rot_dim > 0) {
            for (auto [x, ld, heads] : {std::tuple{q, q_dim, nh}, std::tuple{k, kv_dim, nkv}}) {
                if (s.rope && L.choice.scaled_rope) {  // HF's table for this call (the forward updated it)
                    const rope::Freqs &f = s.rope->current();
                    check(be->rope_freqs(bc, x, r.n, ld, heads, hd, m.rot_dim, r.pos, f.inv_freq.data(),
                                         f.attention_factor));
                } else {
                    check(be->rope(bc, x, r.n, ld, heads, hd, m.rot_dim, r.pos, L.choice.rope_theta));
                }
            }
        }
        if (lc.ring_rows > 0) {  // rows pos % R.., split where the ring wraps
            const uint64_t R = lc.ring_rows, r0 = r.pos % R, n1 = std::min(r.n, R - r0);
            for (auto [cache, src] : {std::pair{lc.k, k}, std::pair{lc.v, v}}) {
                check(be->kv_write(bc, cache, m.kv_dtype, kv_dim, r0, src, n1));
                if (n1 < r.n) check(be->kv_write(bc, cache, m.kv_dtype, kv_dim, 0, src + n1 * kv_dim, r.n - n1));
            }
            check(be->attention_ring(bc, q, lc.k, lc.v, m.kv_dtype, R, attn, r.n, r.pos, nh, nkv, hd, scale, window,
                                     softcap));
        } else if (m.kv_dtype == CMF_DTYPE_F32) {  // any backend: plain copies and attention
            check(be->copy(bc, lc.k + r.pos * kv_dim, k, r.n * kv_dim));
            check(be->copy(bc, lc.v + r.pos * kv_dim, v, r.n * kv_dim));
            check(be->attention(bc, q, lc.k, lc.v, attn, r.n, r.pos, nh, nkv, hd, scale, window, softcap));
        } else {
            check(be->kv_write(bc, lc.k, m.kv_dtype, kv_dim, r.pos, k, r.n));
            check(be->kv_write(bc, lc.v, m.kv_dtype, kv_dim, r.pos, v, r.n));
            check(be->attention_kv(bc, q, lc.k, lc.v, m.kv_dtype, attn, r.n, r.pos, nh, nkv, hd, scale, window,
                                   softcap));
        }
    }
    if (gated) check(be->gated_act(bc, sc.ogate, sc.attn, n * q_dim, CMF_ACT_SIGMOID, sc.attn));
    check(be->matmul(bc, L.o.w, sc.attn, n, sc.tmp));
    if (L.o_bias) check(be->add_bias(bc, sc.tmp, L.o_bias.w, n, c.hidden_size));
}

// sc.tmp = ffn(sc.xn).
void dense_ffn(const DecoderModel &m, Scratch &sc, const Layer &L, uint64_t n) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    matmuls(m, sc.xn, n, {{L.gate.w, sc.gate}, {L.up.w, sc.up}});
    check(be->gated_act(bc, sc.gate, sc.up, n * L.ffn_dim, m.ch.act, sc.gate));
    check(be->matmul(bc, L.down.w, sc.gate, n, sc.tmp));
}

// h += mixer(norm(h)); h += ffn(norm(h)) over every sequence's rows in sc.h.
// The gated delta net and the mixture of experts keep per-sequence state
// (recurrent state, routing counts): they get each sequence's rows and caches.
void run_layer_rows(const DecoderModel &m, Scratch &sc, const Layer &L, std::span<const SeqRows> seqs,
                    std::span<const LayerCache> caches, uint64_t n) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    const uint64_t H = m.cfg.hidden_size;
    const int32_t style = m.ch.norm_style;
    const float eps = float(m.cfg.rms_norm_eps);
    thread_local std::vector<detail::SeqPart> parts;
    if (L.mixer == MixerKind::DeltaNet || L.ffn == FfnKind::Moe) {
        parts.clear();
        for (size_t i = 0; i < seqs.size(); ++i) parts.push_back({seqs[i].s, &caches[i], seqs[i].row0, seqs[i].n});
    }
    // A task mask may leave a part out: it adds nothing, so it is skipped.
    if (L.attn_on) {
        check(be->rms_norm(bc, sc.h, L.in_norm.w, n, H, eps, style, sc.xn));
        switch (L.mixer) {
        case MixerKind::Attention:
        case MixerKind::GatedAttention: attention_block(m, sc, L, seqs, caches, n); break;
        case MixerKind::DeltaNet: detail::delta_net_mixer(m, sc, L, parts, n); break;
        }
        if (L.post_attn_norm) check(be->rms_norm(bc, sc.tmp, L.post_attn_norm.w, n, H, eps, style, sc.tmp));
        check(be->add(bc, sc.h, sc.tmp, n * H));
    }
    if (L.ffn_on) {
        check(be->rms_norm(bc, sc.h, L.pre_ffn_norm.w, n, H, eps, style, sc.xn));
        switch (L.ffn) {
        case FfnKind::Dense: dense_ffn(m, sc, L, n); break;
        case FfnKind::Moe: detail::moe_ffn(m, sc, L, parts, n); break;
        }
        if (L.post_ffn_norm) check(be->rms_norm(bc, sc.tmp, L.post_ffn_norm.w, n, H, eps, style, sc.tmp));
        check(be->add(bc, sc.h, sc.tmp, n * H));
    }
}

void check_step(const DecoderModel &m, const DecoderState &s, const DecoderStep &a) {
    const std::string fam = std::string(m.ch.family) + " forward";
    if (a.n_tokens != 0 && a.tokens == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL tokens");
    if (a.pos != s.n_past)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": pos " + std::to_string(a.pos) + " but the state holds " +
                                                  std::to_string(s.n_past) + " positions");
    if (a.pos + a.n_tokens > s.n_ctx)
        throw Error(CMF_ERR_BOUNDS, fam + ": " + std::to_string(a.pos + a.n_tokens) +
                                        " positions exceed the context of " + std::to_string(s.n_ctx));
    const int32_t mode = a.logits_mode;
    if (mode != CMF_LOGITS_NONE && mode != CMF_LOGITS_LAST && mode != CMF_LOGITS_ALL)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": unknown logits_mode " + std::to_string(mode));
    if (mode != CMF_LOGITS_NONE && a.logits == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL logits");
    if (a.n_layers > m.layers.size())
        throw Error(CMF_ERR_BOUNDS, fam + ": " + std::to_string(a.n_layers) + " layers asked of " +
                                        std::to_string(m.layers.size()));
    if (mode != CMF_LOGITS_NONE && !m.head)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": the model has no output head (an encoder gives hidden states only)");
    if (a.n_layers != 0 && a.n_layers < m.layers.size() && mode != CMF_LOGITS_NONE)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": logits need every layer (n_layers < num_layers gives hidden states only)");
    if (a.n_layers != 0 && a.n_layers < m.layers.size() && m.mtp)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": a partial forward (n_layers) with the draft head on (model option mtp=off)");
}

}  // namespace

namespace detail {

void run_layer(const DecoderModel &m, DecoderState &s, const Layer &L, const LayerCache &c, uint64_t n, uint64_t pos) {
    SeqRows r;
    r.s = &s;
    r.n = n;
    r.pos = pos;
    run_layer_rows(m, s.scratch, L, std::span<const SeqRows>(&r, 1), std::span<const LayerCache>(&c, 1), n);
}

}  // namespace detail

namespace {

// The tokens of every sequence through the layers, head and soft-cap, in
// the scratch `sc`; `n` rows in all. The draft head's bookkeeping (the
// final normed hidden state of every position) is for a pass of one
// sequence (decoder_forward_batch refuses a model with a draft head).
void forward_rows(DecoderModel &m, Scratch &sc, std::span<const SeqRows> seqs, uint64_t n, uint64_t n_layers,
                  float *hidden) {
    uint64_t logit_total = 0;
    for (const SeqRows &r : seqs) logit_total += r.logit_rows;
    detail::ensure_scratch(m, sc, n, logit_total);
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    const ArchConfig &c = m.cfg;
    const uint64_t H = c.hidden_size;
    const int32_t style = m.ch.norm_style;
    const float eps = float(c.rms_norm_eps);

    // A partial forward (failing midway) leaves no undoable position.
    for (const SeqRows &r : seqs) r.s->undo_end = 0;
    if (seqs.size() == 1) {
        check(be->embed(bc, m.embed.w, seqs[0].tokens, n, m.ch.embed_scale, sc.h));
    } else {
        std::vector<int32_t> tokens;
        tokens.reserve(n);
        for (const SeqRows &r : seqs) tokens.insert(tokens.end(), r.tokens, r.tokens + r.n);
        check(be->embed(bc, m.embed.w, tokens.data(), n, m.ch.embed_scale, sc.h));
    }
    std::vector<LayerCache> caches(seqs.size());
    for (size_t li = 0; li < n_layers; ++li) {
        for (size_t i = 0; i < seqs.size(); ++i) {
            DecoderState &s = *seqs[i].s;
            caches[i] = {s.k_cache[li], s.v_cache[li], &s.rec[li], li, s.ring[li] ? s.cache_rows[li] : 0};
        }
        run_layer_rows(m, sc, m.layers[li], seqs, caches, n);
        // A looped model with loop_final_norm: the final norm between passes.
        if (c.loop_final_norm && (li + 1) % m.physical_layers == 0 && li + 1 < m.layers.size())
            check(be->rms_norm(bc, sc.h, m.final_norm.w, n, H, eps, style, sc.h));
    }
    // Layers past n_layers are not run: their caches do not hold these positions.
    for (const SeqRows &r : seqs) r.s->n_past = r.s->undo_end = r.pos + r.n;
    if (hidden != nullptr) check(be->buffer_read(bc, hidden, sc.h, n * H * sizeof(float)));
    const bool draft_rows = m.mtp && seqs.size() == 1;
    if (draft_rows) {
        // The draft head reads the trunk's final normed hidden state of every
        // position (and its token): all rows go through the final norm.
        DecoderState &s = *seqs[0].s;
        const uint64_t pos = seqs[0].pos;
        check(be->rms_norm(bc, sc.h, m.final_norm.w, n, H, eps, style, sc.xn));
        check(be->copy(bc, s.mtp_hidden + pos * H, sc.xn, n * H));
        s.tokens.resize(pos);
        s.tokens.insert(s.tokens.end(), seqs[0].tokens, seqs[0].tokens + n);
    }
    if (logit_total == 0) return;
    // Only the rows whose logits are wanted go through the final norm and
    // the head: each sequence's last logit_rows rows, gathered in sc.xn
    // (already normed in place for the draft head), then one head matmul
    // for all of them.
    const float *normed = sc.xn;
    if (draft_rows) {
        normed = sc.xn + (n - logit_total) * H;
    } else {
        uint64_t out = 0;
        for (const SeqRows &r : seqs) {
            if (r.logit_rows == 0) continue;
            const float *hrows = sc.h + (r.row0 + r.n - r.logit_rows) * H;
            check(be->rms_norm(bc, hrows, m.final_norm.w, r.logit_rows, H, eps, style, sc.xn + out * H));
            out += r.logit_rows;
        }
    }
    check(be->matmul(bc, m.head.w, normed, logit_total, sc.logits));
    // Logits have vocab_size entries even when the head has fewer rows (extra = 0).
    const uint64_t V = c.vocab_size, R = m.head.rows;
    const float cap = m.ch.final_softcap;
    uint64_t out = 0;
    for (const SeqRows &s : seqs) {
        for (uint64_t r = 0; r < s.logit_rows; ++r, ++out) {
            float *dst = s.logits + r * V;
            check(be->buffer_read(bc, dst, sc.logits + out * R, R * sizeof(float)));
            if (cap > 0)  // as HF: divide, tanh, multiply, in f32
                for (uint64_t j = 0; j < R; ++j) dst[j] = std::tanh(dst[j] / cap) * cap;
            std::fill(dst + R, dst + V, 0.0f);
        }
    }
}

uint64_t logit_rows_of(int32_t mode, uint64_t n) {
    return mode == CMF_LOGITS_ALL ? n : mode == CMF_LOGITS_LAST ? 1 : 0;
}

}  // namespace

void decoder_forward(DecoderModel &m, DecoderState &s, const DecoderStep &a) {
    check_step(m, s, a);
    const uint64_t n = a.n_tokens;
    if (n == 0) return;
    const uint64_t n_layers = a.n_layers == 0 ? m.layers.size() : a.n_layers;
    const int32_t mode = a.logits_mode;
    // Dynamic NTK: HF's dynamic_rope_update runs once per forward call (not
    // per chunk below), for seq_len = the call's last position + 1.
    if (s.rope) s.rope->update(a.pos + n);
    // Rings hold the keys of at most s.chunk new tokens: longer calls run in chunks.
    const uint64_t chunk = std::find(s.ring.begin(), s.ring.end(), true) != s.ring.end() ? s.chunk : n;
    const uint64_t H = m.cfg.hidden_size, V = m.cfg.vocab_size;
    for (uint64_t c0 = 0; c0 < n; c0 += chunk) {
        const uint64_t cn = std::min(chunk, n - c0);
        const bool last = c0 + cn == n;
        SeqRows r;
        r.s = &s;
        r.tokens = a.tokens + c0;
        r.n = cn;
        r.pos = a.pos + c0;
        r.logit_rows = mode == CMF_LOGITS_ALL ? cn : (mode == CMF_LOGITS_LAST && last) ? 1 : 0;
        r.logits = mode == CMF_LOGITS_ALL ? a.logits + c0 * V : a.logits;
        forward_rows(m, s.scratch, std::span<const SeqRows>(&r, 1), cn, n_layers,
                     a.hidden != nullptr ? a.hidden + c0 * H : nullptr);
    }
}

void decoder_forward_batch(DecoderModel &m, std::span<DecoderState *const> states, std::span<const DecoderStep> steps) {
    const std::string fam = std::string(m.ch.family) + " forward_batch";
    if (states.size() != steps.size())
        throw Error(CMF_ERR_INTERNAL, fam + ": " + std::to_string(states.size()) + " states for " +
                                          std::to_string(steps.size()) + " steps");
    // Every layer kind runs per sequence where it keeps state (attention's
    // KV cache, the gated delta net's recurrent state, the experts' routing
    // counts: run_layer_rows). The draft head keeps per-state hidden rows
    // of a pass of one sequence: refused (also by a call of no sequences,
    // the probe hosts make).
    if (m.mtp) throw Error(CMF_ERR_UNSUPPORTED, fam + ": a model with its draft head on is not batched (model option mtp=off)");
    std::vector<SeqRows> seqs;
    seqs.reserve(states.size());
    uint64_t n = 0;
    for (size_t i = 0; i < states.size(); ++i) {
        DecoderState *s = states[i];
        const DecoderStep &a = steps[i];
        if (s == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL state " + std::to_string(i));
        if (s->model != &m) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": state " + std::to_string(i) + " belongs to another model");
        for (size_t j = 0; j < i; ++j)
            if (states[j] == s)
                throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": states " + std::to_string(j) + " and " + std::to_string(i) +
                                                          " are the same state");
        if (a.n_layers != 0 || a.hidden != nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": hidden states and partial layer stacks are for single forwards");
        check_step(m, *s, a);
        // A sliding layer's ring holds the keys of at most s->chunk new
        // tokens; a single forward splits longer calls, a batched pass does not.
        if (a.n_tokens > s->chunk && std::find(s->ring.begin(), s->ring.end(), true) != s->ring.end())
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": sequence " + std::to_string(i) + " has " +
                                                      std::to_string(a.n_tokens) + " tokens; with sliding-window rings a "
                                                      "batched pass takes at most " + std::to_string(s->chunk) + " per sequence");
        if (a.n_tokens == 0) continue;
        if (s->rope) s->rope->update(a.pos + a.n_tokens);  // once per call, as a single forward does
        SeqRows r;
        r.s = s;
        r.tokens = a.tokens;
        r.n = a.n_tokens;
        r.pos = a.pos;
        r.row0 = n;
        r.logit_rows = logit_rows_of(a.logits_mode, a.n_tokens);
        r.logits = a.logits;
        seqs.push_back(r);
        n += a.n_tokens;
    }
    if (seqs.empty()) return;
    forward_rows(m, states[0]->scratch, seqs, n, m.layers.size(), nullptr);
}

// ---- the cmf_arch_vt run members ----------------------------------------------

namespace {

ArchPlugin *plugin_of(void *ctx) { return static_cast<ArchPlugin *>(ctx); }

cmf_error *vt_model_create(void *ctx, const cmf_model_source *src, const cmf_backend_vt *backend, void *backend_ctx,
                           const cmf_arch_model_params *params, cmf_arch_model **out) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (src == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL argument");
        require_backend(backend, pl->family);
        // Options are checked before the arch block and any tensor.
        parse_model_options(backend, pl->family, params != nullptr ? params->options : nullptr);
        ArchConfig cfg = parse_arch_config(src->arch_json, src->arch_json_len);
        DecoderChoices ch = pl->choose(cfg);
        auto m = create_decoder(pl->host, src, backend, backend_ctx, params != nullptr ? params->options : nullptr, cfg,
                                std::move(ch));
        *out = reinterpret_cast<cmf_arch_model *>(m.release());
    });
}

void vt_model_free(void *, cmf_arch_model *model) { delete reinterpret_cast<DecoderModel *>(model); }

cmf_error *vt_model_info(void *ctx, const cmf_arch_model *model, cmf_arch_model_info *out) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL argument");
        const DecoderModel *m = reinterpret_cast<const DecoderModel *>(model);
        cmf_arch_model_info info{};
        info.struct_size = sizeof info;
        info.vocab_size = m->cfg.vocab_size;
        info.max_context = m->cfg.max_position_embeddings;
        info.draft_tokens = m->mtp ? 1 : 0;
        size_t n = std::min<size_t>(out->struct_size ? out->struct_size : sizeof info, sizeof info);
        uint32_t caller_size = out->struct_size;
        std::memcpy(out, &info, n);
        out->struct_size = caller_size ? caller_size : uint32_t(sizeof info);
    });
}

cmf_error *vt_state_create(void *ctx, cmf_arch_model *model, uint64_t n_ctx, cmf_arch_state **out) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL argument");
        auto s = create_decoder_state(*reinterpret_cast<DecoderModel *>(model), n_ctx);
        *out = reinterpret_cast<cmf_arch_state *>(s.release());
    });
}

void vt_state_free(void *, cmf_arch_state *state) { delete reinterpret_cast<DecoderState *>(state); }

cmf_error *vt_state_truncate(void *ctx, cmf_arch_state *state, uint64_t n_keep) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (state == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL state");
        truncate_decoder_state(*reinterpret_cast<DecoderState *>(state), n_keep);
    });
}

cmf_error *vt_forward(void *ctx, cmf_arch_model *model, cmf_arch_state *state, const cmf_forward_args *args) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || state == nullptr || args == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + " forward: NULL argument");
        DecoderStep step;
        step.tokens = args->tokens;
        step.n_tokens = args->n_tokens;
        step.pos = args->pos;
        step.logits_mode = args->logits_mode;
        step.logits = args->logits;
        if (args->struct_size >= offsetof(cmf_forward_args, hidden) + sizeof(float *)) {
            step.n_layers = args->n_layers;
            step.hidden = args->hidden;
        }
        decoder_forward(*reinterpret_cast<DecoderModel *>(model), *reinterpret_cast<DecoderState *>(state), step);
    });
}

cmf_error *vt_forward_batch(void *ctx, cmf_arch_model *model, uint32_t n_seqs, cmf_arch_state *const *states,
                            const cmf_forward_args *const *args) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        const std::string fam = std::string(pl->family) + " forward_batch";
        if (model == nullptr || (n_seqs != 0 && (states == nullptr || args == nullptr)))
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL argument");
        std::vector<DecoderState *> ss(n_seqs);
        std::vector<DecoderStep> steps(n_seqs);
        for (uint32_t i = 0; i < n_seqs; ++i) {
            const cmf_forward_args *a = args[i];
            if (a == nullptr || states[i] == nullptr)
                throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL state or args for sequence " + std::to_string(i));
            if (a->struct_size < offsetof(cmf_forward_args, logits) + sizeof(float *))
                throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": args " + std::to_string(i) + " has struct_size " +
                                                          std::to_string(a->struct_size));
            ss[i] = reinterpret_cast<DecoderState *>(states[i]);
            steps[i].tokens = a->tokens;
            steps[i].n_tokens = a->n_tokens;
            steps[i].pos = a->pos;
            steps[i].logits_mode = a->logits_mode;
            steps[i].logits = a->logits;
        }
        decoder_forward_batch(*reinterpret_cast<DecoderModel *>(model), ss, steps);
    });
}

cmf_error *vt_route_stats(void *ctx, const cmf_arch_state *state, const cmf_byte_sink *out) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (state == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL argument");
        const std::string json = route_stats_json(*reinterpret_cast<const DecoderState *>(state));
        cmf::sdk::sink_append(out, json.data(), json.size());
    });
}

cmf_error *vt_draft(void *ctx, cmf_arch_model *model, cmf_arch_state *state, int32_t next_token, float *logits) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || state == nullptr || logits == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + " draft: NULL argument");
        decoder_draft(*reinterpret_cast<DecoderModel *>(model), *reinterpret_cast<DecoderState *>(state), next_token, logits);
    });
}

}  // namespace

void set_decoder_run_members(cmf_arch_vt &vt) {
    vt.route_stats = vt_route_stats;
    vt.draft = vt_draft;
    vt.model_create = vt_model_create;
    vt.model_free = vt_model_free;
    vt.model_info = vt_model_info;
    vt.state_create = vt_state_create;
    vt.state_free = vt_state_free;
    vt.state_truncate = vt_state_truncate;
    vt.forward = vt_forward;
    vt.forward_batch = vt_forward_batch;
}

}  // namespace cmf::archs
