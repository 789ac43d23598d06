#include "convert/skills.hpp"

#include "common/byte_views.hpp"
#include "common/error.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"
#include "container/writer.hpp"
#include "convert/dtype_policy.hpp"
#include "convert/safetensors.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/container_source.hpp"
#include "runtime/session.hpp"
#include "runtime/skills.hpp"

#include <boost/json.hpp>

#include <cmf/cmf.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

namespace cmf::convert {

namespace bj = boost::json;
namespace fs = std::filesystem;
using container::Model;
using container::TensorRec;

namespace {

[[noreturn]] void bad(const std::string &m) { throw Error(CMF_ERR_INVALID_ARGUMENT, m); }

std::vector<uint64_t> parse_layers(const std::string &spec, uint64_t n) {
    auto num = [&](const std::string &s) {
        if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
            bad("--layers " + spec + ": '" + s + "' is not a layer number");
        const uint64_t v = std::stoull(s);
        if (v >= n) bad("--layers " + spec + ": layer " + s + " out of 0.." + std::to_string(n - 1));
        return v;
    };
    std::vector<uint64_t> out;
    if (spec == "all") {
        for (uint64_t i = 0; i < n; ++i) out.push_back(i);
        return out;
    }
    if (const size_t dash = spec.find('-'); dash != std::string::npos) {
        const uint64_t a = num(spec.substr(0, dash)), b = num(spec.substr(dash + 1));
        if (a > b) bad("--layers " + spec + ": empty range");
        for (uint64_t i = a; i <= b; ++i) out.push_back(i);
        return out;
    }
    std::stringstream ss(spec);
    std::string part;
    while (std::getline(ss, part, ',')) out.push_back(num(part));
    if (out.empty()) bad("--layers " + spec + ": empty");
    return out;
}

std::vector<std::string> family_suffixes(const std::string &f) {
    const std::vector<std::string> ffn = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
    const std::vector<std::string> attn = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                           "self_attn.o_proj.weight"};
    if (f == "ffn") return ffn;
    if (f == "attn") return attn;
    if (f == "all") {
        std::vector<std::string> all = ffn;
        all.insert(all.end(), attn.begin(), attn.end());
        return all;
    }
    bad("unknown --tensors '" + f + "' (ffn | attn | all)");
}

size_t index_of(const Model &m, const TensorRec *t) { return size_t(t - m.tensors().data()); }

std::vector<float> dequantized(const Model &m, const TensorRec &t) {
    uint64_t n = 1;
    for (uint32_t k = 0; k < t.ndim; ++k) n *= t.shape[k];
    std::vector<float> v(n);
    m.dequantize(index_of(m, &t), 0, t.ndim >= 2 ? t.shape[0] : 1, v.data(), n);
    return v;
}

std::vector<uint8_t> encode(Runtime &rt, int32_t dtype, const TensorRec &like, const float *src) {
    const CodecEntry *codec = rt.codec(dtype);
    if (codec == nullptr || codec->vt.quantize == nullptr)
        throw Error(CMF_ERR_UNSUPPORTED, like.name + ": no codec can write " + dtype_name(dtype) +
                                             " (choose another with --skill-quant)");
    std::vector<uint8_t> bytes;
    cmf_quantize_params params{sizeof(cmf_quantize_params), 0, nullptr, nullptr, 0};
    cmf_byte_sink bs = vector_sink(bytes);
    throw_if_error(codec->vt.quantize(codec->ctx, like.ndim, like.shape, src, &params, &bs),
                   like.name + " (" + dtype_name(dtype) + ")");
    return bytes;
}

std::vector<std::string> read_lines(const std::string &path) {
    std::ifstream in(path);
    if (!in) throw Error(CMF_ERR_FILE_NOT_FOUND, "cannot read '" + path + "'");
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line)) {
        const size_t a = line.find_first_not_of(" \t\r"), b = line.find_last_not_of(" \t\r");
        if (a != std::string::npos) out.push_back(line.substr(a, b - a + 1));
    }
    return out;
}

