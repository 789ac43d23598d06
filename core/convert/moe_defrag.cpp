#include "convert/moe_defrag.hpp"

#include "common/dtype_name.hpp"
#include "common/error.hpp"
#include "common/hash64.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"
#include "container/writer.hpp"
#include "convert/defrag.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/moe_stats.hpp"

#include <boost/json.hpp>

#include <cmf/cmf.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

namespace cmf::convert {

namespace bj = boost::json;
namespace fs = std::filesystem;
using container::Model;
using container::TensorRec;

namespace {

[[noreturn]] void bad(const std::string &m) { throw Error(CMF_ERR_INVALID_ARGUMENT, m); }

std::string layer_prefix(uint64_t l) { return "model.layers." + std::to_string(l) + ".mlp."; }

// "model.layers.L.mlp.experts.E.REST" -> (L, E, REST).
bool expert_parts(const std::string &name, uint64_t &layer, uint64_t &expert, std::string &rest) {
    auto number = [&](size_t &i, uint64_t &out) {
        const size_t start = i;
        out = 0;
        while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - start < 9) out = out * 10 + uint64_t(name[i++] - '0');
        return i > start;
    };
    static const std::string head = "model.layers.", mid = ".mlp.experts.";
    if (name.compare(0, head.size(), head) != 0) return false;
    size_t i = head.size();
    if (!number(i, layer) || name.compare(i, mid.size(), mid) != 0) return false;
    i += mid.size();
    if (!number(i, expert) || i >= name.size() || name[i] != '.') return false;
    rest = name.substr(i + 1);
    return true;
}

// A MoE model, its routed layers with how many experts each holds (the
// router's rows), and the stats checked against them.
struct Plan {
    Model m;
    std::map<uint64_t, uint64_t> experts;           // MoE layer -> experts present
    runtime::MoeStats stats;
    std::string stats_origin;
    std::map<uint64_t, std::vector<uint32_t>> keep;  // layer -> kept experts, ascending (layers with routing)
};

void open_plan(Runtime &rt, const MoeDefragOptions &o, const char *tool, bool provenance_stats, Plan &p) {
    if (o.input.empty() || o.output.empty()) bad(std::string(tool) + ": the input and the output are required");
    if (!(o.cover > 0 && o.cover <= 1)) bad(std::string(tool) + ": cover must be in (0, 1], not " + container::json::format_f64(o.cover));
    if (fs::exists(o.output) && fs::weakly_canonical(o.output) == fs::weakly_canonical(o.input))
        bad(std::string(tool) + ": the output must differ from the input");
    Model::open(p.m, rt, o.input, 0);
    const auto &arch = p.m.header().arch;
    for (uint64_t l = 0; l < arch.num_layers; ++l) {
        const TensorRec *router = p.m.find(layer_prefix(l) + "gate.weight");
        if (router == nullptr) continue;
        if (router->ndim != 2) throw Error(CMF_ERR_BOUNDS, router->name + ": a router must be 2-D [experts, hidden]");
        p.experts[l] = router->shape[0];
    }
    if (!arch.has_moe || arch.moe_num_experts == 0 || p.experts.empty())
        bad(o.input + ": not a mixture-of-experts model (" +
            (arch.has_moe ? std::string("no layer has a router, mlp.gate.weight") : std::string("the header has no arch.moe")) + ")");
    if (!o.stats.empty()) {
        p.stats = runtime::read_moe_stats(o.stats);
        p.stats_origin = "MoE stats '" + o.stats + "'";
    } else if (provenance_stats) {
        const bj::value prov = p.m.header().provenance_json.empty() ? bj::value() : bj::parse(p.m.header().provenance_json);
        const bj::value *counts = nullptr;
        if (prov.is_object())
            if (const bj::value *d = prov.as_object().if_contains("moe_defrag"); d != nullptr && d->is_object())
                counts = d->as_object().if_contains("routing_counts");
        if (counts == nullptr)
            bad(o.input + ": no stats file given and the file carries no routing counts (provenance.moe_defrag.routing_counts); "
                          "record them with run --route-stats FILE");
        p.stats_origin = o.input + ": provenance.moe_defrag.routing_counts";
        p.stats = runtime::parse_moe_stats(bj::serialize(*counts), p.stats_origin);
    } else {
        bad(std::string(tool) + ": a stats file is required (record one with run --route-stats FILE)");
    }
    // Stats of another model are refused whole, before anything is written.
    for (const auto &[layer, counts] : p.stats.counts) {
        if (layer >= arch.num_layers)
            bad(p.stats_origin + ": layer " + std::to_string(layer) + ", but the model has " + std::to_string(arch.num_layers) +
                " layers (stats of another model?)");
        auto it = p.experts.find(layer);
        if (it == p.experts.end())
            bad(p.stats_origin + ": layer " + std::to_string(layer) + " has no experts in this model (stats of another model?)");
        if (counts.size() != it->second)
            bad(p.stats_origin + ": layer " + std::to_string(layer) + " has " + std::to_string(counts.size()) +
                " counts, but the layer holds " + std::to_string(it->second) + " experts (stats of another model?)");
        std::vector<uint32_t> kept = runtime::covering_experts(counts, o.cover);
        if (!kept.empty()) p.keep[layer] = std::move(kept);  // nothing routed: the layer stays as it is
    }
    if (p.keep.empty()) bad(p.stats_origin + ": no layer has a nonzero count (nothing was routed)");
}

std::string cover_percent(double cover) {
    char b[32];
    std::snprintf(b, sizeof b, "%.0f%%", cover * 100.0);
    return b;
}

bj::object header_for_rewrite(const Model &m) {
    bj::value parsed = bj::parse(m.header_text());
    bj::object h = parsed.as_object();
    h.erase("section_hashes");
    h.erase("shard");  // one file out
    return h;
}

void set_bit(std::vector<uint8_t> &v, uint64_t at) { v[at / 8] |= uint8_t(1u << (at % 8)); }
bool get_bit(const uint8_t *v, uint64_t at) { return (v[at / 8] >> (at % 8)) & 1u; }

}  // namespace

