// The decoder shared by the transformer families (qwen, gemma; the text
// encoder of lumina2 reuses it): embedding, a stack of layers, final norm and
// head, computed only through the backend vtable it is given, so any backend
// runs it.
//
// One skeleton, with the family's choices as parameters (DecoderChoices):
//     h = embed(t) * embed_scale
//     per layer:  h += [post_attn_norm] mixer(in_norm(h))
//                 h += [post_ffn_norm]  ffn(pre_ffn_norm(h))
//     logits = final_softcap(head(final_norm(h)))
// Qwen: norms x^*w, SwiGLU, 1/sqrt(head_dim). Gemma: norms x^*(1+w), GeGLU,
// embedding x sqrt(hidden), sandwich norms (gemma2/3: the bracketed norms
// exist), query_pre_attn_scalar, soft-capping, sliding-window layers with
// their own RoPE base.
//
// What a layer computes is read from its tensors (spec 2), not from the
// arch name: q/k/v biases, q/k-norm, sandwich norms, the output gate of
// attention (q_proj of twice the rows), a mixture-of-experts FFN
// (mlp.gate.weight). A layer is a mixer kind (attention, output-gated
// attention, gated delta net: delta_net_mixer.cpp) and an FFN kind (dense,
// mixture of experts: moe_ffn.cpp). A model with model.mtp.* tensors (under
// DecoderNames.body) gets a draft head for speculative decoding (mtp_head.cpp).
//
// A task mask (cmf_task_mask of the model source) is applied when the
// layers are bound: a layer gated off is skipped, the live heads' and
// neurons' rows (and the output projections' matching columns) are bound
// as subsets (backend weight_bind_subset), so left-out heads and neurons
// are neither computed nor read. A looped model (arch.num_loops) runs its
// layers num_loops times; each visit is a Layer here with its own KV cache
// and its own FFN mask row.
//
// Sliding-window layers keep their K/V in a ring of window + chunk - 1 rows
// (when the backend has attention_ring), so their memory is bounded by the
// window, not the context; a forward call longer than `chunk` tokens runs
// in chunks.
#pragma once

#include "arch_config.hpp"
#include "binder.hpp"

#include <cmf/cmf_plugin.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace cmf::archs {

// Per-layer choices of a family.
struct LayerChoice {
    uint32_t window = 0;       // 0: full causal attention; else the last `window` positions (self included)
    float rope_theta = 10000;  // RoPE base of this layer
    // arch.rope_scaling applies to this layer (its base is rope_theta); false
    // for layers on another base (Gemma 3's local layers run unscaled RoPE).
    bool scaled_rope = true;
};

// A family's decoder, decided from its arch block.
struct DecoderChoices {
    const char *family = "decoder";  // prefix of error messages
    int32_t norm_style = CMF_NORM_QWEN;
    int32_t act = CMF_ACT_SILU;
    float embed_scale = 1.0f;
    float attn_scale = 0;      // multiplies q.k
    float attn_softcap = 0;    // 0: none, else c*tanh(s/c) on scores
    float final_softcap = 0;   // 0: none, else c*tanh(l/c) on logits
    std::vector<LayerChoice> layers;
};

// Attention, attention with a sigmoid output gate (q_proj rows hold
// [q_h | gate_h] per head), or a gated delta net (linear attention).
enum class MixerKind { Attention, GatedAttention, DeltaNet };
// A dense gated FFN, or a mixture of experts.
enum class FfnKind { Dense, Moe };

struct Expert {
    Weight gate, up, down;
    uint64_t width = 0;  // gate_proj rows
};

struct MoeWeights {
    Weight router;               // mlp.gate.weight [E, H]
    std::vector<Expert> experts;  // 0..E-1, found by presence
    Expert shared;               // mlp.shared_expert.* (absent: width 0)
    Weight shared_gate;          // mlp.shared_expert_gate.weight [1, H], sigmoid-gated
    uint32_t top_k = 0;          // arch.moe.top_k, at most the experts present
};

struct DeltaNetWeights {
    Weight qkv, z, b, a;   // in_proj_*
    Weight conv;           // conv1d taps as one vector of conv_dim * kernel (Binder::bind_values)
    Weight a_log, dt_bias;
    Weight norm;           // the gated RMSNorm's [dv] weight (x^*w)
    Weight out;            // out_proj
};