std::string read_text(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(CMF_ERR_FILE_NOT_FOUND, "cannot read '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<int32_t> tokenize(const cmf_model *m, const std::string &text, uint32_t flags) {
    cmf_tokenizer *tok = nullptr;
    throw_if_error(cmf_model_tokenizer(m, &tok), "tokenizer");
    std::unique_ptr<cmf_tokenizer, void (*)(cmf_tokenizer *)> guard(tok, cmf_tokenizer_free);
    int32_t *ids = nullptr;
    size_t n = 0;
    throw_if_error(cmf_tokenizer_encode(tok, text.data(), text.size(), flags, &ids, &n), "tokenize");
    std::vector<int32_t> v(ids, ids + n);
    cmf_ids_free(ids);
    return v;
}

// The selection descriptor of a skill from example prompts, as the
// original fits it: phi of each prompt (the backbone's residual after
// phi_layer, averaged over the prompt), their mean, and a basis of
// rank <= min(rank, prompts - 1, 8) by power iteration with deflation (50
// steps from the all-ones vector).
bj::object fit_selection(Runtime &rt, const Model &m, const std::vector<std::string> &prompts, uint64_t phi_layer,
                         uint32_t rank) {
    const uint64_t hidden = m.header().arch.hidden_size;
    std::vector<std::vector<int32_t>> ids;
    size_t longest = 1;
    for (const auto &p : prompts) {
        ids.push_back(tokenize(&static_cast<const cmf_model &>(m), p, 0));
        if (ids.back().empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "--prompts: '" + p + "' encodes to no tokens");
        longest = std::max(longest, ids.back().size());
    }
    auto src = runtime::make_container_source(&static_cast<const cmf_model &>(m));
    runtime::SessionConfig cfg;
    cfg.n_ctx = longest;
    runtime::Session s(rt, *src, cfg);
    std::vector<std::vector<float>> phis;
    for (const auto &t : ids) phis.push_back(s.probe(t, phi_layer + 1, hidden));
    const size_t n = phis.size();
    std::vector<float> mean(hidden, 0.0f);
    for (const auto &phi : phis)
        for (uint64_t i = 0; i < hidden; ++i) mean[i] += phi[i] / float(n);
    std::vector<std::vector<float>> centered = phis;
    for (auto &c : centered)
        for (uint64_t i = 0; i < hidden; ++i) c[i] -= mean[i];
    const uint32_t r = uint32_t(std::min<size_t>({size_t(rank), n > 0 ? n - 1 : 0, size_t(8)}));
    std::vector<float> basis;
    for (uint32_t k = 0; k < r; ++k) {
        std::vector<float> v(hidden, 1.0f);
        for (int it = 0; it < 50; ++it) {
            std::vector<float> next(hidden, 0.0f);
            for (const auto &c : centered) {
                float dot = 0;
                for (uint64_t i = 0; i < hidden; ++i) dot += c[i] * v[i];
                for (uint64_t i = 0; i < hidden; ++i) next[i] += dot * c[i];
            }
            float norm = 0;
            for (float x : next) norm += x * x;
            norm = std::max(std::sqrt(norm), 1e-12f);
            for (float &x : next) x /= norm;
            v = std::move(next);
        }
        for (auto &c : centered) {
            float dot = 0;
            for (uint64_t i = 0; i < hidden; ++i) dot += c[i] * v[i];
            for (uint64_t i = 0; i < hidden; ++i) c[i] -= dot * v[i];
        }
        basis.insert(basis.end(), v.begin(), v.end());
    }
    bj::object sel;
    sel["metric"] = "mse";
    sel["phi_layer"] = phi_layer;
    sel["mean"] = runtime::encode_f16_base64(mean);
    sel["basis"] = runtime::encode_f16_base64(basis);
    sel["rank"] = r;
    return sel;
}

double round3(double x) { return std::round(x * 1000.0) / 1000.0; }

// Perplexity of `tokens` through `m` with skill `skill` ("" = backbone).
double ppl_of(Runtime &rt, const Model &m, const std::string &skill, const std::vector<int32_t> &tokens) {
    runtime::SourceSelection sel;
    sel.skill = skill;
    auto src = runtime::make_container_source(&static_cast<const cmf_model &>(m), sel);
    runtime::SessionConfig cfg;
    cfg.n_ctx = tokens.size();
    runtime::Session s(rt, *src, cfg);
    return runtime::perplexity(s, tokens);
}

bj::object header_of(const Model &m) {
    bj::error_code ec;
    bj::value h = bj::parse(m.header_text(), ec);
    if (ec || !h.is_object()) throw Error(CMF_ERR_PARSE, "header is not a JSON object");
    return h.as_object();
}

std::string file_name(const std::string &path) { return fs::path(path).filename().string(); }

}  // namespace

