#include "convert/convert.hpp"
#include "convert/plan.hpp"

#include "common/byte_views.hpp"
#include "common/error.hpp"
#include "common/json.hpp"
#include "convert/defrag.hpp"
#include "convert/gguf.hpp"
#include "convert/safetensors.hpp"
#include "convert/sentencepiece.hpp"
#include "plugin_host/runtime.hpp"
#include "text/tokenizer.hpp"

#include <cmf/json_writer.hpp>

#include <boost/json.hpp>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <unistd.h>

namespace cmf::convert {

namespace fs = std::filesystem;
namespace dom = simdjson::dom;
namespace bj = boost::json;

std::optional<std::string> read_file_if_exists(const fs::path &p) {
    std::error_code ec;
    if (!fs::exists(p, ec)) return std::nullopt;
    std::ifstream in(p, std::ios::binary);
    if (!in) throw Error(CMF_ERR_IO, p.string() + ": cannot open");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error(CMF_ERR_IO, p.string() + ": read failed");
    return ss.str();
}

namespace {

dom::object parse_object(dom::parser &parser, const std::string &text, const std::string &file) {
    dom::element doc = parse_json(parser, text, file);
    dom::object o;
    if (doc.get_object().get(o)) throw Error(CMF_ERR_PARSE, file + ": not a JSON object");
    return o;
}

struct StringSink {
    std::string s;
    cmf_byte_sink sink{sizeof(cmf_byte_sink), 0, this, [](void *u, const void *d, size_t n) -> cmf_error * {
                           try {
                               static_cast<StringSink *>(u)->s.append(static_cast<const char *>(d), n);
                               return nullptr;
                           } catch (...) {
                               return error_from_current_exception();
                           }
                       }};
};

uint64_t product(const std::vector<uint64_t> &s, size_t from = 0) {
    uint64_t n = 1;
    for (size_t i = from; i < s.size(); ++i) n *= s[i];
    return n;
}

std::string shape_text(const std::vector<uint64_t> &s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// Parse and check one plan (docs/convert.md) against its source tensor.
std::vector<OutTensor> parse_plan(const std::string &plan_json, const SourceTensor &src) {
    const std::string where = src.file + ": tensor \"" + src.name + "\": arch plan: ";
    dom::parser parser;
    dom::element doc;
    dom::array arr;
    if (parser.parse(plan_json).get(doc) || doc.get_array().get(arr)) throw Error(CMF_ERR_PLUGIN, where + "not a JSON array: " + plan_json);
    std::vector<OutTensor> out;
    for (auto e : arr) {
        OutTensor o;
        o.src = &src;
        o.p.source = src.name;
        std::string_view name;
        dom::array shape;
        if (e["name"].get_string().get(name) || name.empty() || e["shape"].get_array().get(shape))
            throw Error(CMF_ERR_PLUGIN, where + "an entry lacks name or shape: " + plan_json);
        o.p.name = std::string(name);
        for (auto d : shape) {
            uint64_t v;
            if (d.get_uint64().get(v)) throw Error(CMF_ERR_PLUGIN, where + "bad shape for " + o.p.name);
            o.p.shape.push_back(v);
        }
        if (o.p.shape.size() > CMF_MAX_DIMS)
            throw Error(CMF_ERR_PARSE, where + o.p.name + " has " + std::to_string(o.p.shape.size()) + " dimensions; CMF allows at most 6");
        for (uint64_t d : o.p.shape)
            if (d > UINT32_MAX) throw Error(CMF_ERR_BOUNDS, where + o.p.name + ": dimension " + std::to_string(d) + " does not fit the directory's u32");
        uint64_t idx;
        if (!e["index"].get_uint64().get(idx)) o.index = idx;
        bool tr;
        if (!e["transpose"].get_bool().get(tr)) o.transpose = tr;
        dom::array rows;
        if (!e["rows"].get_array().get(rows))
            for (auto r : rows) {
                dom::array pair;
                uint64_t first, count;
                if (r.get_array().get(pair) || pair.size() != 2 || pair.at(0).get_uint64().get(first) || pair.at(1).get_uint64().get(count))
                    throw Error(CMF_ERR_PLUGIN, where + "bad rows entry for " + o.p.name);
                o.rows.emplace_back(first, count);
            }
        // The slab the rows are taken from.
        const auto &s = src.shape;
        uint64_t slab_rows, slab_cols;
        std::vector<uint64_t> slab;
        if (o.index) {
            if (s.size() < 3 || *o.index >= s[0])
                throw Error(CMF_ERR_PLUGIN, where + o.p.name + ": index " + std::to_string(*o.index) + " is outside source shape " + shape_text(s));
            slab.assign(s.begin() + 1, s.end());
        } else {
            slab = s;
        }
        if (slab.size() >= 2) {
            slab_rows = slab[0];
            slab_cols = product(slab, 1);
        } else {
            slab_rows = 1;
            slab_cols = product(slab);
        }
        if (o.transpose) {
            if (slab.size() != 2) throw Error(CMF_ERR_PLUGIN, where + o.p.name + ": transpose needs a 2-D slab");
            std::swap(slab_rows, slab_cols);
        }
        uint64_t taken = 0;
        for (auto [first, count] : o.rows) {
            if (first > slab_rows || count > slab_rows - first)
                throw Error(CMF_ERR_PLUGIN, where + o.p.name + ": rows [" + std::to_string(first) + ", +" + std::to_string(count) +
                                                ") outside the " + std::to_string(slab_rows) + "-row source");
            taken += count;
        }
        if (o.rows.empty()) taken = slab_rows;
        o.elements = taken * slab_cols;
        if (product(o.p.shape) != o.elements)
            throw Error(CMF_ERR_PLUGIN, where + o.p.name + ": shape " + shape_text(o.p.shape) + " holds " + std::to_string(product(o.p.shape)) +
                                            " elements but the plan selects " + std::to_string(o.elements));
        out.push_back(std::move(o));
    }
    return out;
}

// Elements [begin, end) of one output tensor as f32, in output order. The
// output is its source slab's selected rows laid end to end (untransposed
// plans only). With `release` (this output is the last reader of a plain
// source tensor) the source pages are dropped piece by piece as soon as they
// are converted, so the source and its f32 copy are never both resident.
// What an output reads of its source: expert `index` of a stacked tensor,
// else all of it, as rows x cols elements from `base` (1-D: one row).
struct Slab {
    uint64_t base, rows, cols;
};
Slab slab_of(const OutTensor &o) {
    const auto &s = o.src->shape;
    std::vector<uint64_t> slab = s;
    uint64_t base = 0;
    if (o.index) {
        slab.assign(s.begin() + 1, s.end());
        base = *o.index * product(slab);
    }
    if (slab.size() >= 2) return {base, slab[0], product(slab, 1)};
    return {base, 1, product(slab)};
}

void gather_range(const OutTensor &o, uint64_t begin, uint64_t end, float *dst, bool release) {
    const SourceTensor &t = *o.src;
    const auto [base, rows, cols] = slab_of(o);
    std::vector<std::pair<uint64_t, uint64_t>> segs;  // element runs of the source slab
    if (o.rows.empty()) segs.emplace_back(0, rows * cols);
    for (auto [first, count] : o.rows) segs.emplace_back(first * cols, count * cols);
    const uint64_t piece = uint64_t(4) << 20;  // elements
    uint64_t seg_start = 0;  // output index of the current run's first element
    for (auto [src_first, len] : segs) {
        const uint64_t lo = std::max(begin, seg_start), hi = std::min(end, seg_start + len);
        for (uint64_t at = lo; at < hi; at += piece) {
            const uint64_t k = std::min(piece, hi - at);
            const uint64_t from = base + src_first + (at - seg_start);
            read_f32(t, from, k, dst + (at - begin));
            if (release && o.rows.empty()) release_elements(t, from, k);
        }
        seg_start += len;
    }
}

// Materialize one whole output tensor as f32.
void gather_f32(const OutTensor &o, std::vector<float> &dst, bool release) {
    dst.resize(o.elements);
    if (!o.transpose) return gather_range(o, 0, o.elements, dst.data(), release);
    // Transposed slab [rows, cols] -> [cols, rows]; selected rows are source columns.
    const auto [base, rows, cols] = slab_of(o);
    std::vector<float> full(rows * cols);
    read_f32(*o.src, base, rows * cols, full.data());
    std::vector<std::pair<uint64_t, uint64_t>> sel = o.rows;
    if (sel.empty()) sel.emplace_back(0, cols);
    uint64_t at = 0;
    for (auto [first, count] : sel)
        for (uint64_t c = first; c < first + count; ++c)
            for (uint64_t r = 0; r < rows; ++r) dst[at++] = full[r * cols + c];
}

// ---- canonical order -------------------------------------------------------

int group_of(const std::string &n) {
    if (n.rfind("model.embed_tokens.", 0) == 0) return 0;
    if (n.rfind("model.norm.", 0) == 0) return 1;
    if (n.rfind("lm_head.", 0) == 0) return 2;
    if (n.rfind("model.layers.", 0) == 0) return 3;
    if (n.rfind("model.mtp.", 0) == 0) return 4;
    return 5;
}

// "mlp.experts.{e}.{role}" -> "mlp.experts.~{role rank}.{e}" so that all
// experts of one role sort together.
std::string order_key(const std::string &n) {
    static const char *const marker = ".mlp.experts.";
    size_t p = n.find(marker);
    if (p == std::string::npos) return n;
    size_t e0 = p + std::char_traits<char>::length(marker);
    size_t e1 = n.find('.', e0);
    if (e1 == std::string::npos || e1 == e0 || n.find_first_not_of("0123456789", e0) != e1) return n;
    std::string role = n.substr(e1 + 1);
    char rank = role.rfind("gate_proj", 0) == 0 ? '0' : role.rfind("up_proj", 0) == 0 ? '1' : role.rfind("down_proj", 0) == 0 ? '2' : '3';
    return n.substr(0, e0) + "~" + rank + role + "." + n.substr(e0, e1 - e0);
}

// Compare with runs of digits taken as numbers ("layers.2" < "layers.10").
bool natural_less(const std::string &a, const std::string &b) {
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        bool da = std::isdigit(static_cast<unsigned char>(a[i])), db = std::isdigit(static_cast<unsigned char>(b[j]));
        if (da && db) {
            size_t i2 = i, j2 = j;
            while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
            while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
            std::string na = a.substr(i, i2 - i), nb = b.substr(j, j2 - j);
            na.erase(0, std::min(na.find_first_not_of('0'), na.size() - 1));
            nb.erase(0, std::min(nb.find_first_not_of('0'), nb.size() - 1));
            if (na.size() != nb.size()) return na.size() < nb.size();
            if (na != nb) return na < nb;
            i = i2;
            j = j2;
        } else {
            if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
            ++i;
            ++j;
        }
    }
    return a.size() - i < b.size() - j;
}

// ---- chat bundle (spec §6.1) ------------------------------------------------

void write_id_list(json::Writer &w, dom::element e, const std::string &where, bool &ok) {
    uint64_t v;
    dom::array arr;
    if (!e.get_uint64().get(v)) {
        w.begin_array().u64(v).end_array();
        ok = true;
    } else if (!e.get_array().get(arr)) {
        w.begin_array();
        for (auto x : arr) {
            if (x.get_uint64().get(v)) throw Error(CMF_ERR_PARSE, where + ": eos_token_id holds " + json::spelling(x) + ", which is not a token id");
            w.u64(v);
        }
        w.end_array();
        ok = true;
    }
}

// tokenizer_config.json's bos/eos policy: add_bos_token (default true) and
// add_eos_token (default false), as LlamaTokenizer(Fast) and
// GemmaTokenizer(Fast) default them, spelled by bos_token / eos_token.
struct BosEosPolicy {
    bool add_bos = true, add_eos = false;
    std::string bos = "<bos>", eos = "<eos>";
    std::string tokenizer_class;
};

BosEosPolicy read_bos_eos_policy(const fs::path &dir) {
    BosEosPolicy r;
    auto tc = read_file_if_exists(dir / "tokenizer_config.json");
    if (!tc) return r;
    dom::parser p;
    dom::object o = parse_object(p, *tc, (dir / "tokenizer_config.json").string());
    bool b;
    if (!o["add_bos_token"].get_bool().get(b)) r.add_bos = b;
    if (!o["add_eos_token"].get_bool().get(b)) r.add_eos = b;
    auto piece = [&](const char *key, std::string &out) {
        std::string_view sv;
        dom::object obj;
        if (!o[key].get_string().get(sv)) out = std::string(sv);
        else if (!o[key].get_object().get(obj) && !obj["content"].get_string().get(sv)) out = std::string(sv);
    };
    piece("bos_token", r.bos);
    piece("eos_token", r.eos);
    std::string_view cls;
    if (!o["tokenizer_class"].get_string().get(cls)) r.tokenizer_class = std::string(cls);
    return r;
}

// A tokenizer.model's tokenizer.json in the form HF's converter writes for
// Gemma, its post-processor per the bos/eos policy.
std::string sentencepiece_tokenizer_json(const fs::path &dir, const std::string &model_bytes) {
    const BosEosPolicy pol = read_bos_eos_policy(dir);
    HfBpeOptions opts;
    if (pol.add_bos) opts.bos_piece = pol.bos;
    if (pol.add_eos) opts.eos_piece = pol.eos;
    opts.extra_special = {"<start_of_turn>", "<end_of_turn>"};
    try {
        return hf_tokenizer_json_from_sentencepiece(parse_sentencepiece(model_bytes), opts);
    } catch (const Error &e) {
        throw Error(e.code(), (dir / "tokenizer.model").string() + ": " + e.message());
    }
}

// HF's LlamaTokenizerFast and GemmaTokenizerFast rebuild tokenizer.json's
// post-processor from tokenizer_config's add_bos_token / add_eos_token when
// they load (update_post_processor), so for those classes the config, not
// the file, decides whether <bos> is prepended. The file is kept verbatim
// unless its post-processor differs from the one the config implies.
std::string follow_bos_eos_policy(Runtime &rt, const fs::path &dir, std::string tokenizer_json) {
    const BosEosPolicy pol = read_bos_eos_policy(dir);
    std::string cls = pol.tokenizer_class;
    if (cls.size() > 4 && cls.compare(cls.size() - 4, 4, "Fast") == 0) cls.resize(cls.size() - 4);
    if (cls != "LlamaTokenizer" && cls != "GemmaTokenizer") return tokenizer_json;
    const std::string where = (dir / "tokenizer.json").string();
    boost::system::error_code ec;
    boost::json::value doc = boost::json::parse(tokenizer_json, ec);
    if (ec || !doc.is_object()) throw Error(CMF_ERR_PARSE, where + ": not a JSON object");
    boost::json::object &o = doc.as_object();
    // A piece's id: an added token's, else the model vocabulary's.
    auto id_of = [&](const std::string &piece) -> uint64_t {
        if (auto *added = o.if_contains("added_tokens"); added && added->is_array())
            for (const auto &t : added->as_array())
                if (t.is_object() && t.as_object().if_contains("content") && t.at("content") == piece.c_str() &&
                    t.as_object().if_contains("id") && t.at("id").is_int64())
                    return uint64_t(t.at("id").as_int64());
        if (auto *model = o.if_contains("model"); model && model->is_object())
            if (auto *vocab = model->as_object().if_contains("vocab"); vocab && vocab->is_object())
                if (auto *id = vocab->as_object().if_contains(piece); id && id->is_int64()) return uint64_t(id->as_int64());
        throw Error(CMF_ERR_PARSE, (dir / "tokenizer_config.json").string() + ": add_" +
                                       (piece == pol.bos ? "bos" : "eos") + "_token is true but \"" + piece +
                                       "\" is not a token of " + where);
    };
    const std::string bos = pol.add_bos ? pol.bos : "", eos = pol.add_eos ? pol.eos : "";
    boost::json::value want = boost::json::parse(
        bos_eos_post_processor_json(bos, bos.empty() ? 0 : id_of(bos), eos, eos.empty() ? 0 : id_of(eos)));
    const boost::json::value *have = o.if_contains("post_processor");
    if (have != nullptr && *have == want) return tokenizer_json;
    o["post_processor"] = std::move(want);
    rt.log(CMF_LOG_INFO, where + ": post-processor rebuilt from tokenizer_config.json (add_bos_token " +
                             (pol.add_bos ? "true" : "false") + ", add_eos_token " + (pol.add_eos ? "true" : "false") +
                             "), as " + pol.tokenizer_class + " does when it loads");
    return boost::json::serialize(doc);
}

}  // namespace

std::optional<std::string> tokenizer_json_of(Runtime &rt, const fs::path &dir) {
    if (auto v = read_file_if_exists(dir / "tokenizer.json")) {
        std::string json = follow_bos_eos_policy(rt, dir, std::move(*v));
        // The vocab section is what `cmfhost run` and the image pipeline
        // tokenize with: a tokenizer they cannot load fails here, before
        // hours of converting.
        try {
            (void)text::Tokenizer::from_json(json);
        } catch (const Error &e) {
            std::string_view what = e.what();
            if (what.rfind("tokenizer.json: ", 0) == 0) what.remove_prefix(16);
            throw Error(e.code(), (dir / "tokenizer.json").string() + ": " + std::string(what));
        }
        return json;
    }
    if (auto spm = read_file_if_exists(dir / "tokenizer.model")) {
        std::string json = sentencepiece_tokenizer_json(dir, *spm);
        rt.log(CMF_LOG_INFO, "no tokenizer.json: built one from " + (dir / "tokenizer.model").string());
        return json;
    }
    return std::nullopt;
}

namespace {

std::string tokenizer_config_json(const fs::path &dir, dom::object config) {
    json::Writer w;
    w.begin_object();
    // chat_template: chat_template.jinja if non-blank, else tokenizer_config.json's string.
    std::optional<std::string> tmpl;
    if (auto j = read_file_if_exists(dir / "chat_template.jinja"); j && j->find_first_not_of(" \t\r\n") != std::string::npos) tmpl = *j;
    if (!tmpl)
        if (auto tc = read_file_if_exists(dir / "tokenizer_config.json")) {
            dom::parser p;
            dom::object o = parse_object(p, *tc, (dir / "tokenizer_config.json").string());
            std::string_view s;
            dom::array list;
            if (!o["chat_template"].get_string().get(s)) tmpl = std::string(s);
            else if (!o["chat_template"].get_array().get(list))
                // The list form ([{name, template}]) names its default "default".
                for (auto item : list) {
                    std::string_view nm, t;
                    if (!item["name"].get_string().get(nm) && nm == "default" && !item["template"].get_string().get(t)) tmpl = std::string(t);
                }
        }
    if (tmpl) w.key("chat_template").string(*tmpl);
    // eos_token_ids: generation_config.json's eos_token_id, else config.json's. Always written.
    w.key("eos_token_ids");
    bool ok = false;
    if (auto gc = read_file_if_exists(dir / "generation_config.json")) {
        dom::parser p;
        dom::object o = parse_object(p, *gc, (dir / "generation_config.json").string());
        dom::element e;
        if (!o["eos_token_id"].get(e)) write_id_list(w, e, (dir / "generation_config.json").string(), ok);
    }
    dom::object tc = config;
    dom::object inner;
    if (!config["text_config"].get_object().get(inner)) tc = inner;
    if (!ok) {
        dom::element e;
        if (!config["eos_token_id"].get(e) || !tc["eos_token_id"].get(e)) write_id_list(w, e, (dir / "config.json").string(), ok);
    }
    if (!ok) w.begin_array().end_array();
    for (const char *k : {"bos_token_id", "pad_token_id"}) {
        uint64_t v;
        w.key(k);
        if (!config[k].get_uint64().get(v) || !tc[k].get_uint64().get(v)) w.u64(v);
        else w.null();
    }
    w.end_object();
    return w.take();
}

// ---- progress --------------------------------------------------------------

class Progress {
public:
    Progress(bool enabled, uint64_t tensors, uint64_t bytes,
             const std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> &cb)
        : on_(enabled && ::isatty(2)), tensors_(tensors), bytes_(bytes), cb_(cb), t0_(std::chrono::steady_clock::now()) {}
    void update(uint64_t tensors_done, uint64_t bytes_done) {
        if (cb_) cb_(tensors_done, tensors_, bytes_done, bytes_);
        if (!on_) return;
        double el = seconds();
        double frac = bytes_ ? static_cast<double>(bytes_done) / static_cast<double>(bytes_) : 1.0;
        int width = 30, fill = static_cast<int>(frac * width);
        double eta = frac > 0 ? el * (1 - frac) / frac : 0;
        std::fprintf(stderr, "\r[%.*s%*s] %llu/%llu tensors  %.1f/%.1f MiB  ETA %d:%02d ", fill,
                     "##############################", width - fill, "", static_cast<unsigned long long>(tensors_done),
                     static_cast<unsigned long long>(tensors_), static_cast<double>(bytes_done) / 1048576.0,
                     static_cast<double>(bytes_) / 1048576.0, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
        std::fflush(stderr);
    }
    void done() {
        if (on_) std::fprintf(stderr, "\n");
    }
    double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

private:
    bool on_;
    uint64_t tensors_, bytes_;
    const std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> &cb_;
    std::chrono::steady_clock::time_point t0_;
};

// --quant keep: each tensor gets the CMF dtype nearest to how its source
// stores it (docs/convert.md "keep").
std::string nearest_quant(const SourceTensor &t) {
    switch (t.dtype) {
    case SourceDtype::F32: return "f32";
    case SourceDtype::F16: return "f16";
    case SourceDtype::BF16: return "bf16";
    case SourceDtype::Ggml: break;
    }
    return gguf::nearest_quant(t.ggml_type);
}

// The arch plugin that converts a config's model_type.
const ArchEntry *arch_for_config(Runtime &rt, const std::string &config_json, const std::string &label) {
    dom::parser cfg_parser;
    dom::object config = parse_object(cfg_parser, config_json, label);
    std::string_view mt;
    if (config["model_type"].get_string().get(mt)) throw Error(CMF_ERR_PARSE, label + ": no \"model_type\" string");
    const ArchEntry *arch = rt.arch_for_hf_model_type(std::string(mt));
    if (!arch || !arch->vt.import_config || !arch->vt.import_tensor)
        throw Error(CMF_ERR_UNSUPPORTED, label + ": model_type \"" + std::string(mt) +
                                             "\" is not converted by any loaded arch plugin (is cmf-arch-*.so on the plugin path?)");
    return arch;
}

// config.json text -> the arch plugin that converts its model_type and the
// header's `arch` block it makes of it.
struct ImportedConfig {
    const ArchEntry *arch;
    std::string arch_json;
};
ImportedConfig import_config(Runtime &rt, const std::string &cfg_text, const std::string &cfg_name) {
    const ArchEntry *arch = arch_for_config(rt, cfg_text, cfg_name);
    StringSink arch_json;
    throw_if_error(arch->vt.import_config(arch->ctx, cfg_text.data(), cfg_text.size(), &arch_json.sink), cfg_name);
    return {arch, std::move(arch_json.s)};
}

// Every source tensor through the arch plugin's plan, a dtype for each
// output by the policy `policy_for` gives it, outputs in canonical order.
// Source tensors the arch does not convert are added to `dropped`. `label`
// names the model in messages.
std::vector<OutTensor> plan_tensors(const ImportedConfig &ic, const std::vector<const SourceTensor *> &tensors,
                                    const std::function<const QuantPolicy &(const OutTensor &)> &policy_for,
                                    const std::string &label, std::vector<std::string> &dropped) {
    std::vector<OutTensor> outs;
    std::map<std::string, std::string> produced_by;
    for (const SourceTensor *t : tensors) {
        if (t->shape.size() > CMF_MAX_DIMS)
            throw Error(CMF_ERR_PARSE, t->file + ": tensor \"" + t->name + "\" has " + std::to_string(t->shape.size()) + " dimensions; CMF allows at most 6");
        StringSink plan;
        throw_if_error(ic.arch->vt.import_tensor(ic.arch->ctx, ic.arch_json.data(), ic.arch_json.size(), t->name.c_str(),
                                                 static_cast<uint32_t>(t->shape.size()), t->shape.data(), &plan.sink),
                       t->file);
        std::vector<OutTensor> planned = parse_plan(plan.s, *t);
        if (planned.empty()) dropped.push_back(t->name);
        for (OutTensor &o : planned) {
            auto [it, fresh] = produced_by.emplace(o.p.name, t->name);
            if (!fresh)
                throw Error(CMF_ERR_PARSE, t->file + ": tensor \"" + t->name + "\" becomes \"" + o.p.name + "\", which \"" + it->second +
                                               "\" already produced");
            outs.push_back(std::move(o));
        }
    }
    const bool has_experts = std::any_of(outs.begin(), outs.end(), [](const OutTensor &o) { return is_routed_expert(o.p.name); });
    for (auto &o : outs) {
        DtypeChoice c = policy_for(o).choose(o.p.name, o.p.shape, has_experts);
        o.p.dtype = c.dtype;
        o.p.options = std::move(c.options);
    }
    if (outs.empty()) throw Error(CMF_ERR_PARSE, label + ": the model holds no convertible tensors");
    // A config announcing more layers than the checkpoint has would convert
    // into a file no arch can load: every announced layer must have tensors.
    dom::parser arch_parser;
    dom::element arch;
    uint64_t layers = 0;
    if (!arch_parser.parse(ic.arch_json).get(arch) && !arch["num_layers"].get_uint64().get(layers)) {
        std::vector<bool> seen(std::min<uint64_t>(layers, 1u << 20));
        for (const OutTensor &o : outs) {
            const std::string &n = o.p.name;
            if (n.rfind("model.layers.", 0) != 0) continue;
            uint64_t i = 0;
            size_t k = 13;
            for (; k < n.size() && n[k] >= '0' && n[k] <= '9' && i < (1u << 20); ++k) i = i * 10 + uint64_t(n[k] - '0');
            if (k > 13 && i < seen.size()) seen[i] = true;
        }
        for (uint64_t i = 0; i < seen.size(); ++i)
            if (!seen[i])
                throw Error(CMF_ERR_MISSING_TENSOR, label + ": the config announces " + std::to_string(layers) +
                                                        " layers but the checkpoint has no tensor of layer " +
                                                        std::to_string(i) + " (model.layers." + std::to_string(i) + ".*)");
    }
    std::stable_sort(outs.begin(), outs.end(), [](const OutTensor &a, const OutTensor &b) { return canonical_less(a.p.name, b.p.name); });
    return outs;
}

// convert --defrag: each dense layer's gate/up rows and down_proj columns
// cut to the skill directory's keep set (overlays folded in first), encoded
// at the new width with the dtype the policy picks for it;
// arch.intermediate_size becomes the widest layer's, provenance.defrag
// records the cut (as `defrag` does to a converted file).
void plan_defrag(Runtime &rt, const ConvertOptions &opts, const std::function<const QuantPolicy &(const OutTensor &)> &policy_for,
                 Planned &r) {
    bj::value header = bj::parse(r.plan.header_json);
    bj::object &arch = header.as_object()["arch"].as_object();
    if (arch.contains("moe") && !arch["moe"].is_null())
        throw Error(CMF_ERR_INVALID_ARGUMENT, "convert --defrag: a mixture-of-experts model; its experts are defragged by moe-defrag");
    const uint64_t layers = arch["num_layers"].to_number<uint64_t>(), inter = arch["intermediate_size"].to_number<uint64_t>();
    if (arch.contains("num_loops") && arch["num_loops"].is_number() && arch["num_loops"].to_number<uint64_t>() > 1)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "convert --defrag: a looped model; one defragged layer cannot serve every pass");
    std::map<std::string, OutTensor *> by_name;
    for (auto &o : r.outs) by_name[o.p.name] = &o;
    auto out_of = [&](const std::string &name) -> OutTensor & {
        auto it = by_name.find(name);
        if (it == by_name.end() || it->second->src == nullptr || it->second->p.shape.size() != 2)
            throw Error(CMF_ERR_MISSING_TENSOR, "convert --defrag: " + name + " is missing or not 2-D (every layer must be a dense gated FFN)");
        return *it->second;
    };
    auto values = [&](const std::string &name, std::vector<uint64_t> &shape) {
        const OutTensor &o = out_of(name);
        shape = o.p.shape;
        std::vector<float> v;
        gather_f32(o, v, false);
        return v;
    };
    auto defrag = std::make_shared<ConvertDefrag>(
        plan_convert_defrag(opts.defrag_dir, layers, inter, values, [&](const std::string &s) { rt.log(CMF_LOG_INFO, s); }));
    const bool has_experts = false;
    for (uint64_t l = 0; l < layers; ++l) {
        const auto &keep = defrag->keep[l];
        for (const char *w : {"gate", "up", "down"}) {
            OutTensor &o = out_of("model.layers." + std::to_string(l) + ".mlp." + w + "_proj.weight");
            const bool columns = w[0] == 'd';
            if (o.p.shape[columns ? 1 : 0] != inter)
                throw Error(CMF_ERR_BOUNDS, "convert --defrag: " + o.p.name + " is not " + std::to_string(inter) + " neurons wide");
            auto cut = std::make_shared<OutTensor::Cut>();
            cut->keep = keep;
            cut->columns = columns;
            cut->full_shape = o.p.shape;
            if (auto ov = defrag->overlays.find(o.p.name); ov != defrag->overlays.end()) {
                if (ov->second.shape != o.p.shape)
                    throw Error(CMF_ERR_BOUNDS, "convert --defrag: the overlay of " + o.p.name + " does not have its shape");
                cut->replace = &ov->second.values;
            }
            o.p.shape[columns ? 1 : 0] = keep.size();
            DtypeChoice c = policy_for(o).choose(o.p.name, o.p.shape, has_experts);
            o.p.dtype = c.dtype;
            o.p.options = std::move(c.options);
            o.cut = std::shared_ptr<const OutTensor::Cut>(std::move(cut));
        }
    }
    r.keep.push_back(defrag);  // the overlays the cuts point into
    uint64_t widest = 0;
    for (const auto &k : defrag->keep) widest = std::max<uint64_t>(widest, k.size());
    arch["intermediate_size"] = widest;
    header.as_object()["provenance"].as_object()["defrag"] = defrag_provenance(defrag->keep, inter, opts.defrag_dir);
    r.plan.header_json = bj::serialize(header);
    r.plan.tensors.clear();
    for (const auto &o : r.outs) r.plan.tensors.push_back(o.p);
}

Planned make_plan(Runtime &rt, const SourceModel &src, const ConvertOptions &opts) {
    Planned r;
    r.source_tensors = src.source_tensor_count ? src.source_tensor_count : src.tensors.size();
    const ImportedConfig ic = import_config(rt, src.config_json, src.config_label);
    const bool keep = opts.quant == "keep";
    std::optional<QuantPolicy> policy;
    if (!keep) policy.emplace(opts.quant, opts.quant_map);
    std::map<std::string, QuantPolicy> keep_policies;  // nearest quant name -> its policy
    auto policy_for = [&](const OutTensor &o) -> const QuantPolicy & {
        if (!keep) return *policy;
        const std::string q = nearest_quant(*o.src);
        auto it = keep_policies.find(q);
        if (it == keep_policies.end()) it = keep_policies.emplace(q, QuantPolicy(q, opts.quant_map)).first;
        return it->second;
    };
    std::vector<std::string> dropped;  // tensors the arch does not convert (vision towers, rotary buffers)
    r.outs = plan_tensors(ic, src.tensors, policy_for, src.config_label, dropped);
    if (!dropped.empty()) {
        // Said once, with examples: a multimodal checkpoint converts as its
        // text model only, and the user should know the rest was left out.
        std::string names;
        for (size_t i = 0; i < dropped.size() && i < 3; ++i) names += (i ? ", " : "") + dropped[i];
        rt.log(CMF_LOG_WARN, "not converted: " + std::to_string(dropped.size()) + " tensor" +
                                 (dropped.size() == 1 ? "" : "s") + " the " + ic.arch->name +
                                 " arch does not run (vision towers and projectors of multimodal checkpoints, "
                                 "computed buffers), e.g. " + names + (dropped.size() > 3 ? ", ..." : ""));
    }
    std::map<int32_t, uint64_t> elements_by_dtype;  // of 2-D outputs: what the header's quant_type names under keep
    for (const auto &o : r.outs)
        if (o.p.shape.size() == 2) elements_by_dtype[o.p.dtype] += o.elements;
    for (const auto &o : r.outs) r.plan.tensors.push_back(o.p);

    int32_t bulk = policy ? policy->base() : CMF_DTYPE_F16;
    if (keep) {
        uint64_t most = 0;
        for (auto [d, n] : elements_by_dtype)
            if (n > most) {
                most = n;
                bulk = d;
            }
    }
    // Header in the original converter's key order; section_hashes is the writer's.
    json::Writer h;
    h.begin_object();
    h.key("format").string("cmf");
    h.key("version").u64(2);
    h.key("arch").raw(ic.arch_json);
    h.key("quant_type").string(header_quant_type(bulk));
    h.key("provenance").begin_object();
    h.key(src.provenance_source_key).string(opts.source_name.empty() ? opts.model_dir : opts.source_name);
    h.key("tool").string(opts.tool);
    h.end_object();
    h.key("tokenizer_config").raw(src.tokenizer_config_json);
    h.end_object();
    r.plan.header_json = h.take();
    r.plan.vocab_bytes = src.vocab_bytes;
    if (!opts.defrag_dir.empty()) plan_defrag(rt, opts, policy_for, r);
    return r;
}

}  // namespace

ImportPlan plan_import(Runtime &rt, const std::string &config_json, const std::string &config_name,
                       const std::vector<const SourceTensor *> &tensors, const QuantPolicy &policy) {
    const ImportedConfig ic = import_config(rt, config_json, config_name);
    ImportPlan r;
    std::vector<std::string> dropped;
    for (const OutTensor &o : plan_tensors(ic, tensors, [&](const OutTensor &) -> const QuantPolicy & { return policy; }, config_name, dropped))
        r.tensors.push_back(o.p);
    r.arch_json = ic.arch_json;
    return r;
}

bool canonical_less(const std::string &a, const std::string &b) {
    int ga = group_of(a), gb = group_of(b);
    if (ga != gb) return ga < gb;
    return natural_less(order_key(a), order_key(b));
}

SourceModel load_checkpoint(Runtime &rt, const std::string &model_dir) {
    SourceModel m;
    const fs::path dir(model_dir);
    const fs::path cfg_path = dir / "config.json";
    auto cfg_text = read_file_if_exists(cfg_path);
    if (!cfg_text) throw Error(CMF_ERR_FILE_NOT_FOUND, cfg_path.string() + ": not found (expected a Hugging Face checkpoint directory)");
    m.config_json = std::move(*cfg_text);
    m.config_label = cfg_path.string();
    arch_for_config(rt, m.config_json, m.config_label);  // an unknown model_type fails before any tensor is read
    dom::parser parser;
    m.tokenizer_config_json = tokenizer_config_json(dir, parse_object(parser, m.config_json, m.config_label));
    if (auto v = tokenizer_json_of(rt, dir)) m.vocab_bytes = std::move(*v);
    else
        rt.log(CMF_LOG_WARN, "no tokenizer.json or tokenizer.model in " + dir.string() +
                                 ": the file will have no tokenizer, and `cmfhost run` cannot chat with it "
                                 "(logits --ids and bench work on token ids)");
    auto ckpt = std::make_shared<Checkpoint>(model_dir);
    m.tensors = ckpt->tensors();
    m.keep = ckpt;
    return m;
}

ConvertPlan plan_conversion(Runtime &rt, const ConvertOptions &opts) {
    SourceModel src = load_checkpoint(rt, opts.model_dir);
    return make_plan(rt, src, opts).plan;
}

namespace {

// One piece of work: rows [r0, r1) of an output tensor, or all of it.
struct Unit {
    const OutTensor *o;
    uint64_t r0, r1;
    uint32_t sections;  // 0: whole tensor through quantize; else quantize_rows' section count
    bool release;  // last reader of its source: drop pages while reading
    std::vector<std::vector<uint8_t>> bytes;  // per section (one for a whole tensor)
    cmf_error *err = nullptr;
    uint64_t rows() const { return o->p.shape.empty() ? 1 : o->p.shape[0]; }
    uint64_t f32_bytes() const { return (r1 - r0) * (o->elements / std::max<uint64_t>(rows(), 1)) * 4; }
    bool last() const { return sections == 0 || r1 == rows(); }
};

// quantize_rows' section count for this output and its payload size, or 0
// when it goes whole: small, transposed, a codec without row encoding, or a
// shape that codec cannot split by rows.
uint32_t row_sections(const CodecEntry &c, const OutTensor &o, uint64_t chunk_elements, uint64_t &payload_size) {
    const uint32_t ndim = static_cast<uint32_t>(o.p.shape.size());
    if (o.elements <= chunk_elements || o.transpose || o.cut || ndim == 0 || o.p.shape[0] < 2 || !c.vt.quantize_rows) return 0;
    uint32_t sections = 0;
    if (cmf_error *e = c.vt.quantize_rows(c.ctx, ndim, o.p.shape.data(), 0, 0, nullptr, nullptr, nullptr, &sections)) {
        if (!is_static_error(e)) delete e;  // quantize will report what is wrong with this shape
        return 0;
    }
    if (sections == 0 || sections > CMF_MAX_ROW_SECTIONS) return 0;
    if (cmf_error *e = c.vt.expected_size(c.ctx, ndim, o.p.shape.data(), &payload_size)) {
        if (!is_static_error(e)) delete e;
        return 0;
    }
    return payload_size == CMF_SIZE_VARIABLE ? 0 : sections;
}

void encode_unit(Runtime &rt, Unit &u) {
    const OutTensor &o = *u.o;
    if (o.src == nullptr) {
        u.bytes.assign(1, std::vector<uint8_t>(o.bytes.begin(), o.bytes.end()));
        return;
    }
    const CodecEntry *codec = rt.codec(o.p.dtype);
    cmf_quantize_params params{sizeof(cmf_quantize_params), 0, o.p.options.empty() ? nullptr : o.p.options.c_str(), nullptr, 0};
    const std::string what = "tensor \"" + o.p.name + "\" (" + dtype_name(o.p.dtype) + ")";
    const uint32_t ndim = static_cast<uint32_t>(o.p.shape.size());
    if (u.sections == 0) {
        std::vector<float> f32;
        if (o.cut && o.cut->replace != nullptr) f32 = *o.cut->replace;
        else gather_f32(o, f32, u.release);
        if (o.cut) f32 = cut_ffn(f32, o.cut->full_shape, o.cut->keep, o.cut->columns);
        u.bytes.resize(1);
        cmf_byte_sink bs = vector_sink(u.bytes[0]);
        throw_if_error(codec->vt.quantize(codec->ctx, ndim, o.p.shape.data(), f32.data(), &params, &bs), what);
        return;
    }
    const uint64_t cols = o.elements / u.rows();
    std::vector<float> f32((u.r1 - u.r0) * cols);
    gather_range(o, u.r0 * cols, u.r1 * cols, f32.data(), u.release);
    u.bytes.resize(u.sections);
    cmf_byte_sink sinks[CMF_MAX_ROW_SECTIONS];
    for (uint32_t k = 0; k < u.sections; ++k) sinks[k] = vector_sink(u.bytes[k]);
    uint32_t got = 0;
    throw_if_error(codec->vt.quantize_rows(codec->ctx, ndim, o.p.shape.data(), u.r0, u.r1, f32.data(), &params, sinks, &got), what);
    if (got != u.sections) throw Error(CMF_ERR_PLUGIN, what + ": the codec changed its section count between calls");
}

}  // namespace

void TensorSink::begin_tensor(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, uint64_t nbytes) {
    if (piecewise_) throw Error(CMF_ERR_INTERNAL, "begin_tensor while \"" + piecewise_->name + "\" is open");
    piecewise_ = Piecewise{name, dtype, shape, {}};
    piecewise_->bytes.reserve(nbytes);
}

void TensorSink::append(const uint8_t *data, uint64_t n) {
    if (!piecewise_) throw Error(CMF_ERR_INTERNAL, "append without begin_tensor");
    piecewise_->bytes.insert(piecewise_->bytes.end(), data, data + n);
}

void TensorSink::end_tensor() {
    if (!piecewise_) throw Error(CMF_ERR_INTERNAL, "end_tensor without begin_tensor");
    Piecewise t = std::move(*piecewise_);
    piecewise_.reset();
    add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
}

ConvertStats convert_checkpoint(Runtime &rt, const ConvertOptions &opts, TensorSink &sink) {
    std::optional<SourceModel> src;
    try {
        src.emplace(load_checkpoint(rt, opts.model_dir));
    } catch (...) {
        sink.abort();
        throw;
    }
    return convert_source(rt, *src, opts, sink);
}

ConvertStats convert_source(Runtime &rt, const SourceModel &src, const ConvertOptions &opts, TensorSink &sink) {
    std::optional<Planned> pl;
    try {
        pl.emplace(make_plan(rt, src, opts));
    } catch (...) {
        sink.abort();
        throw;
    }
    return write_planned(rt, *pl, opts, sink);
}

ConvertStats write_planned(Runtime &rt, Planned &pl, const ConvertOptions &opts, TensorSink &sink) {
    try {
        auto &outs = pl.outs;
        // Every dtype must have an encoder before anything is written.
        for (const auto &o : outs) {
            if (o.src == nullptr) continue;  // stored bytes: nothing to encode
            const CodecEntry *c = rt.codec(o.p.dtype);
            if (!c || !c->vt.quantize)
                throw Error(CMF_ERR_UNKNOWN_DTYPE, "tensor \"" + o.p.name + "\" needs dtype " + dtype_name(o.p.dtype) +
                                                       " but no loaded codec plugin can encode it");
        }
        ConvertStats st;
        st.source_tensors = pl.source_tensors;
        st.tensors = outs.size();
        uint64_t total_in = 0;
        for (const auto &o : outs) total_in += o.input_bytes();
        // Last output index reading each source tensor: its pages are
        // released once that output is written.
        std::map<const SourceTensor *, size_t> last_use;
        for (size_t i = 0; i < outs.size(); ++i)
            if (outs[i].src != nullptr) last_use[outs[i].src] = i;
        // Each source file's last use, for the sink's milestones.
        std::map<const SourceFile *, size_t> file_last;
        for (auto [t, i] : last_use) {
            if (!t->owner) continue;
            auto &slot = file_last[t->owner];
            slot = std::max(slot, i);
        }

        // Work units in output order: large tensors in row chunks where the
        // codec encodes by rows, everything else whole.
        std::vector<Unit> units;
        std::vector<uint64_t> payload_size(outs.size(), 0);
        const uint64_t chunk = opts.chunk_elements ? opts.chunk_elements : uint64_t(4) << 20;
        uint64_t largest_whole = 0;
        for (size_t i = 0; i < outs.size(); ++i) {
            const OutTensor &o = outs[i];
            const uint64_t rows = o.p.shape.empty() ? 1 : o.p.shape[0];
            if (o.src == nullptr) {  // stored bytes go as they are
                units.push_back(Unit{&o, 0, rows, 0, false, {}});
                continue;
            }
            const CodecEntry *c = rt.codec(o.p.dtype);
            const bool rel = last_use[o.src] == i;
            if (const uint32_t sections = row_sections(*c, o, chunk, payload_size[i])) {
                const uint64_t cols = o.elements / rows;
                const uint64_t step = std::max<uint64_t>(1, chunk / std::max<uint64_t>(cols, 1));
                for (uint64_t r = 0; r < rows; r += step) units.push_back(Unit{&o, r, std::min(rows, r + step), sections, rel, {}});
                continue;
            }
            largest_whole = std::max(largest_whole, o.elements * 4);
            units.push_back(Unit{&o, 0, rows, 0, rel, {}});
        }

        sink.begin(pl.plan.header_json, st.source_tensors, outs.size());
        Progress progress(opts.progress, outs.size(), total_in, opts.on_progress);
        const uint64_t budget = std::max(largest_whole, opts.memory_budget ? opts.memory_budget : uint64_t(64) << 20);

        size_t next = 0;
        uint64_t done_bytes = 0;
        std::vector<std::vector<uint8_t>> held;  // sections >= 1 of the chunked tensor being written
        while (next < units.size()) {
            size_t end = next;
            uint64_t used = 0;
            while (end < units.size() && (end == next || used + units[end].f32_bytes() <= budget)) used += units[end++].f32_bytes();
            struct Ctx {
                Runtime *rt;
                Unit *units;
            } ctx{&rt, units.data() + next};
            rt.pool().parallel_for(0, end - next, 1, [](void *p, uint64_t b, uint64_t e) {
                auto *c = static_cast<Ctx *>(p);
                for (uint64_t i = b; i < e; ++i) c->units[i].err = guard([&] { encode_unit(*c->rt, c->units[i]); });
            }, &ctx);
            for (size_t i = next; i < end; ++i) {
                if (units[i].err) {
                    for (size_t k = next; k < end; ++k)
                        if (units[k].err && units[k].err != units[i].err && !is_static_error(units[k].err)) delete units[k].err;
                    throw_if_error(units[i].err);
                }
            }
            for (size_t i = next; i < end; ++i) {
                Unit &u = units[i];
                const OutTensor &o = *u.o;
                const size_t idx = static_cast<size_t>(u.o - outs.data());
                if (u.sections == 0) {
                    sink.add(o.p.name, o.p.dtype, o.p.shape, u.bytes[0].data(), u.bytes[0].size());
                } else {
                    if (u.r0 == 0) {
                        sink.begin_tensor(o.p.name, o.p.dtype, o.p.shape, payload_size[idx]);
                        held.assign(u.sections, {});
                    }
                    sink.append(u.bytes[0].data(), u.bytes[0].size());
                    for (uint32_t k = 1; k < u.sections; ++k) held[k].insert(held[k].end(), u.bytes[k].begin(), u.bytes[k].end());
                    if (u.last()) {
                        for (uint32_t k = 1; k < u.sections; ++k) sink.append(held[k].data(), held[k].size());
                        sink.end_tensor();
                        std::vector<std::vector<uint8_t>>().swap(held);
                    }
                }
                for (const auto &b : u.bytes) st.output_bytes += b.size();
                std::vector<std::vector<uint8_t>>().swap(u.bytes);
                const uint64_t in = o.src == nullptr ? o.input_bytes() : source_bytes(*o.src, u.f32_bytes() / 4);
                st.source_bytes += in;
                done_bytes += in;
                const bool tensor_done = u.last();
                if (tensor_done) {
                    if (o.src != nullptr && last_use[o.src] == idx) release_elements(*o.src, 0, o.src->elements);
                    for (auto &[f, last] : file_last)
                        if (last == idx) sink.mark(f->path());
                }
                progress.update(tensor_done ? idx + 1 : idx, done_bytes);
            }
            next = end;
        }
        progress.done();
        sink.finish(pl.plan.vocab_bytes);
        st.seconds = progress.seconds();
        return st;
    } catch (...) {
        sink.abort();
        throw;
    }
}

}  // namespace cmf::convert
