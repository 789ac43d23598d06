// The mixture-of-experts FFN (qwen2_moe, qwen3_moe, qwen3_next, qwen3_5_moe;
// HF's Qwen*SparseMoeBlock): per token
//     p = softmax(router x) over all experts (f32),
//     S = the top_k experts by p (ties to the lower index),
//     w_e = p_e, or p_e / sum over S of p (arch.moe.norm_topk_prob),
//     y = sum over e in S, ascending, of w_e * expert_e(x)
//       [+ sigmoid(shared_gate . x) * shared_expert(x)],
// every expert a gated FFN of its own width and dtypes.
//
// Which layers are sparse is read from the tensors (mlp.gate.weight), and
// the experts are enumerated 0, 1, ... by presence (a file whose unused
// experts were dropped has fewer; the router's rows must match).
//
// The routing runs on the host (the router's logits are read back: a
// token's experts decide which weights the backend reads). The experts of a
// forward call go to the backend grouped by expert: each selected expert
// gets one matmul over all of its tokens (matmul_grouped: a GEMM per expert
// in prefill; a decode token's experts as one parallel loop), and the
// weighted outputs are summed per token in expert order (scatter_rows). An
// expert no token picked is not read at all.
#include "decoder_parts.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace cmf::archs::detail {

using cmf::sdk::Error;

bool advise_expert_pages(const Binder &b) {
    // The host maps the file with 2 MiB pages, and a cold read through such
    // a mapping brings in far more than the touched bytes: the 2 MiB folio
    // around a touch and more read ahead of it. On a 16-layer, 32-expert
    // file, 85 % of the file was in the page cache after the first decoded
    // token, most of it experts no token picked (bench/expert_pages). Read
    // ahead works on file offsets, so a touch of any tensor next to an
    // expert (a norm copied at bind, an attention matrix) reads into it:
    // the advice covers every payload of a model that has experts, 4 KiB
    // pages and no read-ahead, given before anything is bound. Only the
    // pages a forward pass touches are read then, so a model whose experts
    // exceed the page cache keeps the unused ones on disk. Advice only: a
    // failure (payloads not in a file mapping, a kernel without the flags)
    // changes nothing and is ignored.
    const uint8_t *lo = nullptr, *hi = nullptr;
    bool experts = false;
    b.each([&](const std::string &name, const cmf_tensor_view &v) {
        if (v.data == nullptr || v.nbytes == 0) return;
        const auto *p = static_cast<const uint8_t *>(v.data);
        lo = lo ? std::min(lo, p) : p;
        hi = std::max(hi, p + v.nbytes);
        experts = experts || name.find(".mlp.experts.") != std::string::npos;
    });
    if (!experts) return false;
    static const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t first = reinterpret_cast<uintptr_t>(lo) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(hi) + page - 1) / page * page;
    (void)madvise(reinterpret_cast<void *>(first), end - first, MADV_NOHUGEPAGE);
    (void)madvise(reinterpret_cast<void *>(first), end - first, MADV_RANDOM);
    return true;
}

void advise_whole_read_pages(const Binder &b, const std::string &skip) {
    // 4 KiB pages cost a weight streamed whole about a fifth of its read
    // speed (TLB misses; the dense 0.6B q8 file's head 38.3 -> 30.8 GB/s
    // under a keep-everything task mask, docs/performance.md), and the
    // attention, the head and the FFN rows a mask keeps are read whole
    // every token. Their 2 MiB pages come back on the 2 MiB-aligned
    // interior of each such tensor only: the mapping keeps MADV_RANDOM, so
    // a fault there reads exactly the aligned 2 MiB folio around it
    // (VM_HUGEPAGE + VM_RAND_READ: no read-ahead beyond it), which lies
    // inside the tensor; the unaligned ends stay on 4 KiB pages, and no
    // read reaches an expert or a masked row. Advice only: failures are
    // ignored.
    constexpr uintptr_t kHuge = uintptr_t(2) << 20;
    for (const auto &[name, v] : b.whole()) {
        if (v.data == nullptr || name == skip || name.find(".mlp.experts.") != std::string::npos) continue;
        const uintptr_t a = (reinterpret_cast<uintptr_t>(v.data) + kHuge - 1) & ~(kHuge - 1);
        const uintptr_t e = (reinterpret_cast<uintptr_t>(v.data) + v.nbytes) & ~(kHuge - 1);
        if (e > a) (void)madvise(reinterpret_cast<void *>(a), e - a, MADV_HUGEPAGE);
    }
}

