#include "convert/defrag.hpp"

#include "common/byte_views.hpp"
#include "common/error.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"
#include "container/writer.hpp"
#include "convert/dtype_policy.hpp"
#include "plugin_host/runtime.hpp"

#include <boost/json.hpp>

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace cmf::convert {

namespace bj = boost::json;
namespace fs = std::filesystem;
using container::Model;
using container::TensorRec;

Npy read_npy(const std::string &path, const std::vector<uint64_t> &want) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(CMF_ERR_FILE_NOT_FOUND, "cannot read '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string b = ss.str();
    auto fail = [&](const std::string &why) -> void { throw Error(CMF_ERR_PARSE, path + ": " + why); };
    if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) fail("not a .npy file (no \\x93NUMPY magic)");
    const uint8_t major = uint8_t(b[6]);
    uint64_t hlen = 0, start = 0;
    if (major == 1) {
        hlen = uint8_t(b[8]) | uint64_t(uint8_t(b[9])) << 8;
        start = 10;
    } else if (major == 2 || major == 3) {
        if (b.size() < 12) fail("truncated header");
        hlen = uint8_t(b[8]) | uint64_t(uint8_t(b[9])) << 8 | uint64_t(uint8_t(b[10])) << 16 | uint64_t(uint8_t(b[11])) << 24;
        start = 12;
    } else {
        fail("format version " + std::to_string(major) + " (1, 2 or 3 expected)");
    }
    if (start + hlen > b.size()) fail("header runs past the end of the file");
    const std::string h = b.substr(start, hlen);
    auto value_of = [&](const std::string &key) {
        const size_t k = h.find("'" + key + "'");
        if (k == std::string::npos) fail("header has no '" + key + "'");
        const size_t colon = h.find(':', k);
        if (colon == std::string::npos) fail("header: no value for '" + key + "'");
        return h.substr(colon + 1);
    };
    const std::string descr = value_of("descr");
    auto is = [&](const char *d) { return descr.find(std::string("'") + d + "'") < descr.find(','); };
    uint64_t es = 0;
    Npy a;
    if (is("|b1")) es = 1, a.boolean = true;
    else if (is("|u1") || is("<u1")) es = 1;
    else if (is("<f4")) es = 4;
    else if (is("<f8")) es = 8;
    else fail("dtype must be bool (|b1), uint8 (|u1), float32 (<f4) or float64 (<f8)");
    const std::string fortran = value_of("fortran_order");
    if (fortran.find("False") > fortran.find_first_of(",}")) fail("a Fortran-order array (C order expected)");
    const std::string sh = value_of("shape");
    const size_t open = sh.find('('), close = sh.find(')');
    if (open == std::string::npos || close == std::string::npos || close < open) fail("header: shape is not a tuple");
    std::stringstream ds(sh.substr(open + 1, close - open - 1));
    std::string part;
    uint64_t n = 1;
    while (std::getline(ds, part, ',')) {
        const size_t x = part.find_first_not_of(" "), z = part.find_last_not_of(" ");
        if (x == std::string::npos) continue;
        const std::string d = part.substr(x, z - x + 1);
        if (d.empty() || d.size() > 12 || !std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; }))
            fail("shape entry '" + d + "'");
        a.shape.push_back(std::stoull(d));
        n *= a.shape.back();
        if (n > (uint64_t(1) << 40)) fail("shape too large");
    }
    if (!want.empty() && a.shape != want) {
        auto text = [](const std::vector<uint64_t> &v) {
            std::string t;
            for (uint64_t d : v) t += (t.empty() ? "" : ", ") + std::to_string(d);
            return "(" + t + ")";
        };
        fail("shape " + text(a.shape) + ", the model needs " + text(want));
    }
    const uint64_t data = start + hlen;
    if (b.size() - data != n * es) fail(std::to_string(b.size() - data) + " data bytes for " + std::to_string(n) + " elements");
    a.values.resize(n);
    const char *p = b.data() + data;
    for (uint64_t i = 0; i < n; ++i) {
        if (es == 1) {
            a.values[i] = float(uint8_t(p[i]));
        } else if (es == 4) {
            std::memcpy(&a.values[i], p + 4 * i, 4);
        } else {
            double d;
            std::memcpy(&d, p + 8 * i, 8);
            a.values[i] = float(d);
        }
    }
    return a;
}