std::string skill_add(Runtime &rt, const SkillAddOptions &o) {
    auto say = [&](const std::string &s) {
        if (o.say) o.say(s);
    };
    if (!runtime::valid_skill_id(o.id)) bad("skill id '" + o.id + "' must be [A-Za-z0-9_-]+");
    if (o.model.empty() || o.donor.empty()) bad("skill add: the model and the donor are required");
    const std::vector<std::string> suffixes = family_suffixes(o.tensors);
    const bool in_place = o.output.empty() || fs::weakly_canonical(o.output) == fs::weakly_canonical(o.model);
    Model m;
    Model::open(m, rt, o.model, CMF_OPEN_NO_SHARD_MERGE);
    if (m.header().shard) bad(o.model + ": a shard of a sharded model; compact it into one file first");
    if (m.header().skill_file) bad(o.model + ": a skill file (bit 6) cannot take skills; apply it to its base first");
    const auto &arch = m.header().arch;
    const std::vector<uint64_t> layers = parse_layers(o.layers, arch.num_layers);
    int32_t forced = -1;
    if (!o.skill_quant.empty()) forced = quant_dtype_from_name(o.skill_quant);
    Checkpoint donor(o.donor);
    say("donor: " + o.donor + " (" + std::to_string(donor.files().size()) + " file(s))");

    struct New {
        std::string name;
        const TensorRec *like;
        int32_t dtype;
        std::vector<uint8_t> bytes;
    };
    std::vector<New> added;
    bj::array skipped, unchanged;
    const std::string prefix = "skill." + o.id + ".";
    for (uint64_t l : layers)
        for (const auto &suf : suffixes) {
            const std::string want = "model.layers." + std::to_string(l) + "." + suf;
            const TensorRec *base = m.find(want);
            if (base == nullptr) {
                skipped.push_back(bj::value(want + " (not in the backbone)"));
                continue;
            }
            const SourceTensor *d = donor.find(want);
            if (d == nullptr) {
                skipped.push_back(bj::value(want + " (not in the donor)"));
                continue;
            }
            if (d->shape.size() != base->ndim || !std::equal(d->shape.begin(), d->shape.end(), base->shape))
                throw Error(CMF_ERR_BOUNDS, want + ": the donor's shape differs from the backbone's (another architecture?)");
            std::vector<float> vals(d->elements);
            read_f32(*d, 0, d->elements, vals.data());
            donor.file_of(*d).release(*d);
            if (o.min_delta > 0) {
                // Tensors the donor barely changed stay the backbone's.
                const std::vector<float> b = dequantized(m, *base);
                double dd = 0, bb = 0;
                for (size_t i = 0; i < vals.size(); ++i) {
                    const double diff = double(vals[i]) - double(b[i]);
                    dd += diff * diff;
                    bb += double(b[i]) * double(b[i]);
                }
                const double rel = std::sqrt(dd / std::max(bb, 1e-30));
                if (rel < o.min_delta) {
                    unchanged.push_back(bj::object{{"tensor", want}, {"relative_delta", rel}});
                    continue;
                }
            }
            const int32_t dtype = forced >= 0 ? forced : base->dtype == CMF_DTYPE_VBIT ? CMF_DTYPE_VBIT_RO : base->dtype;
            added.push_back({prefix + want, base, dtype, encode(rt, dtype, *base, vals.data())});
        }
    if (added.empty())
        throw Error(CMF_ERR_NOT_FOUND, std::string("no donor tensor to add") +
                                           (unchanged.empty() ? " (wrong --from, --layers or --tensors?)"
                                                              : " above --min-delta (threshold too high?)"));
    // The registry's layer list says what is stored.
    std::set<uint64_t> stored;
    uint64_t bytes = 0;
    for (const auto &n : added) {
        bytes += n.bytes.size();
        const std::string rest = n.name.substr(prefix.size() + std::string("model.layers.").size());
        stored.insert(std::stoull(rest.substr(0, rest.find('.'))));
    }
    say("skill '" + o.id + "': " + std::to_string(added.size()) + " tensors over " + std::to_string(stored.size()) +
        " layer(s), +" + std::to_string(bytes) + " bytes");

    bj::object record;
    record["id"] = o.id;
    if (!o.name.empty()) record["name"] = o.name;
    bj::array layer_list;
    for (uint64_t l : stored) layer_list.push_back(l);
    record["layers"] = layer_list;
    if (!o.prompts.empty()) {
        const std::vector<std::string> prompts = read_lines(o.prompts);
        if (prompts.empty()) bad("--prompts " + o.prompts + ": no prompts");
        const uint64_t visits = arch.num_layers * std::max<uint64_t>(arch.num_loops, 1);
        const uint64_t phi = o.phi_layer >= 0 ? uint64_t(o.phi_layer) : arch.num_layers * 2 / 3;
        if (phi >= visits) bad("--phi-layer " + std::to_string(phi) + " beyond the model's " + std::to_string(visits) + " layers");
        record["selection"] = fit_selection(rt, m, prompts, phi, o.rank);
        say("selection: phi-layer " + std::to_string(phi) + ", rank " +
            std::to_string(record["selection"].as_object()["rank"].to_number<uint64_t>()) + " from " +
            std::to_string(prompts.size()) + " prompt(s)");
    } else {
        say("selection: none (no --prompts): routing will skip this skill");
    }
    bj::object header = header_of(m);
    bj::array skills;
    if (header.contains("skills") && header["skills"].is_array())
        for (const auto &s : header["skills"].as_array())
            if (!(s.is_object() && s.as_object().contains("id") && s.as_object().at("id") == bj::value(o.id))) skills.push_back(s);
    skills.push_back(record);
    header["skills"] = skills;
    header.erase("section_hashes");

    // Where it grows: the file itself, or a byte copy of it at the output
    // (renamed into place when complete).
    std::string target = o.model, partial;
    if (!in_place) {
        partial = o.output + ".partial";
        fs::copy_file(o.model, partial, fs::copy_options::overwrite_existing);
        target = partial;
    }
    try {
        const std::string text = container::json::emit_header(header);
        container::Writer w = container::Writer::for_append(rt, target, &text);
        for (const auto &t : m.tensors())
            if (t.name.compare(0, prefix.size(), prefix) == 0) w.drop_existing(t.name);  // re-adding an id replaces it
        for (const auto &n : added) w.add_tensor(n.name, n.dtype, n.like->ndim, n.like->shape, n.bytes.data(), n.bytes.size());
        w.finish();
        if (!o.quality.empty()) {
            // Measured on the grown file, as it will run; recorded by a
            // second append (a new header only).
            Model grown;
            Model::open(grown, rt, target, CMF_OPEN_NO_SHARD_MERGE);
            std::vector<int32_t> ids = tokenize(&static_cast<const cmf_model &>(grown), read_text(o.quality), CMF_ENCODE_ADD_SPECIAL);
            if (ids.size() > o.quality_tokens) ids.resize(o.quality_tokens);
            if (ids.size() < 2) bad("--quality " + o.quality + ": fewer than 2 tokens");
            const double backbone = ppl_of(rt, grown, "", ids), overlaid = ppl_of(rt, grown, o.id, ids);
            say("quality (" + file_name(o.quality) + "): backbone PPL " + std::to_string(backbone) + " -> skill PPL " +
                std::to_string(overlaid));
            bj::object h2 = header_of(grown);
            for (auto &s : h2["skills"].as_array())
                if (s.as_object().at("id") == bj::value(o.id))
                    s.as_object()["quality"] = bj::object{{"backbone", round3(backbone)}, {"file", file_name(o.quality)},
                                                          {"masked", false}, {"metric", "ppl"},
                                                          {"overlaid", round3(overlaid)}, {"tokens", ids.size()}};
            h2.erase("section_hashes");
            const std::string text2 = container::json::emit_header(h2);
            container::Writer w2 = container::Writer::for_append(rt, target, &text2);
            w2.finish();
            record = h2["skills"].as_array().back().as_object();
        }
        if (!in_place) fs::rename(partial, o.output);
    } catch (...) {
        if (!partial.empty()) fs::remove(partial);
        throw;
    }
    bj::object report{{"id", o.id}, {"tensors", added.size()}, {"bytes", bytes}, {"skipped", skipped},
                      {"unchanged", unchanged}, {"record", record}, {"output", in_place ? o.model : o.output}};
    return bj::serialize(report);
}

