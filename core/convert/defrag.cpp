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

namespace {

[[noreturn]] void bad(const std::string &m) { throw Error(CMF_ERR_INVALID_ARGUMENT, m); }

std::vector<uint64_t> shape_of(const TensorRec &t) { return std::vector<uint64_t>(t.shape, t.shape + t.ndim); }

size_t index_of(const Model &m, const TensorRec &t) { return size_t(&t - m.tensors().data()); }

bool bit(const uint8_t *row, uint64_t i) { return (row[i / 8] >> (i % 8)) & 1u; }

// ---- keep sets: per layer, the kept neurons ascending ---------------------

using KeepSets = std::vector<std::vector<uint32_t>>;

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

// A boolean [layers, intermediate] array in NumPy's .npy format (C order;
// dtype bool or uint8, nonzero = kept).
KeepSets keep_of_npy(const std::string &path, uint64_t layers, uint64_t inter) {
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
    if (!(descr.find("'|b1'") < descr.find(',') || descr.find("'|u1'") < descr.find(',') || descr.find("'<u1'") < descr.find(',')))
        fail("dtype must be bool (|b1) or uint8 (|u1)");
    const std::string fortran = value_of("fortran_order");
    if (fortran.find("False") > fortran.find_first_of(",}")) fail("a Fortran-order array (C order expected)");
    const std::string sh = value_of("shape");
    const size_t open = sh.find('('), close = sh.find(')');
    if (open == std::string::npos || close == std::string::npos || close < open) fail("header: shape is not a tuple");
    std::vector<uint64_t> dims;
    std::stringstream ds(sh.substr(open + 1, close - open - 1));
    std::string part;
    while (std::getline(ds, part, ',')) {
        const size_t a = part.find_first_not_of(" "), z = part.find_last_not_of(" ");
        if (a == std::string::npos) continue;
        const std::string n = part.substr(a, z - a + 1);
        if (!std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; })) fail("shape entry '" + n + "'");
        dims.push_back(std::stoull(n));
    }
    if (dims.size() != 2 || dims[0] != layers || dims[1] != inter) {
        std::string got;
        for (uint64_t d : dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
        fail("shape (" + got + "), the model needs (" + std::to_string(layers) + ", " + std::to_string(inter) + ")");
    }
    const uint64_t data = start + hlen;
    if (b.size() - data != layers * inter)
        fail(std::to_string(b.size() - data) + " data bytes for " + std::to_string(layers * inter) + " elements");
    KeepSets keep(layers);
    for (uint64_t l = 0; l < layers; ++l)
        for (uint64_t i = 0; i < inter; ++i)
            if (b[data + l * inter + i] != 0) keep[l].push_back(uint32_t(i));
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
        std::vector<bool> live(cols, false);
        for (uint64_t r = 0; r < rows; ++r)
            for (uint64_t c = 0; c < cols; ++c) live[c] = live[c] || v[r * cols + c] != 0.0f;
        for (uint64_t c = 0; c < cols; ++c)
            if (live[c]) keep[l].push_back(uint32_t(c));
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

struct Payload {
    int32_t dtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> bytes;
    bool exact;  // the kept values are the source's, byte for byte
};

// f32 values encoded as `dtype` at `shape`; a dtype that cannot take the
// shape (a quant group of 32 across a new width) falls back to q8_2f as the
// original's defrag does.
Payload encode(Runtime &rt, int32_t dtype, std::vector<uint64_t> shape, const std::vector<float> &vals, const std::string &what) {
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
    Payload p{dtype, shape, {}, false};
    const cmf_quantize_params params = no_params();
    cmf_byte_sink sink = vector_sink(p.bytes);
    throw_if_error(c->vt.quantize(c->ctx, uint32_t(shape.size()), shape.data(), vals.data(), &params, &sink),
                   what + " (" + dtype_name(dtype) + ")");
    return p;
}

// Rows `keep` of a 2-D tensor (or entries of a 1-D one). Byte copies where
// the payload is per-row sections (floats; q8_row's codes and scales; any
// dtype whose quantize_rows says so), else dequantized and re-encoded.
Payload take_rows(Runtime &rt, const Model &m, const TensorRec &t, const std::vector<uint32_t> &keep) {
    const uint64_t rows = t.shape[0], cols = t.ndim >= 2 ? t.shape[1] : 1;
    std::vector<uint64_t> shape = shape_of(t);
    shape[0] = keep.size();
    const auto *src = static_cast<const uint8_t *>(t.data);
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
        Payload p{t.dtype, shape, {}, true};
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

// Columns `keep` of a 2-D tensor: the codec's column selection where it
// selects single columns (every value the source's), else dequantized and
// re-encoded at the new width.
Payload take_columns(Runtime &rt, const Model &m, const TensorRec &t, const std::vector<uint32_t> &keep) {
    const uint64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<uint64_t> shape = {rows, keep.size()};
    const auto *src = static_cast<const uint8_t *>(t.data);
    if (const uint64_t es = float_size(t.dtype)) {
        Payload p{t.dtype, shape, std::vector<uint8_t>(rows * keep.size() * es), true};
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
        Payload p{t.dtype, shape, {}, true};
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
    header["provenance"].as_object()["defrag"] =
        bj::object{{"kept_per_layer", kept_per_layer}, {"post_intermediate_max", widest}, {"pre_intermediate", inter},
                   {"pruned_ratio", round4(pruned)}, {"source_skill", source}};
    // No masks: their FFN rows are of the old widths (spec §11).
    container::Writer w(rt, o.output, container::json::emit_header(header), 0, std::nullopt);
    std::vector<Payload> owned;
    owned.reserve(cuts.size());
    uint64_t reencoded = 0;
    for (const auto &t : m.tensors()) {
        auto it = cuts.find(t.name);
        if (it == cuts.end()) {
            w.add_tensor(t.name, t.dtype, t.ndim, t.shape, t.data, t.nbytes);
            continue;
        }
        Payload p = it->second.columns ? take_columns(rt, m, t, *it->second.keep) : take_rows(rt, m, t, *it->second.keep);
        reencoded += !p.exact;
        if (!p.exact)
            say(t.name + ": re-encoded as " + dtype_name(p.dtype) + " at the new width (" + dtype_name(t.dtype) +
                " cannot keep single columns)");
        owned.push_back(std::move(p));
        const Payload &q = owned.back();
        w.add_tensor(t.name, q.dtype, uint32_t(q.shape.size()), q.shape.data(), q.bytes.data(), q.bytes.size());
    }
    if (m.has_vocab()) w.set_vocab(m.vocab(), m.vocab_len());
    w.finish();
    return bj::serialize(bj::object{{"output", o.output}, {"kept_per_layer", kept_per_layer}, {"pre_intermediate", inter},
                                    {"post_intermediate_max", widest}, {"pruned_ratio", round4(pruned)},
                                    {"tensors_cut", cuts.size()}, {"reencoded", reencoded}, {"source", source}});
}

}  // namespace cmf::convert