namespace {

[[noreturn]] void bad(const std::string &m) { throw Error(CMF_ERR_INVALID_ARGUMENT, m); }

std::vector<uint64_t> shape_of(const TensorRec &t) { return std::vector<uint64_t>(t.shape, t.shape + t.ndim); }

size_t index_of(const Model &m, const TensorRec &t) { return size_t(&t - m.tensors().data()); }

bool bit(const uint8_t *row, uint64_t i) { return (row[i / 8] >> (i % 8)) & 1u; }

// ---- keep sets: per layer, the kept neurons ascending ---------------------

// The FFN rows of task `name`. Only a mask that leaves every head and layer
// on defrags to what the task runs: the rest of a mask has no place in a
// file without masks.
KeepSets keep_of_task(const Model &m, const std::string &name) {
    const auto &arch = m.header().arch;
    const container::MaskRec *rec = nullptr;
    std::string names;
    for (const auto &r : m.masks()) {
        if (r.name == name) rec = &r;
        names += (names.empty() ? "" : ", ") + r.name;
    }
    if (m.masks().empty()) bad("task '" + name + "': the file has no task masks");
    if (rec == nullptr) throw Error(CMF_ERR_NOT_FOUND, "task '" + name + "' is not in the file (its tasks: " + names + ")");
    const auto &l = m.mask_layout();
    const uint64_t N = l.physical_layers;
    if (l.visits != N || rec->ffn_rows != N)
        bad("task '" + name + "': a looped model's FFN rows differ per visit of a layer; one defragged layer cannot hold them");
    const uint8_t *heads = rec->blob + N * l.ffn_row_bytes, *gates = heads + N * l.head_row_bytes;
    for (uint64_t layer = 0; layer < N; ++layer) {
        if (!bit(gates, layer))
            bad("task '" + name + "' turns layer " + std::to_string(layer) +
                " off; defrag removes FFN neurons only (run the task with --task instead)");
        for (uint64_t h = 0; h < arch.num_attention_heads; ++h)
            if (!bit(heads + layer * l.head_row_bytes, h))
                bad("task '" + name + "' turns attention head " + std::to_string(h) + " of layer " + std::to_string(layer) +
                    " off; defrag removes FFN neurons only (run the task with --task instead)");
    }
    KeepSets keep(N);
    for (uint64_t layer = 0; layer < N; ++layer)
        for (uint64_t i = 0; i < arch.intermediate_size; ++i)
            if (bit(rec->blob + layer * l.ffn_row_bytes, i)) keep[layer].push_back(uint32_t(i));
    return keep;
}

// The kept neurons of a [layers, intermediate] keep array (nonzero = kept).
KeepSets keep_of_npy(const std::string &path, uint64_t layers, uint64_t inter) {
    const Npy a = read_npy(path, {layers, inter});
    KeepSets keep(layers);
    for (uint64_t l = 0; l < layers; ++l)
        for (uint64_t i = 0; i < inter; ++i)
            if (a.values[l * inter + i] != 0.0f) keep[l].push_back(uint32_t(i));
    return keep;
}

// The columns of a row-major [rows, cols] matrix holding a nonzero value.
std::vector<uint32_t> live_columns(const float *v, uint64_t rows, uint64_t cols) {
    std::vector<bool> live(cols, false);
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t c = 0; c < cols; ++c) live[c] = live[c] || v[r * cols + c] != 0.0f;
    std::vector<uint32_t> keep;
    for (uint64_t c = 0; c < cols; ++c)
        if (live[c]) keep.push_back(uint32_t(c));
    return keep;
}

// The neurons whose down_proj input column holds a nonzero value: a
// neuron with an all-zero column contributes nothing whatever it computes.
KeepSets keep_of_zero_columns(const Model &m, uint64_t layers) {
    KeepSets keep(layers);
    for (uint64_t l = 0; l < layers; ++l) {
        const std::string name = "model.layers." + std::to_string(l) + ".mlp.down_proj.weight";
        const TensorRec *t = m.find(name);
        if (t == nullptr || t->ndim != 2) bad(name + ": missing or not 2-D (a dense FFN layer is needed)");
        const uint64_t rows = t->shape[0], cols = t->shape[1];
        std::vector<float> v(rows * cols);
        m.dequantize(index_of(m, *t), 0, rows, v.data(), v.size());
        keep[l] = live_columns(v.data(), rows, cols);
    }
    return keep;
}

// ---- payload surgery ---------------------------------------------------------