std::string moe_defrag(Runtime &rt, const MoeDefragOptions &o) {
    auto say = [&](const std::string &s) {
        if (o.say) o.say(s);
    };
    Plan p;
    open_plan(rt, o, "moe-defrag", true, p);
    const Model &m = p.m;
    const auto &arch = m.header().arch;
    // Old expert index -> new, per cut layer.
    std::map<uint64_t, std::map<uint64_t, uint64_t>> renumber;
    uint64_t dropped_experts = 0;
    for (const auto &[layer, kept] : p.keep) {
        auto &r = renumber[layer];
        for (size_t i = 0; i < kept.size(); ++i) r[kept[i]] = i;
        dropped_experts += p.experts.at(layer) - kept.size();
    }
    if (dropped_experts == 0)
        bad("moe-defrag: at cover " + container::json::format_f64(o.cover) + " every expert is kept; nothing to drop");

    // The routers and selection biases of cut layers, gathered in the kept order.
    std::map<std::string, SlicedTensor> gathered;
    for (const auto &[layer, kept] : p.keep)
        for (const char *n : {"gate.weight", "expert_bias"}) {
            const TensorRec *t = m.find(layer_prefix(layer) + n);
            if (t == nullptr) continue;
            if (t->shape[0] != p.experts.at(layer))
                throw Error(CMF_ERR_BOUNDS, t->name + ": " + std::to_string(t->shape[0]) + " rows for " +
                                                std::to_string(p.experts.at(layer)) + " experts");
            SlicedTensor s = take_rows(rt, m, *t, kept);
            if (!s.exact)
                throw Error(CMF_ERR_UNSUPPORTED, t->name + ": its dtype (" + dtype_name(t->dtype) +
                                                     ") cannot give rows byte for byte; a re-encoded router would route differently");
            gathered.emplace(t->name, std::move(s));
        }

    bj::object header = header_for_rewrite(m);
    bj::array kept_per_layer;
    bj::object routing_counts;
    uint64_t kept_experts = 0;
    for (const auto &[layer, kept] : p.keep) {
        kept_per_layer.push_back(kept.size());
        kept_experts += kept.size();
        bj::array c;
        for (uint32_t e : kept) c.push_back(p.stats.counts.at(layer)[e]);
        routing_counts[std::to_string(layer)] = std::move(c);
    }
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(hash64(p.stats.text.data(), p.stats.text.size())));
    if (!header.contains("provenance") || !header["provenance"].is_object()) header["provenance"] = bj::object{};
    header["provenance"].as_object()["moe_defrag"] =
        bj::object{{"cover", o.cover},
                   {"kept_per_layer", kept_per_layer},
                   {"num_experts_pre", arch.moe_num_experts},
                   {"routing_counts", routing_counts},
                   {"stats_hash64", hash},
                   {"tool", std::string("cmfhost moe-defrag ") + cmf_version_string()}};

    std::optional<std::string> default_task;
    if (!m.masks().empty()) default_task = m.default_task();
    container::Writer w(rt, o.output, container::json::emit_header(header), 0, default_task);
    std::vector<std::string> names;  // renamed experts' names, alive until finish
    names.reserve(m.tensors().size());
    uint64_t dropped_tensors = 0;
    for (const auto &t : m.tensors()) {
        if (auto g = gathered.find(t.name); g != gathered.end()) {
            const SlicedTensor &s = g->second;
            w.add_tensor(t.name, s.dtype, uint32_t(s.shape.size()), s.shape.data(), s.bytes.data(), s.bytes.size());
            continue;
        }
        uint64_t layer = 0, expert = 0;
        std::string rest;
        if (expert_parts(t.name, layer, expert, rest)) {
            if (auto r = renumber.find(layer); r != renumber.end()) {
                auto e = r->second.find(expert);
                if (e == r->second.end()) {
                    ++dropped_tensors;
                    continue;
                }
                names.push_back("model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e->second) + "." + rest);
                w.add_tensor(names.back(), t.dtype, t.ndim, t.shape, m.verified(t), t.nbytes);
                continue;
            }
        }
        w.add_tensor(t.name, t.dtype, t.ndim, t.shape, m.verified(t), t.nbytes);
    }
    // Masks stay; their expert rows follow the renumbering. A mask that
    // would leave a cut layer nothing to route to cannot run and is left out.
    const auto &l = m.mask_layout();
    bj::array masks_dropped;
    for (const auto &r : m.masks()) {
        container::PendingMask pm = container::pending_mask_of(r);
        bool runnable = true;
        if (r.has_expert_fields) {
            const uint64_t at = r.ffn_rows * l.ffn_row_bytes + l.physical_layers * l.head_row_bytes + l.gate_bytes;
            for (const auto &[layer, kept] : p.keep) {
                const uint8_t *old_row = r.blob + at + layer * l.expert_row_bytes;
                std::vector<uint8_t> row(l.expert_row_bytes, 0);
                bool any = false;
                for (size_t i = 0; i < kept.size(); ++i)
                    if (get_bit(old_row, kept[i])) {
                        set_bit(row, i);
                        any = true;
                    }
                runnable = runnable && any;
                std::copy(row.begin(), row.end(), pm.blob.begin() + int64_t(at + layer * l.expert_row_bytes));
            }
        }
        if (!runnable) {
            masks_dropped.push_back(bj::string(r.name));
            say("task '" + r.name + "' routes to none of the experts kept in some layer: left out");
            continue;
        }
        w.add_mask(std::move(pm));
    }
    if (m.has_vocab()) w.set_vocab(m.vocab(), m.vocab_len());
    say("keeping " + std::to_string(kept_experts) + " experts in " + std::to_string(p.keep.size()) + " MoE layers, dropping " +
        std::to_string(dropped_experts) + " (cover " + cover_percent(o.cover) + ")");
    w.finish();
    return bj::serialize(bj::object{{"output", o.output},
                                    {"layers", p.keep.size()},
                                    {"kept_per_layer", kept_per_layer},
                                    {"experts_kept", kept_experts},
                                    {"experts_dropped", dropped_experts},
                                    {"tensors_dropped", dropped_tensors},
                                    {"masks_dropped", masks_dropped},
                                    {"stats", p.stats_origin}});
}

