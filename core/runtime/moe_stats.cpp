#include "runtime/moe_stats.hpp"

#include "common/error.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

namespace cmf::runtime {

MoeStats parse_moe_stats(const std::string &text, const std::string &what) {
    MoeStats s;
    s.text = text;
    simdjson::dom::parser parser;
    simdjson::padded_string padded(text);
    simdjson::dom::object obj;
    if (parser.parse(padded).get(obj) != simdjson::SUCCESS)
        throw Error(CMF_ERR_PARSE, what + ": not a JSON object {\"<layer>\": [counts], ...}");
    for (auto [key, value] : obj) {
        const std::string k(key);
        if (k.empty() || k.size() > 9 || !std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; }))
            throw Error(CMF_ERR_PARSE, what + ": key \"" + k + "\" is not a layer number");
        simdjson::dom::array arr;
        if (value.get(arr) != simdjson::SUCCESS)
            throw Error(CMF_ERR_PARSE, what + ": layer " + k + " is not an array of counts");
        std::vector<uint64_t> counts;
        for (simdjson::dom::element e : arr) {
            uint64_t c = 0;
            double d = 0;
            if (e.get(c) == simdjson::SUCCESS) {
                counts.push_back(c);
            } else if (e.get(d) == simdjson::SUCCESS && d >= 0 && d < 1.8e19 && d == double(uint64_t(d))) {
                counts.push_back(uint64_t(d));
            } else {
                throw Error(CMF_ERR_PARSE, what + ": layer " + k + " holds a count that is not a non-negative integer");
            }
        }
        if (!s.counts.emplace(std::stoull(k), std::move(counts)).second)
            throw Error(CMF_ERR_PARSE, what + ": layer " + k + " is listed twice");
    }
    return s;
}

MoeStats read_moe_stats(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw Error(errno == ENOENT ? CMF_ERR_FILE_NOT_FOUND : CMF_ERR_IO,
                    "cannot read MoE stats '" + path + "': " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    return parse_moe_stats(ss.str(), "MoE stats '" + path + "'");
}

std::vector<uint32_t> covering_experts(const std::vector<uint64_t> &counts, double cover) {
    uint64_t total = 0;
    for (uint64_t c : counts) total += c;
    if (total == 0) return {};
    std::vector<uint32_t> order(counts.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return counts[a] > counts[b]; });
    const double target = cover * double(total);
    std::vector<uint32_t> kept;
    uint64_t sum = 0;
    for (uint32_t e : order) {
        kept.push_back(e);
        sum += counts[e];
        if (double(sum) >= target) break;
    }
    std::sort(kept.begin(), kept.end());
    return kept;
}

}  // namespace cmf::runtime