void bind_moe(DecoderModel &m, Binder &b, const std::string &p, const std::string &where, Layer &L) {
    const ArchConfig &c = m.cfg;
    const std::string fam = m.ch.family;
    const uint64_t H = c.hidden_size;
    if (!c.has_moe)
        throw Error(CMF_ERR_PARSE, where + "mlp.gate.weight (a mixture-of-experts router) is present but the header has no arch.moe");
    if (!CMF_BACKEND_HAS(m.be, matmul_grouped) || !CMF_BACKEND_HAS(m.be, gather_rows) || !CMF_BACKEND_HAS(m.be, scatter_rows))
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": backend '" + (m.be->name ? m.be->name : "?") +
                                             "' lacks the mixture-of-experts operations (matmul_grouped, gather_rows, scatter_rows)");
    auto expert = [&](uint64_t e) { return p + "mlp.experts." + std::to_string(e) + "."; };
    uint64_t E = 0;
    while (E < c.moe_num_experts && b.present(expert(E) + "gate_proj.weight")) ++E;
    if (E == 0) throw Error(CMF_ERR_MISSING_TENSOR, "missing tensor " + b.prefix() + expert(0) + "gate_proj.weight (the layer has a router)");
    for (uint64_t e = E + 1; e < c.moe_num_experts; ++e)
        if (b.present(expert(e) + "gate_proj.weight"))
            throw Error(CMF_ERR_MISSING_TENSOR, where + "mlp.experts." + std::to_string(e) + " is present but expert " +
                                                    std::to_string(E) + " is not (experts are numbered without gaps)");
    if (b.present(expert(c.moe_num_experts) + "gate_proj.weight"))
        throw Error(CMF_ERR_BOUNDS, where + "mlp.experts." + std::to_string(c.moe_num_experts) +
                                        " is present but arch.moe.num_experts is " + std::to_string(c.moe_num_experts));
    const cmf_tensor_view &rv = b.view(p + "mlp.gate.weight");
    if (rv.ndim != 2 || rv.shape[0] != E || rv.shape[1] != H)
        throw Error(CMF_ERR_BOUNDS, where + "mlp.gate.weight must be [" + std::to_string(E) + ", " + std::to_string(H) +
                                        "]: one router row per expert present (" + std::to_string(E) + ")");
    MoeWeights &mw = L.moe;
    mw.router = b.bind(p + "mlp.gate.weight", {E, H});
    for (uint64_t e = 0; e < E; ++e) {
        Expert x;
        x.gate = b.bind(expert(e) + "gate_proj.weight", {0, H});
        x.width = x.gate.rows;
        x.up = b.bind(expert(e) + "up_proj.weight", {x.width, H});
        x.down = b.bind(expert(e) + "down_proj.weight", {H, x.width});
        m.max_expert_width = std::max(m.max_expert_width, x.width);
        mw.experts.push_back(x);
    }
    const std::string sp = p + "mlp.shared_expert.";
    if (b.present(sp + "gate_proj.weight")) {
        mw.shared.gate = b.bind(sp + "gate_proj.weight", {0, H});
        mw.shared.width = mw.shared.gate.rows;
        mw.shared.up = b.bind(sp + "up_proj.weight", {mw.shared.width, H});
        mw.shared.down = b.bind(sp + "down_proj.weight", {H, mw.shared.width});
        m.max_shared_width = std::max(m.max_shared_width, mw.shared.width);
        if (b.present(p + "mlp.shared_expert_gate.weight")) mw.shared_gate = b.bind(p + "mlp.shared_expert_gate.weight", {1, H});
    } else if (b.present(p + "mlp.shared_expert_gate.weight")) {
        throw Error(CMF_ERR_MISSING_TENSOR, where + "mlp.shared_expert_gate.weight is present but mlp.shared_expert.gate_proj.weight is not");
    }
    // A file with experts dropped may have fewer than top_k: every expert then.
    mw.top_k = uint32_t(std::min<uint64_t>(c.moe_top_k, E));
    m.max_experts = std::max<uint64_t>(m.max_experts, E);
    m.max_top_k = std::max<uint64_t>(m.max_top_k, mw.top_k);
}