uint64_t float_size(int32_t dtype) {
    return dtype == CMF_DTYPE_F32 ? 4 : dtype == CMF_DTYPE_F16 || dtype == CMF_DTYPE_BF16 ? 2 : 0;
}

const CodecEntry &codec_of(Runtime &rt, int32_t dtype, const std::string &what) {
    const CodecEntry *c = rt.codec(dtype);
    if (c == nullptr) throw Error(CMF_ERR_UNSUPPORTED, what + ": no codec for " + dtype_name(dtype));
    return *c;
}

template <class Member>
bool has_member(const cmf_codec_vt &vt, Member cmf_codec_vt::*m, size_t offset) {
    return vt.struct_size >= offset + sizeof(void *) && vt.*m != nullptr;
}

cmf_quantize_params no_params() { return cmf_quantize_params{sizeof(cmf_quantize_params), 0, nullptr, nullptr, 0}; }

// f32 values encoded as `dtype` at `shape`; a dtype that cannot take the
// shape (a quant group of 32 across a new width) falls back to q8_2f as the
// original's defrag does.
SlicedTensor encode(Runtime &rt, int32_t dtype, std::vector<uint64_t> shape, const std::vector<float> &vals, const std::string &what) {
    const CodecEntry *c = rt.codec(dtype);
    uint64_t size = 0;
    bool fits = c != nullptr && c->vt.quantize != nullptr;
    if (fits) {
        // An error here only says that the shape does not fit the dtype.
        cmf_error *why = c->vt.expected_size(c->ctx, uint32_t(shape.size()), shape.data(), &size);
        fits = why == nullptr;
        cmf_error_free(why);
    }
    if (!fits) {
        dtype = CMF_DTYPE_Q8_2F;
        c = &codec_of(rt, dtype, what);
    }
    SlicedTensor p{dtype, shape, {}, false};
    const cmf_quantize_params params = no_params();
    cmf_byte_sink sink = vector_sink(p.bytes);
    throw_if_error(c->vt.quantize(c->ctx, uint32_t(shape.size()), shape.data(), vals.data(), &params, &sink),
                   what + " (" + dtype_name(dtype) + ")");
    return p;
}

}  // namespace

SlicedTensor take_rows(Runtime &rt, const Model &m, const TensorRec &t, const std::vector<uint32_t> &keep) {
    const uint64_t rows = t.shape[0], cols = t.ndim >= 2 ? t.shape[1] : 1;
    std::vector<uint64_t> shape = shape_of(t);
    shape[0] = keep.size();
    const uint8_t *src = m.verified(t);
    std::vector<uint64_t> section_row_bytes;
    if (const uint64_t es = float_size(t.dtype)) {
        section_row_bytes = {cols * es};
    } else if (t.ndim == 2) {
        const CodecEntry &c = codec_of(rt, t.dtype, t.name);
        if (has_member(c.vt, &cmf_codec_vt::quantize_rows, offsetof(cmf_codec_vt, quantize_rows))) {
            uint32_t n = 0;
            const cmf_quantize_params params = no_params();
            cmf_error *why = c.vt.quantize_rows(c.ctx, t.ndim, t.shape, 0, 1, nullptr, &params, nullptr, &n);
            if (why != nullptr) n = 0;  // cannot encode by rows: re-encode below
            cmf_error_free(why);
            if (n > 0) {
                std::vector<std::vector<uint8_t>> parts(n);
                std::vector<cmf_byte_sink> sinks;
                for (auto &p : parts) sinks.push_back(vector_sink(p));
                const std::vector<float> zero(cols, 0.0f);
                throw_if_error(c.vt.quantize_rows(c.ctx, t.ndim, t.shape, 0, 1, zero.data(), &params, sinks.data(), &n), t.name);
                uint64_t total = 0;
                for (const auto &p : parts) {
                    section_row_bytes.push_back(p.size());
                    total += p.size() * rows;
                }
                if (total != t.nbytes) section_row_bytes.clear();  // rows of unequal size: re-encode
            }
        }
    }
    if (!section_row_bytes.empty()) {
        SlicedTensor p{t.dtype, shape, {}, true};
        uint64_t base = 0;
        for (uint64_t rb : section_row_bytes) {
            for (uint32_t r : keep) p.bytes.insert(p.bytes.end(), src + base + r * rb, src + base + (r + 1) * rb);
            base += rb * rows;
        }
        return p;
    }
    std::vector<float> all(rows * cols), kept;
    m.dequantize(index_of(m, t), 0, t.ndim >= 2 ? rows : 1, all.data(), all.size());
    for (uint32_t r : keep) kept.insert(kept.end(), all.begin() + r * cols, all.begin() + (r + 1) * cols);
    return encode(rt, t.dtype, shape, kept, t.name);
}

