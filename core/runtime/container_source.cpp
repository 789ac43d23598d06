#include "runtime/container_source.hpp"

#include "common/error.hpp"
#include "container/model.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/moe_stats.hpp"
#include "runtime/skills.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

namespace cmf::runtime {
namespace {

using cmf::container::Model;
using cmf::container::TensorRec;

// A task mask with its arrays, decoded from the file's blob.
struct OwnedMask {
    cmf_task_mask mask{};
    std::string name;
    std::vector<uint8_t> ffn, heads, gates, experts;
};

// The source struct first, so the callbacks' `user` (this object) also
// serves as the struct handed out.
struct ContainerSource {
    cmf_model_source src{};
    const Model *model = nullptr;
    std::string arch_json, header_json;
    struct Entry {
        const std::string *name;  // the backbone name (owned by the model)
        cmf_tensor_view view;
    };
    std::vector<Entry> entries;  // backbone tensors, directory order
    std::unordered_map<std::string_view, size_t> by_name;
    std::deque<std::vector<float>> blended;  // f32 working tensors of a blend
    OwnedMask mask;
};

cmf_error *tensor_fn(void *user, const char *name, cmf_tensor_view *out) {
    auto *cs = static_cast<ContainerSource *>(user);
    if (name == nullptr || out == nullptr) return make_error(CMF_ERR_INVALID_ARGUMENT, "model source: NULL argument");
    auto it = cs->by_name.find(name);
    if (it == cs->by_name.end()) return make_error(CMF_ERR_MISSING_TENSOR, std::string("missing tensor ") + name);
    *out = cs->entries[it->second].view;
    return nullptr;
}

cmf_error *tensor_at_fn(void *user, uint64_t index, const char **name, cmf_tensor_view *out) {
    auto *cs = static_cast<ContainerSource *>(user);
    if (name == nullptr || out == nullptr) return make_error(CMF_ERR_INVALID_ARGUMENT, "model source: NULL argument");
    if (index >= cs->entries.size())
        return make_error(CMF_ERR_INVALID_ARGUMENT, "model source: tensor index " + std::to_string(index) + " out of range");
    *name = cs->entries[index].name->c_str();
    *out = cs->entries[index].view;
    return nullptr;
}

bool is_skill_tensor(const std::string &name) { return name.compare(0, 6, "skill.") == 0; }

std::string mask_names(const Model &m) {
    std::string s;
    for (const auto &r : m.masks()) s += (s.empty() ? "" : ", ") + r.name;
    return s;
}

// The file's mask `name` in the arch-facing form: FFN rows per visit
// (a legacy blob's rows repeated on every pass), heads and gates per
// physical layer, expert rows when the blob has them.
void decode_task(const Model &m, const std::string &name, OwnedMask &out) {
    if (m.masks().empty())
        throw Error(CMF_ERR_INVALID_ARGUMENT, "task '" + name + "': the file has no task masks");
    const cmf::container::MaskRec *rec = nullptr;
    for (const auto &r : m.masks())
        if (r.name == name) rec = &r;
    if (rec == nullptr)
        throw Error(CMF_ERR_NOT_FOUND, "task '" + name + "' is not in the file (its tasks: " + mask_names(m) + ")");
    const auto &l = m.mask_layout();
    const auto &arch = m.header().arch;
    out.name = name;
    const uint64_t N = l.physical_layers, V = l.visits;
    out.ffn.resize(V * l.ffn_row_bytes);
    for (uint64_t v = 0; v < V; ++v) {
        const uint64_t src_row = rec->ffn_rows == V ? v : v % N;
        std::memcpy(out.ffn.data() + v * l.ffn_row_bytes, rec->blob + src_row * l.ffn_row_bytes, l.ffn_row_bytes);
    }
    const uint8_t *p = rec->blob + rec->ffn_rows * l.ffn_row_bytes;
    out.heads.assign(p, p + N * l.head_row_bytes);
    p += N * l.head_row_bytes;
    out.gates.assign(p, p + l.gate_bytes);
    p += l.gate_bytes;
    if (rec->has_expert_fields) out.experts.assign(p, p + N * l.expert_row_bytes);
    cmf_task_mask &t = out.mask;
    t.struct_size = sizeof t;
    t.layers = N;
    t.visits = V;
    t.ffn_bits = arch.intermediate_size;
    t.ffn_row_bytes = l.ffn_row_bytes;
    t.head_bits = arch.num_attention_heads;
    t.head_row_bytes = l.head_row_bytes;
    t.expert_bits = arch.has_moe ? arch.moe_num_experts : 0;
    t.expert_row_bytes = l.expert_row_bytes;
    if (rec->quality_json.empty())
        m.runtime().log(CMF_LOG_WARN, "task '" + name +
                                          "': the mask has no measured quality (quality is null): its outputs are unvalidated");
}

// A mask that lets everything run: the base a runtime MoE mask narrows
// when no task is given.
void full_mask(const Model &m, OwnedMask &out) {
    const auto l = cmf::container::mask_layout_for(m.header().arch);
    const auto &arch = m.header().arch;
    auto ones = [](std::vector<uint8_t> &v, uint64_t rows, uint64_t row_bytes, uint64_t bits) {
        v.assign(rows * row_bytes, 0);
        for (uint64_t r = 0; r < rows; ++r)
            for (uint64_t i = 0; i < bits; ++i) v[r * row_bytes + i / 8] |= uint8_t(1u << (i % 8));
    };
    ones(out.ffn, l.visits, l.ffn_row_bytes, arch.intermediate_size);
    ones(out.heads, l.physical_layers, l.head_row_bytes, arch.num_attention_heads);
    ones(out.gates, 1, l.gate_bytes, l.physical_layers);
    cmf_task_mask &t = out.mask;
    t.struct_size = sizeof t;
    t.layers = l.physical_layers;
    t.visits = l.visits;
    t.ffn_bits = arch.intermediate_size;
    t.ffn_row_bytes = l.ffn_row_bytes;
    t.head_bits = arch.num_attention_heads;
    t.head_row_bytes = l.head_row_bytes;
    t.expert_bits = arch.has_moe ? arch.moe_num_experts : 0;
    t.expert_row_bytes = l.expert_row_bytes;
    out.name = "(all)";
}

// Each MoE layer of the stats routes only among the experts covering
// `cover` of its selections, as the original's CMF_MOE_MASK does; with a
// task's expert rows, the experts both allow.
void apply_moe_mask(const Model &m, const std::string &path, float cover, OwnedMask &out) {
    const auto &arch = m.header().arch;
    if (!arch.has_moe || arch.moe_num_experts == 0)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "MoE mask: the model has no experts (arch.moe is absent)");
    if (!(cover > 0 && cover <= 1)) throw Error(CMF_ERR_INVALID_ARGUMENT, "MoE mask: cover must be in (0, 1]");
    const MoeStats stats = read_moe_stats(path);
    const uint64_t N = out.mask.layers, E = arch.moe_num_experts, rb = out.mask.expert_row_bytes;
    const bool had = !out.experts.empty();
    if (!had) {
        out.experts.assign(N * rb, 0);
        for (uint64_t l = 0; l < N; ++l)
            for (uint64_t e = 0; e < E; ++e) out.experts[l * rb + e / 8] |= uint8_t(1u << (e % 8));
    }
    uint64_t used = 0;
    for (const auto &[layer, counts] : stats.counts) {
        if (layer >= N) throw Error(CMF_ERR_INVALID_ARGUMENT, "MoE mask '" + path + "': layer " + std::to_string(layer) + " beyond the model's " + std::to_string(N));
        if (counts.size() != E) continue;  // as the original: a layer of another expert count is skipped
        std::vector<uint32_t> keep = covering_experts(counts, cover);
        if (keep.empty()) continue;
        std::vector<uint8_t> row(rb, 0);
        for (uint32_t e : keep) row[e / 8] |= uint8_t(1u << (e % 8));
        for (uint64_t b = 0; b < rb; ++b) out.experts[layer * rb + b] &= row[b];
        ++used;
    }
    if (used == 0)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "MoE mask '" + path + "': no layer has " + std::to_string(E) +
                                                  " expert counts with a nonzero total");
    out.name += "+moe-mask";
}