void moe_ffn(const DecoderModel &m, Scratch &sc, const Layer &L, std::span<const SeqPart> seqs, uint64_t n) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    const MoeWeights &mw = L.moe;
    // A task mask's expert row: top-k among the routable experts only (the
    // softmax still runs over all of them, as the router computes it); the
    // layer's top_k is at most their number.
    const uint64_t H = m.cfg.hidden_size, E = mw.experts.size(), k = mw.top_k;
    const bool shared = mw.shared.width > 0, gated = bool(mw.shared_gate);

    // 1. Router logits [n][E] (and the shared expert's gate logits [n]).
    if (gated)
        matmuls(m, sc.xn, n, {{mw.router.w, sc.router}, {mw.shared_gate.w, sc.router + n * E}});
    else
        check(be->matmul(bc, mw.router.w, sc.xn, n, sc.router));
    thread_local std::vector<float> logit;
    logit.resize(n * (E + 1));
    check(be->buffer_read(bc, logit.data(), sc.router, n * (E + (gated ? 1 : 0)) * sizeof(float)));

    // 2. Routing on the host: softmax over all experts, top-k, weights.
    thread_local std::vector<uint32_t> pick;  // [n][k] expert ids
    thread_local std::vector<float> weight;   // [n][k]
    thread_local std::vector<double> prob;
    thread_local std::vector<uint32_t> order;
    pick.resize(n * k), weight.resize(n * k), prob.resize(E);
    for (uint64_t t = 0; t < n; ++t) {
        const float *z = logit.data() + t * E;
        const float mx = *std::max_element(z, z + E);
        double sum = 0;
        for (uint64_t e = 0; e < E; ++e) sum += prob[e] = std::exp(double(z[e] - mx));
        for (uint64_t e = 0; e < E; ++e) prob[e] = double(float(prob[e] / sum));  // p in f32, as HF
        order.clear();
        for (uint32_t e = 0; e < E; ++e)
            if (L.routable(e)) order.push_back(e);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](uint32_t a, uint32_t b) {
            return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
        });
        double top = 0;
        for (uint64_t j = 0; j < k; ++j) top += prob[order[j]];
        for (uint64_t j = 0; j < k; ++j) {
            pick[t * k + j] = order[j];
            weight[t * k + j] = m.norm_topk ? float(prob[order[j]] / top) : float(prob[order[j]]);
        }
    }

    // 3. Pairs (token, weight) grouped by expert, experts ascending, tokens
    // ascending inside: the order the outputs are summed in.
    thread_local std::vector<uint64_t> first;  // [E + 1]: expert e's pairs
    thread_local std::vector<int32_t> rows;    // token of each pair, then the shared rows
    thread_local std::vector<float> w;
    first.assign(E + 1, 0);
    for (uint64_t i = 0; i < n * k; ++i) ++first[pick[i] + 1];
    for (uint64_t e = 0; e < E; ++e) first[e + 1] += first[e];
    const uint64_t P = n * k, R = P + (shared ? n : 0);
    rows.resize(R), w.resize(R);
    {
        thread_local std::vector<uint64_t> fill;
        fill.assign(first.begin(), first.end() - 1);
        for (uint64_t t = 0; t < n; ++t)
            for (uint64_t j = 0; j < k; ++j) {
                const uint64_t at = fill[pick[t * k + j]]++;
                rows[at] = int32_t(t);
                w[at] = weight[t * k + j];
            }
    }
    if (shared)
        for (uint64_t t = 0; t < n; ++t) {
            rows[P + t] = int32_t(t);
            w[P + t] = gated ? 1.0f / (1.0f + std::exp(-logit[n * E + t])) : 1.0f;
        }

    // 4. The experts' inputs: one token reads sc.xn directly; more are
    // gathered so each expert's tokens are contiguous.
    const float *xin = sc.xn;
    if (n > 1) {
        check(be->gather_rows(bc, sc.xn, H, rows.data(), P, sc.moe_x));
        xin = sc.moe_x;
    }
    thread_local std::vector<const cmf_backend_weight *> gw;
    thread_local std::vector<const float *> gx;
    thread_local std::vector<uint64_t> gn;
    thread_local std::vector<float *> gy;
    thread_local std::vector<uint64_t> act_off;  // per group: its gate/up rows' offset in moe_g/moe_u
    gw.clear(), gx.clear(), gn.clear(), gy.clear(), act_off.clear();
    uint64_t off = 0;
    auto add_expert = [&](const Expert &x, const float *in, uint64_t cnt) {
        act_off.push_back(off);
        gw.push_back(x.gate.w), gx.push_back(in), gn.push_back(cnt), gy.push_back(sc.moe_g + off);
        gw.push_back(x.up.w), gx.push_back(in), gn.push_back(cnt), gy.push_back(sc.moe_u + off);
        off += cnt * x.width;
    };
    thread_local std::vector<uint32_t> used;  // experts with tokens, ascending
    used.clear();
    for (uint32_t e = 0; e < E; ++e) {
        const uint64_t cnt = first[e + 1] - first[e];
        if (cnt == 0) continue;
        used.push_back(e);
        add_expert(mw.experts[e], n > 1 ? xin + first[e] * H : xin, cnt);
    }
    if (shared) add_expert(mw.shared, sc.xn, n);

    // 5. gate/up of every selected expert (and the shared one), the
    // activation over all of them, then their down projections.
    check(be->matmul_grouped(bc, uint32_t(gw.size()), gw.data(), gx.data(), gn.data(), gy.data()));
    check(be->gated_act(bc, sc.moe_g, sc.moe_u, off, m.ch.act, sc.moe_g));
    gw.clear(), gx.clear(), gn.clear(), gy.clear();
    for (size_t u = 0; u < used.size(); ++u) {
        const uint32_t e = used[u];
        gw.push_back(mw.experts[e].down.w), gx.push_back(sc.moe_g + act_off[u]);
        gn.push_back(first[e + 1] - first[e]), gy.push_back(sc.moe_y + first[e] * H);
    }
    if (shared) {
        gw.push_back(mw.shared.down.w), gx.push_back(sc.moe_g + act_off.back());
        gn.push_back(n), gy.push_back(sc.moe_y + P * H);
    }
    check(be->matmul_grouped(bc, uint32_t(gw.size()), gw.data(), gx.data(), gn.data(), gy.data()));

    // 6. Per token, the weighted outputs in expert order, the shared one last.
    check(be->scatter_rows(bc, sc.moe_y, R, H, rows.data(), w.data(), sc.tmp, n));

    // 7. Routing counts per sequence (the trunk's layers; each sequence's
    // last token's picks kept for its one-position rollback).
    for (const SeqPart &q : seqs) {
        const size_t counted = q.cache->counted;
        if (counted == SIZE_MAX || q.n == 0) continue;
        std::vector<uint64_t> &cnt = q.s->route_counts[counted];
        for (uint64_t i = q.row0 * k; i < (q.row0 + q.n) * k; ++i) ++cnt[pick[i]];
        q.s->last_picks[counted].assign(pick.begin() + (q.row0 + q.n - 1) * k, pick.begin() + (q.row0 + q.n) * k);
    }
}

}  // namespace cmf::archs::detail