struct Layer {
    MixerKind mixer = MixerKind::Attention;
    FfnKind ffn = FfnKind::Dense;
    LayerChoice choice;
    uint64_t physical = 0;  // the layer whose weights this visit runs
    // What a task mask leaves of the block: a layer gated off runs nothing
    // (the residual passes, no KV is written); with no live head attention
    // adds nothing, with no live neuron the FFN adds nothing.
    bool alive = true, attn_on = true, ffn_on = true;
    // Query and KV heads this layer computes: all, or a mask's live heads
    // (KV heads: the groups they read, one per live head when the live
    // heads are spread unevenly over the groups).
    uint32_t n_heads = 0, n_kv_heads = 0;
    uint64_t q_dim = 0, kv_dim = 0;
    // A MoE FFN's routable experts under a task mask: bit e (LSB-first) of
    // byte e / 8; empty = every expert. Routing picks top-k among these only.
    std::vector<uint8_t> routable_experts;
    bool routable(uint64_t e) const {
        return routable_experts.empty() ||
               (e / 8 < routable_experts.size() && ((routable_experts[e / 8] >> (e % 8)) & 1));
    }
    Weight in_norm;         // before the mixer
    Weight post_attn_norm;  // sandwich: on the mixer's output (post_attention_layernorm)
    Weight pre_ffn_norm;    // before the FFN (post_attention_layernorm, or pre_feedforward_layernorm in a sandwich)
    Weight post_ffn_norm;   // sandwich: on the FFN's output
    Weight q, k, v, o;
    Weight q_bias, k_bias, v_bias;  // all or none
    Weight o_bias;                  // attention_bias (qwen3, gemma): o_proj's bias too
    Weight q_norm, k_norm;          // both or none
    Weight gate, up, down;
    uint64_t ffn_dim = 0;
    MoeWeights moe;       // FfnKind::Moe
    DeltaNetWeights gdn;  // MixerKind::DeltaNet
};

// The gated delta net geometry (arch.linear_*).
struct DeltaNetDims {
    uint32_t nk = 0, nv = 0, dk = 0, dv = 0, kernel = 0;
    uint64_t conv_dim() const { return 2 * uint64_t(nk) * dk + uint64_t(nv) * dv; }
    uint64_t value_dim() const { return uint64_t(nv) * dv; }
    uint64_t state_floats() const { return uint64_t(nv) * dk * dv; }
};

// The multi-token-prediction head (model.mtp.*): e = embed(t_{p+1}),
// x = eh_proj [enorm(e) | hnorm(h_p)], one decoder layer at position p
// (its own KV cache), norm, the shared head: the draft for t_{p+2}.
struct MtpHead {
    Weight enorm, hnorm, eh_proj, norm;
    Layer layer;
};

struct DecoderModel {
    const cmf_host_api *host = nullptr;
    const cmf_backend_vt *be = nullptr;
    void *be_ctx = nullptr;
    ArchConfig cfg;
    DecoderChoices ch;
    uint32_t rot_dim = 0;
    uint64_t q_dim = 0, kv_dim = 0, max_ffn = 0;
    uint64_t max_kv_dim = 0;      // the widest layer's K/V (a task mask can spread KV heads)
    uint64_t physical_layers = 0; // arch.num_layers; layers.size() = physical_layers * num_loops
    std::string task;             // the task mask applied ("" = none)
    // The KV cache's element type (model option kv_cache): CMF_DTYPE_F32, or
    // CMF_DTYPE_F16 / CMF_KV_DTYPE_Q8_32 through the backend's kv_write /
    // attention_kv.
    int32_t kv_dtype = CMF_DTYPE_F32;
    uint64_t kv_row_bytes(const Layer &l) const {
        if (kv_dtype == CMF_KV_DTYPE_Q8_32) return CMF_KV_Q8_32_ROW_BYTES(l.kv_dim);
        return l.kv_dim * (kv_dtype == CMF_DTYPE_F16 ? 2 : 4);
    }
    // The backend has matmul_multi: q/k/v and gate/up go as one call each.
    bool fused_matmuls = false;
    // cfg.rope_scaling is not default: its layers rotate through the
    // backend's rope_freqs with HF's table.
    bool scaled_rope = false;
    Weight embed, final_norm, head;  // head: none for an encoder (DecoderNames.head "")
    std::vector<Layer> layers;
    // Mixture of experts: renormalise the top-k weights (arch.moe.norm_topk_prob).
    bool norm_topk = false;
    uint64_t max_experts = 0, max_expert_width = 0, max_shared_width = 0, max_top_k = 0;
    DeltaNetDims gdn;
    bool recurrent = false;  // some layer is a gated delta net
    std::unique_ptr<MtpHead> mtp;  // model option mtp (on when the file has the head)
    std::vector<cmf_backend_weight *> owned;
    // Tokens per forward chunk when sliding layers keep rings: the largest
    // window (a prompt of a window's length runs in one call).
    uint64_t ring_chunk() const {
        uint64_t w = 0;
        for (const Layer &l : layers) w = std::max<uint64_t>(w, l.choice.window);
        return std::max<uint64_t>(w, 1);
    }