std::string moe_mask(Runtime &rt, const MoeDefragOptions &o) {
    if (o.name.empty()) bad("moe-mask: the new task needs a name");
    Plan p;
    open_plan(rt, o, "moe-mask", false, p);
    const Model &m = p.m;
    const auto &arch = m.header().arch;
    uint32_t task_id = 1;
    bool first = true;
    for (const auto &r : m.masks()) {
        if (r.name == o.name) bad("moe-mask: task '" + o.name + "' exists in " + o.input + " already");
        task_id = first ? r.task_id + 1 : std::max(task_id, r.task_id + 1);
        first = false;
    }
    // Every FFN row, head and layer on; expert rows as kept, other layers all routable.
    const container::MaskLayout l = container::mask_layout_for(arch);
    std::vector<uint8_t> blob(l.visits * l.ffn_row_bytes + l.physical_layers * l.head_row_bytes + l.gate_bytes +
                                  l.physical_layers * l.expert_row_bytes,
                              0);
    uint64_t at = 0;
    auto ones = [&](uint64_t rows, uint64_t row_bytes, uint64_t bits) {
        for (uint64_t r = 0; r < rows; ++r)
            for (uint64_t i = 0; i < bits; ++i) blob[at + r * row_bytes + i / 8] |= uint8_t(1u << (i % 8));
        at += rows * row_bytes;
    };
    ones(l.visits, l.ffn_row_bytes, arch.intermediate_size);
    ones(l.physical_layers, l.head_row_bytes, arch.num_attention_heads);
    ones(1, l.gate_bytes, arch.num_layers);
    const uint64_t experts_at = at;
    ones(l.physical_layers, l.expert_row_bytes, arch.moe_num_experts);
    uint64_t kept_total = 0, experts_total = 0;
    for (const auto &[layer, kept] : p.keep) {
        uint8_t *row = blob.data() + experts_at + layer * l.expert_row_bytes;
        std::fill(row, row + l.expert_row_bytes, uint8_t(0));
        for (uint32_t e : kept) row[e / 8] |= uint8_t(1u << (e % 8));
        kept_total += kept.size();
        experts_total += p.experts.at(layer);
    }
    container::PendingMask pm;
    pm.task_id = task_id;
    pm.name = o.name;
    pm.description = "MoE expert mask (cover " + cover_percent(o.cover) + ", " + std::to_string(p.keep.size()) + " layers)";
    pm.sparsity = float(1.0 - double(kept_total) / double(experts_total));
    pm.priority = "Normal";
    pm.has_expert_fields = true;
    pm.blob = std::move(blob);
    const float sparsity = pm.sparsity;

    bj::object header = header_for_rewrite(m);
    std::optional<std::string> default_task;
    if (!m.masks().empty()) default_task = m.default_task();
    container::Writer w(rt, o.output, container::json::emit_header(header), 0, default_task);
    for (const auto &t : m.tensors()) w.add_tensor(t.name, t.dtype, t.ndim, t.shape, m.verified(t), t.nbytes);
    container::copy_masks_and_vocab(m, w);
    w.add_mask(std::move(pm));
    if (o.say)
        o.say("task '" + o.name + "': " + std::to_string(kept_total) + " of " + std::to_string(experts_total) +
              " experts routable in " + std::to_string(p.keep.size()) + " MoE layers (cover " + cover_percent(o.cover) + ")");
    w.finish();
    bj::array kept_per_layer;
    for (const auto &[layer, kept] : p.keep) kept_per_layer.push_back(kept.size());
    return bj::serialize(bj::object{{"output", o.output},
                                    {"name", o.name},
                                    {"task_id", task_id},
                                    {"layers", p.keep.size()},
                                    {"kept_per_layer", kept_per_layer},
                                    {"sparsity", double(sparsity)},
                                    {"stats", p.stats_origin}});
}

}  // namespace cmf::convert