namespace {

// Columns `keep` of a 2-D tensor: the codec's column selection where it
// selects single columns (every value the source's), else dequantized and
// re-encoded at the new width.
SlicedTensor take_columns(Runtime &rt, const Model &m, const TensorRec &t, const std::vector<uint32_t> &keep) {
    const uint64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<uint64_t> shape = {rows, keep.size()};
    const uint8_t *src = m.verified(t);
    if (const uint64_t es = float_size(t.dtype)) {
        SlicedTensor p{t.dtype, shape, std::vector<uint8_t>(rows * keep.size() * es), true};
        uint8_t *d = p.bytes.data();
        for (uint64_t r = 0; r < rows; ++r)
            for (uint32_t c : keep) {
                std::memcpy(d, src + (r * cols + c) * es, es);
                d += es;
            }
        return p;
    }
    const CodecEntry &c = codec_of(rt, t.dtype, t.name);
    const std::vector<uint64_t> ts = shape_of(t);
    const cmf_tensor_view v = tensor_view(t.dtype, ts, t.data, t.nbytes);
    uint64_t g = 0;
    if (has_member(c.vt, &cmf_codec_vt::select_columns, offsetof(cmf_codec_vt, select_columns)))
        throw_if_error(c.vt.select_columns(c.ctx, &v, nullptr, 0, nullptr, &g), t.name);
    if (g == 1) {
        SlicedTensor p{t.dtype, shape, {}, true};
        const std::vector<uint64_t> blocks(keep.begin(), keep.end());
        cmf_byte_sink sink = vector_sink(p.bytes);
        throw_if_error(c.vt.select_columns(c.ctx, &v, blocks.data(), blocks.size(), &sink, &g), t.name);
        return p;
    }
    std::vector<float> all(rows * cols), kept;
    kept.reserve(rows * keep.size());
    m.dequantize(index_of(m, t), 0, rows, all.data(), all.size());
    for (uint64_t r = 0; r < rows; ++r)
        for (uint32_t k : keep) kept.push_back(all[r * cols + k]);
    return encode(rt, t.dtype, shape, kept, t.name);
}

double round4(double x) { return std::round(x * 10000.0) / 10000.0; }

}  // namespace