// "id:w,id:w" -> (id, weight) with weights normalised by their sum.
std::vector<std::pair<std::string, double>> parse_blend(const std::string &spec, const Registry &reg) {
    std::vector<std::pair<std::string, double>> out;
    size_t i = 0;
    double sum = 0;
    while (i <= spec.size()) {
        size_t j = spec.find(',', i);
        if (j == std::string::npos) j = spec.size();
        const std::string item = spec.substr(i, j - i);
        const size_t colon = item.rfind(':');
        if (colon == std::string::npos || colon == 0)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "blend '" + spec + "': '" + item + "' is not id:weight");
        const std::string id = item.substr(0, colon), w = item.substr(colon + 1);
        char *end = nullptr;
        const double x = std::strtod(w.c_str(), &end);
        if (w.empty() || *end != '\0' || !std::isfinite(x) || x < 0)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "blend '" + spec + "': weight '" + w + "' is not a number >= 0");
        if (reg.find(id) == nullptr)
            throw Error(CMF_ERR_NOT_FOUND, "blend: skill '" + id + "' is not in the file (its skills: " + reg.ids() + ")");
        for (const auto &[o, _] : out)
            if (o == id) throw Error(CMF_ERR_INVALID_ARGUMENT, "blend '" + spec + "': skill '" + id + "' is listed twice");
        out.emplace_back(id, x);
        sum += x;
        i = j + 1;
    }
    if (!(sum > 0)) throw Error(CMF_ERR_INVALID_ARGUMENT, "blend '" + spec + "': the weights sum to 0");
    for (auto &[_, w] : out) w /= sum;
    return out;
}