std::string skill_export(Runtime &rt, const SkillExportOptions &o) {
    if (!runtime::valid_skill_id(o.id)) bad("skill id '" + o.id + "' must be [A-Za-z0-9_-]+");
    Model spec, base;
    Model::open(spec, rt, o.specialist, 0);
    Model::open(base, rt, o.base, 0);
    const auto &sa = spec.header().arch, &ba = base.header().arch;
    if (sa.arch_name != ba.arch_name || sa.num_layers != ba.num_layers || sa.hidden_size != ba.hidden_size)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "specialist and base disagree on architecture (" + sa.arch_name + " vs " +
                                                  ba.arch_name + "): nothing to cut");
    std::vector<const TensorRec *> cut;
    std::set<uint64_t> layers;
    for (const auto &t : spec.tensors()) {
        const TensorRec *b = base.find(t.name);
        if (b != nullptr && b->hash == t.hash) continue;  // byte-identical: the base carries it
        cut.push_back(&t);
        static const std::string lp = "model.layers.";
        if (t.name.compare(0, lp.size(), lp) == 0) {
            const std::string rest = t.name.substr(lp.size());
            const std::string num = rest.substr(0, rest.find('.'));
            if (!num.empty() && std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; }))
                layers.insert(std::stoull(num));
        }
    }
    if (cut.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "specialist and base are byte-identical: no skill to export");
    bj::object header = header_of(spec);
    header.erase("section_hashes");
    header.erase("shard");
    bj::object rec;
    rec["id"] = o.id;
    if (!o.name.empty()) rec["name"] = o.name;
    bj::array ls;
    for (uint64_t l : layers) ls.push_back(l);
    rec["layers"] = ls;
    rec["base_dir_hash"] = container::hex16(base.shards()[0].env.dir_hash);
    rec["base_arch"] = ba.arch_name;
    // The specialist's default task; a file without masks says "general",
    // as the original's empty catalog does.
    rec["task"] = spec.masks().empty() ? std::string("general") : spec.default_task();
    rec["provenance"] = bj::object{{"cut_from", file_name(o.specialist)}, {"tensors", cut.size()}};
    header["skills"] = bj::array{rec};
    std::optional<std::string> task;
    if (!spec.masks().empty()) task = spec.default_task();
    container::Writer w(rt, o.output, container::json::emit_header(header), 0, task);
    for (const TensorRec *t : cut) w.add_tensor(t->name, t->dtype, t->ndim, t->shape, spec.verified(*t), t->nbytes);
    container::copy_masks(spec, w);
    w.finish();
    return bj::serialize(bj::object{{"id", o.id}, {"tensors", cut.size()}, {"layers", ls}, {"masks", spec.masks().size()},
                                    {"output", o.output}});
}