    DecoderModel() = default;
    DecoderModel(const DecoderModel &) = delete;
    DecoderModel &operator=(const DecoderModel &) = delete;
    ~DecoderModel();
};

// Reusable device scratch, grown to the largest batch seen.
struct Scratch {
    const cmf_backend_vt *be = nullptr;
    void *be_ctx = nullptr;
    uint64_t capacity = 0;  // tokens
    float *h = nullptr, *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr, *gate = nullptr,
          *up = nullptr, *tmp = nullptr, *logits = nullptr;
    // Output-gated attention: q_proj's output and the gate heads.
    float *qg = nullptr, *ogate = nullptr;
    // Mixture of experts: router logits (and the shared expert's gate), the
    // gathered inputs, the experts' gate/up/act, their outputs.
    float *router = nullptr, *moe_x = nullptr, *moe_g = nullptr, *moe_u = nullptr, *moe_y = nullptr;
    // Gated delta net: projections, convolved qkv, the rule's output.
    float *lin_qkv = nullptr, *lin_z = nullptr, *lin_a = nullptr, *lin_b = nullptr, *lin_conv = nullptr,
          *lin_out = nullptr;
    uint64_t logits_rows = 0;
    void release();
};

// One gated delta net layer's state: the short convolution's last inputs
// and the recurrent state, two of each: [cur] is the state after every
// position, [1 - cur] after all but the last one (the one-position rollback).
struct RecurrentState {
    float *conv[2] = {nullptr, nullptr};  // [kernel - 1][conv_dim]
    float *s[2] = {nullptr, nullptr};     // [nv][dk][dv]
    int cur = 0;
};

struct DecoderState {
    DecoderModel *model = nullptr;
    uint64_t n_ctx = 0;
    uint64_t n_past = 0;
    // Per layer: [rows][kv_dim] of model->kv_dtype; rows = n_ctx, or a
    // sliding layer's ring (position p in row p % rows). All of them lie in
    // kv_block, one backend buffer.
    std::vector<float *> k_cache, v_cache;
    float *kv_block = nullptr;
    std::vector<uint64_t> cache_rows;
    std::vector<bool> ring;
    uint64_t chunk = 0;  // tokens per forward chunk (rings hold window + chunk - 1 rows)
    Scratch scratch;
    // Per layer (empty for attention layers): gated delta net state.
    std::vector<RecurrentState> rec;
    // n_past right after the last forward call (0 after a truncate): its
    // last position may be rolled back by one.
    uint64_t undo_end = 0;
    // Per MoE layer (empty for dense ones): times each expert was picked,
    // and the last forwarded token's picks (uncounted by a rollback).
    std::vector<std::vector<uint64_t>> route_counts;
    std::vector<std::vector<int32_t>> last_picks;
    // The draft head (DecoderModel::mtp): its KV cache, the trunk's final
    // normed hidden state and token of every position, and how many
    // positions its cache holds.
    float *mtp_k = nullptr, *mtp_v = nullptr, *mtp_hidden = nullptr;
    std::vector<int32_t> tokens;
    uint64_t mtp_len = 0;
    // The scaled RoPE table HF's rotary embedding holds, per state as a
    // freshly loaded HF model holds it (dynamic NTK changes it as sequences
    // grow: rope::Dynamic); unset without scaling.
    std::optional<rope::Dynamic> rope;