size_t index_of(const Model &m, const TensorRec *t) { return size_t(t - m.tensors().data()); }

// Rows x row length of a tensor, for Model::dequantize.
uint64_t element_count(const TensorRec &t) {
    uint64_t n = 1;
    for (uint32_t k = 0; k < t.ndim; ++k) n *= t.shape[k];
    return n;
}

}  // namespace

std::shared_ptr<const cmf_model_source> make_container_source(const cmf_model *cm, const SourceSelection &sel) {
    if (cm == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "model source: NULL model");
    const Model &m = *cm;
    if (m.header().skill_file)
        throw Error(CMF_ERR_UNSUPPORTED, "this is a skill file (feature bit 6: only the tensors a skill changed); "
                                         "apply it to its base first: cmfhost skill apply BASE SKILL -o OUT");
    auto cs = std::make_shared<ContainerSource>();
    cs->model = &m;
    cs->arch_json = m.header().arch_json;
    cs->header_json = m.header_text();
    if (cs->arch_json.empty()) throw Error(CMF_ERR_PARSE, "the model's header has no arch object");
    for (const TensorRec &t : m.tensors()) {
        if (is_skill_tensor(t.name)) continue;
        cs->by_name.emplace(t.name, cs->entries.size());
        cs->entries.push_back({&t.name, t.view()});
    }
    if (!sel.skill.empty() && !sel.blend.empty())
        throw Error(CMF_ERR_INVALID_ARGUMENT, "a skill and a blend of skills exclude each other");
    if (!sel.skill.empty() || !sel.blend.empty()) {
        const Registry reg = read_registry(m);
        if (!sel.skill.empty()) {
            if (reg.find(sel.skill) == nullptr)
                throw Error(CMF_ERR_NOT_FOUND, "skill '" + sel.skill + "' is not in the file (its skills: " + reg.ids() + ")");
            const std::string prefix = "skill." + sel.skill + ".";
            for (auto &e : cs->entries)
                if (const TensorRec *r = m.find(prefix + *e.name)) e.view = r->view();
        } else {
            const auto parts = parse_blend(sel.blend, reg);
            for (auto &e : cs->entries) {
                std::vector<const TensorRec *> srcs;
                bool touched = false;
                for (const auto &[id, w] : parts) {
                    const TensorRec *r = m.find("skill." + id + "." + *e.name);
                    touched = touched || r != nullptr;
                    srcs.push_back(r != nullptr ? r : m.find(*e.name));
                }
                if (!touched) continue;
                const TensorRec &base = *m.find(*e.name);
                const uint64_t n = element_count(base), rows = base.ndim >= 2 ? base.shape[0] : 1;
                std::vector<float> acc(n, 0.0f), tmp(n);
                for (size_t k = 0; k < srcs.size(); ++k) {
                    const TensorRec &s = *srcs[k];
                    if (s.ndim != base.ndim || !std::equal(s.shape, s.shape + s.ndim, base.shape))
                        throw Error(CMF_ERR_BOUNDS, "blend: " + s.name + " does not have the shape of " + base.name);
                    m.dequantize(index_of(m, &s), 0, rows, tmp.data(), n);
                    const float w = float(parts[k].second);
                    for (uint64_t i = 0; i < n; ++i) acc[i] += w * tmp[i];
                }
                std::vector<float> &owned = cs->blended.emplace_back(std::move(acc));
                e.view.dtype = CMF_DTYPE_F32;
                e.view.facts = 0;  // new bytes: nothing established about them
                e.view.data = owned.data();
                e.view.nbytes = n * sizeof(float);
            }
        }
    }
    const bool masked = !sel.task.empty() || !sel.moe_mask.empty();
    if (!sel.task.empty()) decode_task(m, sel.task, cs->mask);
    else if (masked) full_mask(m, cs->mask);
    if (!sel.moe_mask.empty()) apply_moe_mask(m, sel.moe_mask, sel.moe_cover, cs->mask);
    if (masked) {
        // Reads become exact: no read-around and no 2 MiB pages on the
        // model's mapping, so a page is read only when a kernel touches it
        // and the rows the mask leaves out are never brought into memory
        // (a fault anywhere within reach would otherwise read them: the
        // 2 MiB folio or the read-around window it falls in). The cost:
        // 4 KiB pages, and a cold first pass reads page by page; the
        // decoder gives the weights it reads whole their 2 MiB pages back
        // on each one's aligned interior (archs/common, moe_ffn.cpp).
        for (const auto &sh : m.shards())
            if (sh.file->mapped()) {
                void *p = const_cast<uint8_t *>(sh.file->data());
                ::madvise(p, sh.file->size(), MADV_NOHUGEPAGE);
                ::madvise(p, sh.file->size(), MADV_RANDOM);
            }
        cmf_task_mask &t = cs->mask.mask;
        t.name = cs->mask.name.c_str();
        t.ffn = cs->mask.ffn.data();
        t.heads = cs->mask.heads.data();
        t.gates = cs->mask.gates.data();
        t.experts = cs->mask.experts.empty() ? nullptr : cs->mask.experts.data();
    }
    cs->src.struct_size = sizeof(cmf_model_source);
    cs->src.user = cs.get();
    cs->src.arch_json = cs->arch_json.c_str();
    cs->src.arch_json_len = cs->arch_json.size();
    cs->src.header_json = cs->header_json.c_str();
    cs->src.header_json_len = cs->header_json.size();
    cs->src.tensor_count = cs->entries.size();
    cs->src.tensor = tensor_fn;
    cs->src.tensor_at = tensor_at_fn;
    cs->src.task_mask = masked ? &cs->mask.mask : nullptr;
    // Aliasing constructor: the source struct lives as long as its owner.
    return std::shared_ptr<const cmf_model_source>(cs, &cs->src);
}

}  // namespace cmf::runtime
