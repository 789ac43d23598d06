// cmfhost diff: what differs between two .cmf files (the original's `diff`):
// header/arch, tensors by (name, hash64) -- shared, new, removed, changed --
// and skills. No tensor is read: equal hash64 means equal bytes.
#include "commands/model_util.hpp"

#include <boost/json.hpp>

#include <map>
#include <unistd.h>

namespace cmfhost {

namespace {

struct Side {
    ModelPtr m;
    cmf_model_info info;
    boost::json::object arch;
    struct T {
        uint64_t hash, nbytes;
        int32_t dtype;
    };
    std::map<std::string, T> tensors;
    uint64_t params = 0;  // elements of the tensors with 2 or more dimensions
    std::vector<std::string> skills;
};

Side load(cmf_runtime *rt, const std::string &path) {
    Side s;
    s.m = open_model(rt, path);
    cmf_model_info_init(&s.info);
    check(cmf_model_get_info(s.m.get(), &s.info), path);
    boost::json::value a = boost::json::parse(s.info.arch_json);
    if (a.is_object()) s.arch = a.as_object();
    for (size_t k = 0; k < cmf_tensor_count(s.m.get()); ++k) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        check(cmf_tensor_at(s.m.get(), k, &t), path);
        s.tensors[t.name] = {t.hash, t.nbytes, t.dtype};
        if (t.ndim >= 2) {
            uint64_t n = 1;
            for (uint32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
            s.params += n;
        }
    }
    if (s.info.skills_json[0]) {
        boost::json::value v = boost::json::parse(s.info.skills_json);
        if (v.is_array())
            for (auto &x : v.as_array())
                if (x.is_object() && x.as_object().contains("id")) {
                    auto &id = x.as_object().at("id");
                    s.skills.push_back(id.is_string() ? std::string(id.as_string()) : boost::json::serialize(id));
                }
    }
    return s;
}

std::string arch_field(const Side &s, const char *k) {
    auto it = s.arch.find(k);
    if (it == s.arch.end()) return "-";
    return it->value().is_string() ? std::string(it->value().as_string()) : boost::json::serialize(it->value());
}

// The original's spelling of header.quant_type (its enum's Debug form).
std::string quant_debug(const std::string &q) {
    const std::pair<const char *, const char *> names[] = {{"Q8_ROW", "Q8Row"}, {"Q4_BLOCK", "Q4Block"}, {"Q8_2F", "Q8_2f"},
                                                           {"VBIT", "Vbit"},    {"BF16", "Bf16"},       {"F16", "F16"}, {"F32", "F32"}};
    for (auto [k, v] : names)
        if (q == k) return v;
    return q;
}

std::string mb(uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MB", double(b) / 1e6);
    return buf;
}

}  // namespace

int cmd_diff(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string pa, pb;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("a", po::value(&pa)->required(), "baseline .cmf")("b", po::value(&pb)->required(), "compared .cmf");
    po::positional_options_description pos;
    pos.add("a", 1).add("b", 1);
    po::variables_map vm;
    if (!parse_args("diff", "A B", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    Side a = load(rt.get(), pa), b = load(rt.get(), pb);
    const bool tty = ::isatty(STDOUT_FILENO);
    auto col = [&](const char *code) { return tty ? code : ""; };
    const char *green = col("\x1b[32m"), *red = col("\x1b[31m"), *yellow = col("\x1b[33m"), *reset = col("\x1b[0m");
    const std::string rule(60, '-');
    std::printf("CMF diff  (a) %s  ->  (b) %s\n%s\n", pa.c_str(), pb.c_str(), rule.c_str());

    std::vector<std::string> hdr;
    auto row = [&](const char *label, const std::string &x, const std::string &y) {
        if (x != y) hdr.push_back(std::string("  ") + label + std::string(label[0] ? 12 - std::min<size_t>(12, std::strlen(label)) : 0, ' ') + " " + x + "  ->  " + y);
    };
    row("format", "v" + std::to_string(a.info.version), "v" + std::to_string(b.info.version));
    row("arch", arch_field(a, "arch_name"), arch_field(b, "arch_name"));
    row("layers", arch_field(a, "num_layers"), arch_field(b, "num_layers"));
    row("hidden", arch_field(a, "hidden_size"), arch_field(b, "hidden_size"));
    row("ffn", arch_field(a, "intermediate_size"), arch_field(b, "intermediate_size"));
    row("vocab", arch_field(a, "vocab_size"), arch_field(b, "vocab_size"));
    row("quant", quant_debug(a.info.quant_type), quant_debug(b.info.quant_type));
    char pa_s[32], pb_s[32];
    std::snprintf(pa_s, sizeof pa_s, "%.3fB", double(a.params) / 1e9);
    std::snprintf(pb_s, sizeof pb_s, "%.3fB", double(b.params) / 1e9);
    row("params", pa_s, pb_s);
    if (hdr.empty()) std::printf("Header/arch: identical.\n");
    else {
        std::printf("Header/arch changed:\n");
        for (auto &h : hdr) std::printf("%s\n", h.c_str());
    }

    std::vector<std::string> added, removed, changed;
    uint64_t same = 0;
    for (auto &[name, tb] : b.tensors) {
        auto it = a.tensors.find(name);
        if (it == a.tensors.end()) {
            added.push_back(name + "  [" + debug_dtype_name(tb.dtype) + ", " + mb(tb.nbytes) + "]");
        } else if (it->second.hash == tb.hash && it->second.nbytes == tb.nbytes) {
            ++same;
        } else {
            const auto &ta = it->second;
            std::string dt = ta.dtype == tb.dtype ? debug_dtype_name(ta.dtype) : std::string(debug_dtype_name(ta.dtype)) + "->" + debug_dtype_name(tb.dtype);
            char sz[64];
            if (ta.nbytes == tb.nbytes) std::snprintf(sz, sizeof sz, "%.1f MB", double(tb.nbytes) / 1e6);
            else std::snprintf(sz, sizeof sz, "%.1f->%.1f MB", double(ta.nbytes) / 1e6, double(tb.nbytes) / 1e6);
            changed.push_back(name + "  [" + dt + ", " + sz + "]");
        }
    }
    for (auto &[name, ta] : a.tensors)
        if (!b.tensors.count(name)) removed.push_back(name + "  [" + debug_dtype_name(ta.dtype) + ", " + mb(ta.nbytes) + "]");
    std::printf("\nTensors: %llu shared verbatim (hash matched), %s+%zu new%s, %s-%zu removed%s, %s~%zu changed%s.\n",
                (unsigned long long)same, green, added.size(), reset, red, removed.size(), reset, yellow, changed.size(), reset);
    auto show = [&](const char *title, const char *c, const std::vector<std::string> &rows) {
        if (rows.empty()) return;
        std::printf("  %s%s%s\n", c, title, reset);
        for (size_t i = 0; i < rows.size() && i < 20; ++i) std::printf("    %s\n", rows[i].c_str());
        if (rows.size() > 20) std::printf("    ... %zu more\n", rows.size() - 20);
    };
    show("+ new:", green, added);
    show("- removed:", red, removed);
    show("~ changed:", yellow, changed);

    if (!a.skills.empty() || !b.skills.empty()) {
        std::vector<std::string> kept, neu, gone;
        for (auto &s : b.skills) (std::find(a.skills.begin(), a.skills.end(), s) != a.skills.end() ? kept : neu).push_back(s);
        for (auto &s : a.skills)
            if (std::find(b.skills.begin(), b.skills.end(), s) == b.skills.end()) gone.push_back(s);
        auto join = [](const std::vector<std::string> &v) {
            std::string o;
            for (auto &x : v) o += (o.empty() ? "" : ",") + x;
            return o;
        };
        std::printf("\nSkills: %zu shared", kept.size());
        if (!neu.empty()) std::printf(", %s+[%s]%s", green, join(neu).c_str(), reset);
        if (!gone.empty()) std::printf(", %s-[%s]%s", red, join(gone).c_str(), reset);
        std::printf(".\n");
    }
    std::printf("%s\n", rule.c_str());
    return 0;
}

}  // namespace cmfhost