    DecoderState() = default;
    DecoderState(const DecoderState &) = delete;
    DecoderState &operator=(const DecoderState &) = delete;
    ~DecoderState();
};

// Where a decoder's tensors are. A converted checkpoint names them
// "model.embed_tokens.weight", "model.layers.{i}.*", "model.norm.weight" and
// "lm_head.weight"; a pipeline's text encoder keeps them under its own
// prefix with Hugging Face's "model." left out ("te.layers.{i}.*") and has
// no head.
struct DecoderNames {
    std::string body = "model.";          // before embed_tokens.weight, layers.{i}., norm.weight, mtp.
    std::string head = "lm_head.weight";  // "": none, the model gives hidden states only (an encoder)
};

// Binds the tensors of `src` on the backend. `options` are the model
// options ("kv_cache=f32|f16,mtp=on|off"). Throws cmf::sdk::Error.
std::unique_ptr<DecoderModel> create_decoder(const cmf_host_api *host, const cmf_model_source *src,
                                             const cmf_backend_vt *be, void *be_ctx, const char *options,
                                             const ArchConfig &cfg, DecoderChoices choices,
                                             const DecoderNames &names = {});

std::unique_ptr<DecoderState> create_decoder_state(DecoderModel &m, uint64_t n_ctx);

// Keep the first n_keep positions. A sliding layer's ring may no longer hold
// the window before n_keep, and gated delta net layers keep one position of
// history (the last forward call's last token): then CMF_ERR_UNSUPPORTED
// (the caller recomputes).
void truncate_decoder_state(DecoderState &s, uint64_t n_keep);

// The routing counts as compact JSON {"<layer>":[counts],...} (MoE layers only).
std::string route_stats_json(const DecoderState &s);

// The draft head's logits for position n_past + 1 given the token chosen for
// n_past (cmf_arch_vt.draft). CMF_ERR_UNSUPPORTED without a draft head.
void decoder_draft(DecoderModel &m, DecoderState &s, int32_t next_token, float *logits);

struct DecoderStep {
    const int32_t *tokens = nullptr;  // host memory
    uint64_t n_tokens = 0;
    uint64_t pos = 0;                 // must equal the state's n_past
    int32_t logits_mode = CMF_LOGITS_NONE;
    float *logits = nullptr;          // host, per logits_mode
    // Run only the first n_layers layers (0: all). With fewer than all, no
    // logits: the output is `hidden`, and the layers not run keep nothing of
    // these positions, so the state serves only later calls with the same
    // n_layers (an encoder truncates it to 0 per prompt).
    uint64_t n_layers = 0;
    // Host memory for n_tokens * hidden_size floats, or NULL: the residual
    // stream after the layers run (before the final norm). HF's
    // hidden_states[-2] is the output with n_layers = num_layers - 1.
    float *hidden = nullptr;
};

void decoder_forward(DecoderModel &m, DecoderState &s, const DecoderStep &step);

// steps[i] on states[i], all in one pass (cmf_arch_vt.forward_batch): the
// matmuls and element-wise operations over every sequence's tokens laid end
// to end, attention per sequence on its own cache, a gated delta net's
// convolution and recurrence per sequence on its own state, the experts'
// routing counted per sequence. States are distinct states of `m`; the
// pass runs in the first state's scratch. Steps give all layers and no
// hidden states. A model with its draft head on is CMF_ERR_UNSUPPORTED.
void decoder_forward_batch(DecoderModel &m, std::span<DecoderState *const> states, std::span<const DecoderStep> steps);

// ---- the cmf_arch_vt run members over this decoder ----
// A family plugin's state begins with ArchPlugin; `choose` decides the
// decoder from the arch block (throwing for what the family does not run).
struct ArchPlugin {
    const cmf_host_api *host = nullptr;
    cmf_arch_vt vt{};
    const char *family = "decoder";
    DecoderChoices (*choose)(const ArchConfig &cfg) = nullptr;
};

// Sets model_create .. forward of `vt`; their ctx must be the ArchPlugin.
void set_decoder_run_members(cmf_arch_vt &vt);

}  // namespace cmf::archs
