#include "rope_scaling.hpp"

#include <cmath>

namespace cmf::archs::rope {

using sdk::Error;

const char *type_name(Type t) {
    switch (t) {
    case Type::Default: return "default";
    case Type::Linear: return "linear";
    case Type::Dynamic: return "dynamic";
    case Type::Yarn: return "yarn";
    case Type::Llama3: return "llama3";
    }
    return "?";
}

namespace {

constexpr double kPi = 3.141592653589793;

// HF reads these with `rope_parameters.get(key) or default`: absent, null
// and 0 all take the default.
double or_default(const json::Object &o, const char *key, double dflt) {
    auto v = o.finite(key);
    return v && *v != 0 ? *v : dflt;
}

double positive(const json::Object &o, const char *key, std::optional<double> dflt = std::nullopt) {
    auto v = o.finite(key);
    if (!v) {
        if (!dflt) o.missing(key);
        return *dflt;
    }
    if (!(*v > 0)) o.fail(key, *o.get(key), "must be a positive number");
    return *v;
}

// The HF key `rope_type`, or its older spelling `type`.
std::string type_of(const json::Object &o) {
    if (auto t = o.str("rope_type")) return *t;
    if (auto t = o.str("type")) return *t;
    return "default";
}

// f32 arithmetic as torch does it on f32 tensors (each operation rounded).
float f32(double x) { return static_cast<float>(x); }

// HF's default table: 1 / base ** (arange(0, dim, 2) / dim), base a Python
// float raised to an f32 tensor (so base becomes f32 first).
std::vector<float> default_inv_freq(float base, uint32_t dim) {
    std::vector<float> inv(dim / 2);
    for (uint32_t i = 0; i < dim / 2; ++i) inv[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    return inv;
}

// _compute_dynamic_ntk_parameters with seq_len as the 0-dim int64 tensor
// dynamic_rope_update passes: the new base is an f32 tensor from there on.
std::vector<float> dynamic_inv_freq(const Scaling &s, double theta, uint32_t dim, uint64_t seq_len) {
    const uint64_t mpe = s.max_position_embeddings;
    const uint64_t seq = std::max(seq_len, mpe);
    float t = f32(s.factor) * static_cast<float>(seq);  // factor * seq_len
    t = t / static_cast<float>(mpe);                   // / max_position_embeddings
    t = t - f32(s.factor - 1.0);                       // - (factor - 1)
    t = std::pow(t, f32(double(dim) / double(dim - 2)));  // ** (dim / (dim - 2))
    const float base = f32(theta) * t;
    return default_inv_freq(base, dim);
}

// The same at init (seq_len None -> max_position_embeddings as a Python int):
// the base is a Python double, then f32 when raised to the exponents.
std::vector<float> dynamic_inv_freq_init(const Scaling &s, double theta, uint32_t dim) {
    const double mpe = double(s.max_position_embeddings);
    const double base = theta * std::pow((s.factor * mpe / mpe) - (s.factor - 1.0), double(dim) / double(dim - 2));
    return default_inv_freq(f32(base), dim);
}

Freqs yarn(const Scaling &s, double theta, uint32_t dim) {
    const double factor = s.factor;
    const double orig = double(s.original_max_position_embeddings ? s.original_max_position_embeddings : s.max_position_embeddings);
    auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    double attention = 0;
    if (s.attention_factor) attention = *s.attention_factor;
    else if (s.mscale && *s.mscale != 0 && s.mscale_all_dim && *s.mscale_all_dim != 0)
        attention = get_mscale(factor, *s.mscale) / get_mscale(factor, *s.mscale_all_dim);
    else attention = get_mscale(factor, 1.0);
    auto correction_dim = [&](double rotations) {
        return (double(dim) * std::log(orig / (rotations * 2 * kPi))) / (2 * std::log(theta));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;  // HF: "prevent singularity"
    const uint32_t half = dim / 2;
    const float base = f32(theta);
    Freqs f;
    f.inv_freq.resize(half);
    for (uint32_t i = 0; i < half; ++i) {
        const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
        const float extrapolation = 1.0f / pos_freq;
        const float interpolation = 1.0f / (f32(factor) * pos_freq);
        float ramp = (static_cast<float>(i) - f32(low)) / f32(high - low);
        ramp = std::min(std::max(ramp, 0.0f), 1.0f);
        const float extrapolation_factor = 1.0f - ramp;
        f.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
    f.attention_factor = f32(attention);
    return f;
}

std::vector<float> llama3(const Scaling &s, double theta, uint32_t dim) {
    std::vector<float> inv = default_inv_freq(f32(theta), dim);
    const double old_context = double(s.original_max_position_embeddings);
    const double low_wavelen = old_context / s.low_freq_factor, high_wavelen = old_context / s.high_freq_factor;
    const float factor = f32(s.factor);
    // `scalar / tensor` in torch is reciprocal(tensor) * scalar: two roundings.
    for (float &f : inv) {
        const float wavelen = (1.0f / f) * f32(2 * kPi);
        const float scaled = wavelen > f32(low_wavelen) ? f / factor : f;
        const float smooth = ((1.0f / wavelen) * f32(old_context) - f32(s.low_freq_factor)) / f32(s.high_freq_factor - s.low_freq_factor);
        const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        const bool medium = !(wavelen < f32(high_wavelen)) && !(wavelen > f32(low_wavelen));
        f = medium ? smoothed : scaled;
    }
    return inv;
}

}  // namespace

Scaling from_hf(const json::Object &o, uint64_t max_position_embeddings) {
    Scaling s;
    s.max_position_embeddings = max_position_embeddings;
    const std::string type = type_of(o);
    const std::string type_key = o.has("rope_type") ? "rope_type" : "type";
    if (type == "default" || type == "mrope") return s;
    if (type == "linear") {
        s.type = Type::Linear;
        s.factor = positive(o, "factor");
    } else if (type == "dynamic") {
        s.type = Type::Dynamic;
        s.factor = positive(o, "factor");
        if (max_position_embeddings == 0) o.fail("factor", "dynamic scaling needs a positive max_position_embeddings");
    } else if (type == "yarn") {
        s.type = Type::Yarn;
        if (auto orig = o.u64("original_max_position_embeddings")) {
            if (*orig == 0) o.fail("original_max_position_embeddings", *o.get("original_max_position_embeddings"), "must be positive");
            s.original_max_position_embeddings = *orig;
        }
        // HF: a null factor is max_position_embeddings / original_max_position_embeddings.
        if (o.has("factor")) s.factor = positive(o, "factor");
        else if (s.original_max_position_embeddings && max_position_embeddings)
            s.factor = double(max_position_embeddings) / double(s.original_max_position_embeddings);
        else o.missing("factor");
        if (auto a = o.finite("attention_factor")) {
            if (!(*a > 0)) o.fail("attention_factor", *o.get("attention_factor"), "must be a positive number");
            s.attention_factor = a;
        }
        if (auto m = o.finite("mscale")) s.mscale = m;
        if (auto m = o.finite("mscale_all_dim")) s.mscale_all_dim = m;
        s.beta_fast = or_default(o, "beta_fast", 32.0);
        s.beta_slow = or_default(o, "beta_slow", 1.0);
        if (!(s.beta_fast > 0)) o.fail("beta_fast", *o.get("beta_fast"), "must be a positive number");
        if (!(s.beta_slow > 0)) o.fail("beta_slow", *o.get("beta_slow"), "must be a positive number");
        s.truncate = o.boolean("truncate").value_or(true);
        if (!s.original_max_position_embeddings && !max_position_embeddings)
            o.missing("original_max_position_embeddings");
    } else if (type == "llama3") {
        s.type = Type::Llama3;
        s.factor = positive(o, "factor");
        s.low_freq_factor = positive(o, "low_freq_factor");
        s.high_freq_factor = positive(o, "high_freq_factor");
        if (s.high_freq_factor == s.low_freq_factor)
            o.fail("high_freq_factor", *o.get("high_freq_factor"), "must differ from low_freq_factor");
        auto orig = o.u64("original_max_position_embeddings");
        if (!orig) o.missing("original_max_position_embeddings");
        if (*orig == 0) o.fail("original_max_position_embeddings", *o.get("original_max_position_embeddings"), "must be positive");
        s.original_max_position_embeddings = *orig;
    } else {
        throw Error(CMF_ERR_UNSUPPORTED, o.source() + ": " + o.key_path(type_key) + " \"" + type +
                                             "\": this RoPE scaling is not implemented (supported: default, linear, dynamic, yarn, llama3)");
    }
    return s;
}

void check(const Scaling &s, double theta, uint32_t rot_dim, const std::string &where) {
    if (!s.scaled()) return;
    if (s.type == Type::Dynamic && rot_dim <= 2)
        throw Error(CMF_ERR_UNSUPPORTED, where + ": dynamic RoPE scaling needs more than 2 rotated dimensions (has " +
                                             std::to_string(rot_dim) + ")");
    if (s.type == Type::Yarn && !(theta > 1))
        throw Error(CMF_ERR_PARSE, where + ": yarn RoPE scaling needs rope_theta > 1 (its correction range divides by log(rope_theta))");
}

void write_arch(json::Writer &w, const Scaling &s) {
    w.begin_object();
    w.key("rope_type").string(type_name(s.type));
    w.key("factor").f64(s.factor);
    switch (s.type) {
    case Type::Default:
    case Type::Linear: break;
    case Type::Dynamic: w.key("max_position_embeddings").u64(s.max_position_embeddings); break;
    case Type::Yarn:
        w.key("original_max_position_embeddings").u64(s.original_max_position_embeddings ? s.original_max_position_embeddings
                                                                                        : s.max_position_embeddings);
        if (s.attention_factor) w.key("attention_factor").f64(*s.attention_factor);
        if (s.mscale) w.key("mscale").f64(*s.mscale);
        if (s.mscale_all_dim) w.key("mscale_all_dim").f64(*s.mscale_all_dim);
        w.key("beta_fast").f64(s.beta_fast);
        w.key("beta_slow").f64(s.beta_slow);
        w.key("truncate").boolean(s.truncate);
        break;
    case Type::Llama3:
        w.key("low_freq_factor").f64(s.low_freq_factor);
        w.key("high_freq_factor").f64(s.high_freq_factor);
        w.key("original_max_position_embeddings").u64(s.original_max_position_embeddings);
        break;
    }
    w.end_object();
}

Scaling from_arch(const json::Object &o) {
    // The record is HF's spelling with every default resolved, so the HF
    // reader reads it back.
    return from_hf(o, o.u64("max_position_embeddings").value_or(0));
}

Scaling from_original_yarn(const json::Object &o, uint64_t max_position_embeddings) {
    Scaling s;
    s.max_position_embeddings = max_position_embeddings;
    s.type = Type::Yarn;
    s.factor = positive(o, "factor");
    auto orig = o.u64("original_max_position_embeddings");
    if (!orig || *orig == 0) o.missing("original_max_position_embeddings");
    s.original_max_position_embeddings = *orig;
    s.attention_factor = positive(o, "attention_factor", 0.1 * std::log(s.factor) + 1.0);
    if (auto m = o.finite("mscale_all_dim")) s.mscale_all_dim = m;
    s.beta_fast = or_default(o, "beta_fast", 32.0);
    s.beta_slow = or_default(o, "beta_slow", 1.0);
    return s;
}

Freqs initial(const Scaling &s, double theta, uint32_t rot_dim) {
    Freqs f;
    switch (s.type) {
    case Type::Default: f.inv_freq = default_inv_freq(f32(theta), rot_dim); break;
    case Type::Linear:
        f.inv_freq = default_inv_freq(f32(theta), rot_dim);
        for (float &x : f.inv_freq) x = x / f32(s.factor);
        break;
    case Type::Dynamic: f.inv_freq = dynamic_inv_freq_init(s, theta, rot_dim); break;
    case Type::Yarn: return yarn(s, theta, rot_dim);
    case Type::Llama3: f.inv_freq = llama3(s, theta, rot_dim); break;
    }
    return f;
}

Dynamic::Dynamic(const Scaling &s, double theta, uint32_t rot_dim)
    : s_(s), theta_(theta), rot_dim_(rot_dim), max_seq_len_cached_(s.max_position_embeddings), original_(initial(s, theta, rot_dim)),
      cur_(original_) {}

const Freqs &Dynamic::update(uint64_t seq_len) {
    if (s_.type != Type::Dynamic) return cur_;
    if (seq_len > max_seq_len_cached_) {  // growth
        cur_.inv_freq = dynamic_inv_freq(s_, theta_, rot_dim_, seq_len);
        max_seq_len_cached_ = seq_len;
    }
    if (seq_len < s_.max_position_embeddings && max_seq_len_cached_ > s_.max_position_embeddings) {  // reset
        cur_ = original_;
        max_seq_len_cached_ = s_.max_position_embeddings;
    }
    return cur_;
}

}  // namespace cmf::archs::rope