std::string skill_apply(Runtime &rt, const SkillApplyOptions &o) {
    Model base, skill;
    Model::open(base, rt, o.base, 0);
    Model::open(skill, rt, o.skill, 0);
    const runtime::Registry reg = runtime::read_registry(skill);
    const runtime::SkillRecord *rec = nullptr;
    for (const auto &s : reg.skills)
        if (!s.base_dir_hash.empty()) {
            rec = &s;
            break;
        }
    if (rec == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, o.skill + " carries no standalone-skill record: not a skill file");
    const std::string have = container::hex16(base.shards()[0].env.dir_hash);
    bool forced = false;
    if (rec->base_dir_hash != have) {
        if (!o.force)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "this skill was cut against another base (key " + rec->base_dir_hash +
                                                      ", this base " + have + "); its base is a '" +
                                                      base.header().arch.arch_name + "' file with exactly those bytes. "
                                                      "--force applies it anyway");
        rt.log(CMF_LOG_WARN, "base directory hash " + have + " does not match the skill's key " + rec->base_dir_hash +
                                 ": applied because of --force; the result is outside the spec");
        forced = true;
    }
    bj::object header = header_of(base);
    header.erase("section_hashes");
    header.erase("shard");
    bj::value carried = bj::parse(rec->json);
    carried.as_object().erase("base_dir_hash");
    header["skills"] = bj::array{carried};
    std::optional<std::string> task;
    if (!skill.masks().empty()) task = skill.default_task();
    container::Writer w(rt, o.output, container::json::emit_header(header), 0, task);
    uint64_t replaced = 0;
    for (const auto &t : base.tensors()) {
        const TensorRec *s = skill.find(t.name);
        const TensorRec &src = s != nullptr ? *s : t;
        replaced += s != nullptr;
        w.add_tensor(src.name, src.dtype, src.ndim, src.shape, (s != nullptr ? skill : base).verified(src), src.nbytes);
    }
    container::copy_masks(skill, w);
    if (base.has_vocab()) w.set_vocab(base.vocab(), base.vocab_len());
    w.finish();
    return bj::serialize(bj::object{{"id", rec->id}, {"replaced", replaced}, {"masks", skill.masks().size()},
                                    {"forced", forced}, {"output", o.output}});
}

}  // namespace cmf::convert
