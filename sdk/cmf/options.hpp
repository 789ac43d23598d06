// cmf/options.hpp — splitting the "key=value,key=value" option strings that
// plugins receive (a codec's cmf_quantize_params.options, an arch's model
// options). Header-only: the codecs and arch plugins are separate shared
// objects and cannot link each other. Each plugin decides which keys and
// values it takes and how to refuse the rest; only the syntax is shared.
#pragma once

#include <string>
#include <vector>

namespace cmf::sdk {

struct OptionItem {
    std::string text;   // the item as written, e.g. "kv_cache=f16"
    std::string key;    // before the first '=' (the whole item if it has none)
    std::string value;  // after the first '=' ("" if it has none)
    bool has_value;     // the item contains '='
};

// Items split at commas, empty items skipped; NULL gives none.
inline std::vector<OptionItem> split_options(const char *options) {
    std::vector<OptionItem> items;
    if (options == nullptr) return items;
    const std::string s(options);
    size_t pos = 0;
    while (pos < s.size()) {
        size_t end = s.find(',', pos);
        if (end == std::string::npos) end = s.size();
        std::string item = s.substr(pos, end - pos);
        pos = end + 1;
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        OptionItem o{item, item.substr(0, eq), eq == std::string::npos ? std::string() : item.substr(eq + 1),
                     eq != std::string::npos};
        items.push_back(std::move(o));
    }
    return items;
}

}  // namespace cmf::sdk
