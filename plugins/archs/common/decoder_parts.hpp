// Internal to the shared decoder: the pieces decoder.cpp shares with the
// files of its other layer kinds (moe_ffn.cpp: the mixture-of-experts FFN;
// delta_net_mixer.cpp: the gated delta net mixer; mtp_head.cpp: the draft head).
#pragma once

#include "decoder.hpp"

#include <cmf/plugin.hpp>

#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

namespace cmf::archs::detail {

// Whether the backend's vtable has `member` (inside its struct_size, non-NULL).
#define CMF_BACKEND_HAS(be, member) ::cmf::archs::backend_has(be, offsetof(cmf_backend_vt, member), (be)->member)

// y_i = x · W_i^T for weights that read the same x: one backend call when
// the backend fuses them (one parallel loop instead of one per weight).
void matmuls(const DecoderModel &m, const float *x, uint64_t n,
             std::initializer_list<std::pair<const cmf_backend_weight *, float *>> outs);

// ---- mixture of experts (moe_ffn.cpp) ----
// A model with experts (*.mlp.experts.*): advises all its payloads' pages
// 4 KiB pages and no read-ahead, before anything is bound (see moe_ffn.cpp).
// True if the model has experts.
bool advise_expert_pages(const Binder &b);
// After binding, on a mapping advised 4 KiB pages (experts, a task mask):
// gives the 2 MiB-aligned interior of every weight bound whole (b.whole(),
// except experts and `skip`) its 2 MiB pages back (see moe_ffn.cpp).
void advise_whole_read_pages(const Binder &b, const std::string &skip);
// Binds layer p's router, experts and shared expert (mlp.gate.weight present).
void bind_moe(DecoderModel &m, Binder &b, const std::string &p, const std::string &where, Layer &L);
struct LayerCache;
// One sequence's rows in a pass, as a layer kind that keeps per-sequence
// state sees them: rows [row0, row0 + n) of the pass's activations belong
// to state s, whose caches for this layer are `cache`.
struct SeqPart {
    DecoderState *s = nullptr;
    const LayerCache *cache = nullptr;
    uint64_t row0 = 0, n = 0;
};
// sc.tmp = moe(sc.xn) over the n rows of every sequence in `seqs` (the
// experts' matmuls over all of them at once); counts each sequence's picks
// in layer cache->counted of its state (SIZE_MAX: not counted, the draft
// head's layer).
void moe_ffn(const DecoderModel &m, Scratch &sc, const Layer &L, std::span<const SeqPart> seqs, uint64_t n);

// ---- gated delta net (delta_net_mixer.cpp) ----
void bind_delta_net(DecoderModel &m, Binder &b, const std::string &p, const std::string &where, Layer &L);
// sc.tmp = gated_delta_net(sc.xn) over the n rows of every sequence in
// `seqs`: the projections over all rows at once, the convolution and the
// delta rule per sequence on its rows, advancing its cache->rec.
void delta_net_mixer(const DecoderModel &m, Scratch &sc, const Layer &L, std::span<const SeqPart> seqs, uint64_t n);
// Allocates and zeroes (reset) a layer's recurrent state.
void alloc_recurrent(const DecoderModel &m, RecurrentState &r);
void reset_recurrent(const DecoderModel &m, RecurrentState &r);
void free_recurrent(const DecoderModel &m, RecurrentState &r);

// ---- one decoder layer (decoder.cpp), shared by the trunk and the draft head ----
struct LayerCache {
    float *k = nullptr, *v = nullptr;  // attention's KV cache
    RecurrentState *rec = nullptr;     // a gated delta net's state
    size_t counted = SIZE_MAX;         // routing counts' layer
    uint64_t ring_rows = 0;            // a sliding layer's ring (attention_ring), else 0
};
// Binds layer `p` (e.g. "model.layers.3.", physical layer `index`) into L,
// with what `mask` (or NULL) leaves of visit `visit` (docs/tasks-and-skills.md).
void build_layer_at(DecoderModel &m, Binder &b, const std::string &p, size_t index, Layer &L,
                    const cmf_task_mask *mask = nullptr, uint64_t visit = 0);
// h += mixer(norm(h)); h += ffn(norm(h)) for n tokens at positions pos.. in sc.h.
void run_layer(const DecoderModel &m, DecoderState &s, const Layer &L, const LayerCache &c, uint64_t n, uint64_t pos);
// Scratch for n tokens and logit_rows rows of logits.
void ensure_scratch(const DecoderModel &m, Scratch &sc, uint64_t n, uint64_t logit_rows);

// ---- the draft head (mtp_head.cpp) ----
// Binds the head under body + "mtp." (DecoderNames.body).
void bind_mtp(DecoderModel &m, Binder &b, const std::string &body);
void alloc_mtp_state(DecoderModel &m, DecoderState &s);

}  // namespace cmf::archs::detail