std::string defrag_ffn(Runtime &rt, const DefragOptions &o) {
    auto say = [&](const std::string &s) {
        if (o.say) o.say(s);
    };
    if (o.input.empty() || o.output.empty()) bad("defrag: the input and the output are required");
    if (!o.task.empty() && !o.keep_npy.empty()) bad("defrag: give a task or a keep file, not both");
    if (fs::exists(o.output) && fs::weakly_canonical(o.output) == fs::weakly_canonical(o.input))
        bad("defrag: the output must differ from the input");
    Model m;
    Model::open(m, rt, o.input, 0);
    const auto &arch = m.header().arch;
    if (arch.has_moe) bad(o.input + ": a mixture-of-experts model; its experts are defragged by moe-defrag");
    if (m.header().provenance_json.find("\"defrag\"") != std::string::npos)
        bad(o.input + ": the file is defragged already (provenance.defrag)");
    const uint64_t L = arch.num_layers, inter = arch.intermediate_size;
    std::string source = o.source;
    KeepSets keep;
    if (!o.task.empty()) {
        keep = keep_of_task(m, o.task);
        if (source.empty()) source = "task:" + o.task;
    } else if (!o.keep_npy.empty()) {
        keep = keep_of_npy(o.keep_npy, L, inter);
        if (source.empty()) source = fs::path(o.keep_npy).parent_path().filename().string();
    } else {
        keep = keep_of_zero_columns(m, L);
        if (source.empty()) source = "zero down_proj columns";
    }
    // The tensors each layer's keep set rewrites.
    struct Cut {
        const std::vector<uint32_t> *keep;
        bool columns;
    };
    std::map<std::string, Cut> cuts;
    uint64_t kept_total = 0, widest = 0;
    bj::array kept_per_layer;
    for (uint64_t l = 0; l < L; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
        const TensorRec *gate = m.find(p + "gate_proj.weight"), *up = m.find(p + "up_proj.weight"),
                        *down = m.find(p + "down_proj.weight");
        if (gate == nullptr || up == nullptr || down == nullptr)
            bad(p + "{gate,up,down}_proj.weight: layer " + std::to_string(l) + " is not a dense gated FFN (nothing to defrag)");
        const uint64_t width = gate->shape[0];
        if (up->shape[0] != width || down->ndim != 2 || down->shape[1] != width)
            throw Error(CMF_ERR_BOUNDS, "layer " + std::to_string(l) + ": gate/up rows and down columns disagree");
        if (width != inter)
            bad("layer " + std::to_string(l) + " is " + std::to_string(width) + " neurons wide, not intermediate_size " +
                std::to_string(inter) + ": the file is defragged already");
        if (keep[l].empty()) bad("layer " + std::to_string(l) + " keeps no FFN neuron; a layer needs at least one");
        kept_total += keep[l].size();
        widest = std::max<uint64_t>(widest, keep[l].size());
        kept_per_layer.push_back(keep[l].size());
        if (keep[l].size() == width) continue;  // kept whole: copied as it is
        for (const char *n : {"gate_proj.bias", "up_proj.bias"})
            if (m.find(p + n) != nullptr) cuts[p + n] = {&keep[l], false};
        cuts[p + "gate_proj.weight"] = {&keep[l], false};
        cuts[p + "up_proj.weight"] = {&keep[l], false};
        cuts[p + "down_proj.weight"] = {&keep[l], true};
    }
    const double pruned = 1.0 - double(kept_total) / double(L * inter);
    say("keeping " + std::to_string(kept_total) + " of " + std::to_string(L * inter) + " FFN neurons (" + source + ")");

    bj::value parsed = bj::parse(m.header_text());
    bj::object &header = parsed.as_object();
    header.erase("section_hashes");
    header.erase("shard");
    header["arch"].as_object()["intermediate_size"] = widest;
    if (!header.contains("provenance") || !header["provenance"].is_object()) header["provenance"] = bj::object{};
    header["provenance"].as_object()["defrag"] = defrag_provenance(keep, inter, source);
    // No masks: their FFN rows are of the old widths (spec §11).
    container::Writer w(rt, o.output, container::json::emit_header(header), 0, std::nullopt);
    std::vector<SlicedTensor> owned;
    owned.reserve(cuts.size());
    uint64_t reencoded = 0;
    for (const auto &t : m.tensors()) {
        auto it = cuts.find(t.name);
        if (it == cuts.end()) {
            w.add_tensor(t.name, t.dtype, t.ndim, t.shape, m.verified(t), t.nbytes);
            continue;
        }
        SlicedTensor p = it->second.columns ? take_columns(rt, m, t, *it->second.keep) : take_rows(rt, m, t, *it->second.keep);
        reencoded += !p.exact;
        if (!p.exact)
            say(t.name + ": re-encoded as " + dtype_name(p.dtype) + " at the new width (" + dtype_name(t.dtype) +
                " cannot keep single columns)");
        owned.push_back(std::move(p));
        const SlicedTensor &q = owned.back();
        w.add_tensor(t.name, q.dtype, uint32_t(q.shape.size()), q.shape.data(), q.bytes.data(), q.bytes.size());
    }
    if (m.has_vocab()) w.set_vocab(m.vocab(), m.vocab_len());
    w.finish();
    return bj::serialize(bj::object{{"output", o.output}, {"kept_per_layer", kept_per_layer}, {"pre_intermediate", inter},
                                    {"post_intermediate_max", widest}, {"pruned_ratio", round4(pruned)},
                                    {"tensors_cut", cuts.size()}, {"reencoded", reencoded}, {"source", source}});
}

bj::object defrag_provenance(const KeepSets &keep, uint64_t inter, const std::string &source) {
    bj::array kept;
    uint64_t total = 0, widest = 0;
    for (const auto &k : keep) {
        kept.push_back(k.size());
        total += k.size();
        widest = std::max<uint64_t>(widest, k.size());
    }
    const double pruned = 1.0 - double(total) / double(keep.size() * inter);
    return bj::object{{"kept_per_layer", kept}, {"post_intermediate_max", widest}, {"pre_intermediate", inter},
                      {"pruned_ratio", round4(pruned)}, {"source_skill", source}};
}

