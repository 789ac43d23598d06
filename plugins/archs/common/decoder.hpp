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
// arch name: q/k/v biases, q/k-norm, sandwich norms. The layer is described
// by a mixer kind and an FFN kind so new layer types slot in as new kinds
// (MoE FFN, gated delta net mixer, output-gated attention); today those are
// refused with CMF_ERR_UNSUPPORTED naming the tensor or key.
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

enum class MixerKind { Attention };
enum class FfnKind { Dense };

struct Layer {
    MixerKind mixer = MixerKind::Attention;
    FfnKind ffn = FfnKind::Dense;
    LayerChoice choice;
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
};

struct DecoderModel {
    const cmf_host_api *host = nullptr;
    const cmf_backend_vt *be = nullptr;
    void *be_ctx = nullptr;
    ArchConfig cfg;
    DecoderChoices ch;
    uint32_t rot_dim = 0;
    uint64_t q_dim = 0, kv_dim = 0, max_ffn = 0;
    // The KV cache's element type (model option kv_cache): CMF_DTYPE_F32, or
    // CMF_DTYPE_F16 through the backend's kv_write / attention_kv.
    int32_t kv_dtype = CMF_DTYPE_F32;
    uint64_t kv_row_bytes() const { return kv_dim * (kv_dtype == CMF_DTYPE_F16 ? 2 : 4); }
    // The backend has matmul_multi: q/k/v and gate/up go as one call each.
    bool fused_matmuls = false;
    // cfg.rope_scaling is not default: its layers rotate through the
    // backend's rope_freqs with HF's table.
    bool scaled_rope = false;
    Weight embed, final_norm, head;  // head: none for an encoder (DecoderNames.head "")
    std::vector<Layer> layers;
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
    uint64_t logits_rows = 0;
    void release();
};

struct DecoderState {
    DecoderModel *model = nullptr;
    uint64_t n_ctx = 0;
    uint64_t n_past = 0;
    // Per layer: [rows][kv_dim] of model->kv_dtype; rows = n_ctx, or a
    // sliding layer's ring (position p in row p % rows).
    std::vector<float *> k_cache, v_cache;
    std::vector<uint64_t> cache_rows;
    std::vector<bool> ring;
    uint64_t chunk = 0;  // tokens per forward chunk (rings hold window + chunk - 1 rows)
    Scratch scratch;
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
// options ("kv_cache=f32|f16"). Throws cmf::sdk::Error.
std::unique_ptr<DecoderModel> create_decoder(const cmf_host_api *host, const cmf_model_source *src,
                                             const cmf_backend_vt *be, void *be_ctx, const char *options,
                                             const ArchConfig &cfg, DecoderChoices choices,
                                             const DecoderNames &names = {});

std::unique_ptr<DecoderState> create_decoder_state(DecoderModel &m, uint64_t n_ctx);

// Keep the first n_keep positions. A sliding layer's ring may no longer hold
// the window before n_keep: then CMF_ERR_UNSUPPORTED (the caller recomputes).
void truncate_decoder_state(DecoderState &s, uint64_t n_keep);

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
// to end, attention per sequence on its own cache. States are distinct
// states of `m`; the pass runs in the first state's scratch. Steps give all
// layers and no hidden states. A layer kind without a per-sequence step
// here is CMF_ERR_UNSUPPORTED.
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
