#include "runtime/skills.hpp"

#include "common/error.hpp"
#include "container/model.hpp"
#include "half.hpp"

#include <openssl/evp.h>
#include <simdjson.h>

#include <algorithm>

namespace cmf::runtime {

namespace {

[[noreturn]] void parse_fail(const std::string &m) { throw Error(CMF_ERR_PARSE, m); }

std::string optional_string(simdjson::dom::object o, const char *key) {
    std::string_view sv;
    if (o[key].get(sv) == simdjson::SUCCESS) return std::string(sv);
    return "";
}

std::optional<float> optional_float(simdjson::dom::object o, const char *key) {
    double d;
    if (o[key].get(d) == simdjson::SUCCESS) return float(d);
    return std::nullopt;
}

// The descriptor, or a reason it cannot route (kept on the record, so
// `route` can say which skills it skipped and why).
std::optional<SelectionDescriptor> read_selection(simdjson::dom::object so, uint64_t hidden, std::string &problem) {
    SelectionDescriptor d;
    d.metric = optional_string(so, "metric");
    if (d.metric != "mse" && d.metric != "mse_unit") {
        problem = "unknown metric '" + d.metric + "'";
        return std::nullopt;
    }
    uint64_t u;
    if (so["phi_layer"].get(u) != simdjson::SUCCESS) {
        problem = "no phi_layer";
        return std::nullopt;
    }
    d.phi_layer = u;
    if (so["rank"].get(u) != simdjson::SUCCESS) {
        problem = "no rank";
        return std::nullopt;
    }
    d.rank = u;
    try {
        d.mean = decode_f16_base64(optional_string(so, "mean"), "mean");
        d.basis = decode_f16_base64(optional_string(so, "basis"), "basis");
    } catch (const Error &e) {
        problem = e.message();
        return std::nullopt;
    }
    if (d.mean.size() != hidden || d.basis.size() != d.rank * hidden) {
        problem = "mean has " + std::to_string(d.mean.size()) + " values and basis " + std::to_string(d.basis.size()) +
                  " (hidden_size " + std::to_string(hidden) + ", rank " + std::to_string(d.rank) + ")";
        return std::nullopt;
    }
    d.err_mean = optional_float(so, "err_mean");
    d.err_std = optional_float(so, "err_std");
    return d;
}

}  // namespace

const SkillRecord *Registry::find(const std::string &id) const {
    for (const auto &s : skills)
        if (s.id == id) return &s;
    return nullptr;
}

std::string Registry::ids() const {
    std::string out;
    for (const auto &s : skills) out += (out.empty() ? "" : ", ") + s.id;
    return out.empty() ? "none" : out;
}

Registry read_registry(const cmf::container::Model &m) {
    Registry r;
    const uint64_t hidden = m.header().arch.hidden_size;
    simdjson::dom::parser parser;
    simdjson::padded_string text(m.header_text());
    simdjson::dom::object top;
    if (parser.parse(text).get(top) != simdjson::SUCCESS) parse_fail("header JSON is not an object");
    simdjson::dom::array skills;
    if (top["skills"].get(skills) == simdjson::SUCCESS) {
        for (simdjson::dom::element el : skills) {
            simdjson::dom::object o;
            if (el.get(o) != simdjson::SUCCESS) parse_fail("skills[]: each record must be an object");
            SkillRecord s;
            s.id = optional_string(o, "id");
            s.name = optional_string(o, "name");
            s.base_dir_hash = optional_string(o, "base_dir_hash");
            s.json = simdjson::minify(el);
            simdjson::dom::array layers;
            if (o["layers"].get(layers) == simdjson::SUCCESS)
                for (simdjson::dom::element l : layers) {
                    uint64_t u;
                    if (l.get(u) == simdjson::SUCCESS) s.layers.push_back(u);
                }
            simdjson::dom::object so;
            if (o["selection"].get(so) == simdjson::SUCCESS) s.selection = read_selection(so, hidden, s.selection_problem);
            r.skills.push_back(std::move(s));
        }
    }
    simdjson::dom::object ro;
    if (top["routing"].get(ro) == simdjson::SUCCESS) {
        RoutingCalibration c;
        if (auto v = optional_float(ro, "temperature")) c.temperature = *v;
        if (auto v = optional_float(ro, "novelty_theta")) c.novelty_theta = *v;
        if (auto v = optional_float(ro, "target_fpr")) c.target_fpr = *v;
        uint64_t u;
        if (ro["samples"].get(u) == simdjson::SUCCESS) c.samples = u;
        r.routing = c;
    }
    return r;
}

bool valid_skill_id(const std::string &id) {
    return !id.empty() && std::all_of(id.begin(), id.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    });
}

std::string encode_f16_base64(const std::vector<float> &v) {
    std::vector<unsigned char> bytes(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
        uint16_t h = cmf::codecs::f32_to_f16(v[i]);
        bytes[2 * i] = uint8_t(h & 0xff);
        bytes[2 * i + 1] = uint8_t(h >> 8);
    }
    std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
    int n = EVP_EncodeBlock(reinterpret_cast<unsigned char *>(out.data()), bytes.data(), int(bytes.size()));
    out.resize(size_t(n));
    return out;
}

std::vector<float> decode_f16_base64(const std::string &b64, const std::string &what) {
    if (b64.size() % 4 != 0) throw Error(CMF_ERR_PARSE, what + ": base64 length " + std::to_string(b64.size()) + " is not a multiple of 4");
    std::vector<unsigned char> bytes(b64.size() / 4 * 3 + 1);
    int n = b64.empty() ? 0 : EVP_DecodeBlock(bytes.data(), reinterpret_cast<const unsigned char *>(b64.data()), int(b64.size()));
    if (n < 0) throw Error(CMF_ERR_PARSE, what + ": not base64");
    // EVP_DecodeBlock counts the padding's zero bytes: take them off.
    size_t len = size_t(n);
    for (size_t i = b64.size(); i > 0 && b64[i - 1] == '=' && len > 0; --i) --len;
    if (len % 2 != 0) throw Error(CMF_ERR_PARSE, what + ": " + std::to_string(len) + " bytes is not a whole number of f16 values");
    std::vector<float> v(len / 2);
    for (size_t i = 0; i < v.size(); ++i) v[i] = cmf::codecs::f16_to_f32(uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
    return v;
}

}  // namespace cmf::runtime