std::vector<float> cut_ffn(const std::vector<float> &full, const std::vector<uint64_t> &shape, const std::vector<uint32_t> &keep,
                           bool columns) {
    const uint64_t rows = shape.at(0), cols = shape.at(1);
    std::vector<float> out;
    out.reserve(keep.size() * (columns ? rows : cols));
    if (columns) {
        for (uint64_t r = 0; r < rows; ++r)
            for (uint32_t c : keep) out.push_back(full[r * cols + c]);
    } else {
        for (uint32_t r : keep) out.insert(out.end(), full.begin() + int64_t(r * cols), full.begin() + int64_t((r + 1) * cols));
    }
    return out;
}

ConvertDefrag plan_convert_defrag(
    const std::string &dir, uint64_t layers, uint64_t inter,
    const std::function<std::vector<float>(const std::string &name, std::vector<uint64_t> &shape)> &values,
    const std::function<void(const std::string &)> &say) {
    if (!fs::is_directory(dir)) throw Error(CMF_ERR_FILE_NOT_FOUND, "defrag directory '" + dir + "' does not exist or is not a directory");
    ConvertDefrag d;
    auto ffn_name = [](uint64_t l, const char *w) { return "model.layers." + std::to_string(l) + ".mlp." + w + "_proj.weight"; };
    std::map<std::string, std::vector<uint64_t>> ffn_shapes;  // every dense FFN weight: its full shape
    for (uint64_t l = 0; l < layers; ++l)
        for (const char *w : {"gate", "up", "down"}) {
            const std::string n = ffn_name(l, w);
            ffn_shapes[n] = w[0] == 'd' ? std::vector<uint64_t>{0, inter} : std::vector<uint64_t>{inter, 0};
        }
    const fs::path tdir = fs::path(dir) / "tensors";
    if (fs::is_directory(tdir)) {
        std::vector<fs::path> files;
        for (const auto &e : fs::directory_iterator(tdir))
            if (e.path().extension() == ".npy") files.push_back(e.path());
        std::sort(files.begin(), files.end());
        for (const auto &f : files) {
            const std::string name = f.stem().string();
            auto it = ffn_shapes.find(name);
            if (it == ffn_shapes.end())
                bad(f.string() + ": an overlay for '" + name + "', which is not a dense FFN weight of the model "
                                 "(model.layers.L.mlp.{gate,up,down}_proj.weight); only those are defragged");
            Npy a = read_npy(f.string());
            if (a.boolean) throw Error(CMF_ERR_PARSE, f.string() + ": an overlay must hold float values, not bool");
            const auto &want = it->second;
            if (a.shape.size() != 2 || (want[0] != 0 && a.shape[0] != want[0]) || (want[1] != 0 && a.shape[1] != want[1]))
                throw Error(CMF_ERR_BOUNDS, f.string() + ": shape does not match '" + name + "' (" + std::to_string(inter) +
                                                " neurons wide)");
            d.overlays.emplace(name, std::move(a));
        }
    }
    say("defrag: " + std::to_string(d.overlays.size()) + " FFN overlay(s) from " + tdir.string());
    const fs::path keep_path = fs::path(dir) / "ffn_keep.npy";
    if (fs::exists(keep_path)) {
        d.keep = keep_of_npy(keep_path.string(), layers, inter);
    } else {
        say("defrag: no ffn_keep.npy, keeping the neurons whose down_proj column is not all zero");
        d.keep.resize(layers);
        for (uint64_t l = 0; l < layers; ++l) {
            const std::string n = ffn_name(l, "down");
            auto ov = d.overlays.find(n);
            if (ov != d.overlays.end()) {
                d.keep[l] = live_columns(ov->second.values.data(), ov->second.shape[0], ov->second.shape[1]);
            } else {
                std::vector<uint64_t> shape;
                const std::vector<float> v = values(n, shape);
                if (shape.size() != 2 || shape[1] != inter)
                    throw Error(CMF_ERR_BOUNDS, n + ": not [hidden, " + std::to_string(inter) + "]");
                d.keep[l] = live_columns(v.data(), shape[0], shape[1]);
            }
        }
    }
    for (uint64_t l = 0; l < layers; ++l)
        if (d.keep[l].empty()) bad("defrag: layer " + std::to_string(l) + " keeps no FFN neuron; a layer needs at least one");
    return d;
}

}  // namespace cmf::convert
