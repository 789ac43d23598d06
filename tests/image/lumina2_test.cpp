// The lumina2 pipeline against the PyTorch reference of
// make_lumina2_reference.py (CMF_LUMINA2_DIR: its OUT_DIR): the tiny
// diffusers tree packed with cmf_imagine_pack, then each component (caption
// features, one DiT velocity, the VAE decoder), the whole sampling loop from
// the injected latent, and the same loop through the C API from the prompt
// text (template, tokenizer, <bos>).
#include "lumina2/pipeline.hpp"
#include "runtime/container_source.hpp"

#include "../support/test_runtime.hpp"

#include <cmf/cmf.h>
#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace {

using cmf::archs::lumina2::Pipeline;

std::string dir() {
    const char *d = std::getenv("CMF_LUMINA2_DIR");
    REQUIRE_MESSAGE(d != nullptr, "CMF_LUMINA2_DIR is not set (run_lumina2.sh sets it)");
    return d;
}

std::vector<char> read_bytes(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open " << path);
    return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<float> read_f32(const std::string &path) {
    const std::vector<char> b = read_bytes(path);
    std::vector<float> v(b.size() / 4);
    std::copy(b.begin(), b.begin() + v.size() * 4, reinterpret_cast<char *>(v.data()));
    return v;
}

// max |a - ref| / max |ref|.
double rel_err(const std::vector<float> &a, const std::vector<float> &ref) {
    REQUIRE(a.size() == ref.size());
    double d = 0, s = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d = std::max(d, double(std::fabs(a[i] - ref[i])));
        s = std::max(s, double(std::fabs(ref[i])));
    }
    return d / std::max(s, 1e-30);
}

struct Case {
    uint32_t width = 0, height = 0, channels = 0, lh = 0, lw = 0, steps = 0, te_hidden = 0;
    double guidance = 0, tau = 0;
    std::string prompt;
    std::vector<int32_t> ids, negative;
};

Case load_case() {
    simdjson::dom::parser p;
    simdjson::dom::element e = p.load(dir() + "/ref/case.json");
    Case c;
    c.width = uint32_t(uint64_t(e["width"]));
    c.height = uint32_t(uint64_t(e["height"]));
    c.channels = uint32_t(uint64_t(e["latent_channels"]));
    c.lh = uint32_t(uint64_t(e["latent_h"]));
    c.lw = uint32_t(uint64_t(e["latent_w"]));
    c.steps = uint32_t(uint64_t(e["steps"]));
    c.te_hidden = uint32_t(uint64_t(e["te_hidden"]));
    c.guidance = double(e["guidance"]);
    c.tau = double(e["tau"]);
    c.prompt = std::string(std::string_view(e["prompt"]));
    for (auto v : simdjson::dom::array(e["ids"])) c.ids.push_back(int32_t(int64_t(v)));
    for (auto v : simdjson::dom::array(e["negative_ids"])) c.negative.push_back(int32_t(int64_t(v)));
    return c;
}

// The tree packed once per process (f32: parity is about the computation).
std::string packed(cmf_runtime *rt) {
    static std::string path;
    if (!path.empty()) return path;
    const std::string out = dir() + "/tiny-f32.cmf";
    cmf_convert_options o;
    cmf_convert_options_init(&o);
    const std::string model = dir() + "/pipeline";
    o.model_dir = model.c_str();
    o.output = out.c_str();
    o.quant = "f32";
    cmf_error *e = cmf_imagine_pack(rt, &o);
    INFO(cmf_error_message(e));
    REQUIRE(e == nullptr);
    path = out;
    return path;
}

struct Opened {
    cmf_model *model = nullptr;
    std::shared_ptr<const cmf_model_source> src;
    std::unique_ptr<Pipeline> pipe;
    ~Opened() {
        pipe.reset();
        src.reset();
        cmf_close(model);
    }
};

void open(TestRuntime &t, Opened &o) {
    REQUIRE(cmf_open(t.rt, packed(t.rt).c_str(), nullptr, &o.model) == nullptr);
    o.src = cmf::runtime::make_container_source(o.model);
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    o.pipe = std::make_unique<Pipeline>(t.rt->host_api(), o.src.get(), &be->vt, be->ctx, nullptr);
}

// 8-bit images: the share of values that differ, and the largest difference.
void compare_u8(const uint8_t *got, const std::vector<char> &want, size_t n) {
    REQUIRE(want.size() == n);
    size_t differ = 0;
    int worst = 0;
    for (size_t i = 0; i < n; ++i) {
        const int d = std::abs(int(got[i]) - int(uint8_t(want[i])));
        differ += d != 0;
        worst = std::max(worst, d);
    }
    MESSAGE("8-bit image: " << differ << " of " << n << " values differ, by at most " << worst);
    CHECK(double(differ) <= 0.01 * double(n));
    CHECK(worst <= 1);
}

}  // namespace

TEST_CASE("lumina2: caption features are the text encoder's hidden_states[-2]") {
    const Case c = load_case();
    TestRuntime t;
    Opened o;
    open(t, o);
    const std::vector<float> got = o.pipe->encode(c.ids.data(), c.ids.size());
    const double err = rel_err(got, read_f32(dir() + "/ref/features.f32"));
    MESSAGE("caption features: max |diff| / max |ref| = " << err);
    CHECK(err < 1e-3);
}

TEST_CASE("lumina2: one Next-DiT velocity") {
    const Case c = load_case();
    TestRuntime t;
    Opened o;
    open(t, o);
    const std::vector<float> feats = read_f32(dir() + "/ref/features.f32");
    const std::vector<float> latent = read_f32(dir() + "/ref/latent_in.f32");
    REQUIRE(latent.size() == size_t(c.channels) * c.lh * c.lw);
    std::vector<float> got(latent.size());
    o.pipe->velocity(feats.data(), feats.size() / c.te_hidden, latent.data(), c.lh, c.lw, float(c.tau), got.data());
    const double err = rel_err(got, read_f32(dir() + "/ref/velocity.f32"));
    MESSAGE("DiT velocity: max |diff| / max |ref| = " << err);
    CHECK(err < 1e-3);
}

TEST_CASE("lumina2: the VAE decoder") {
    const Case c = load_case();
    TestRuntime t;
    Opened o;
    open(t, o);
    const std::vector<float> latent = read_f32(dir() + "/ref/latent_in.f32");
    std::vector<float> got(size_t(3) * c.width * c.height);
    o.pipe->vae().decode(latent.data(), c.lh, c.lw, got.data());
    const double err = rel_err(got, read_f32(dir() + "/ref/vae.f32"));
    MESSAGE("VAE decoder: max |diff| / max |ref| = " << err);
    CHECK(err < 2e-3);
}

TEST_CASE("lumina2: the sampling loop from an injected latent (guidance, normalisation) and the image") {
    const Case c = load_case();
    TestRuntime t;
    Opened o;
    open(t, o);
    const std::vector<float> latent = read_f32(dir() + "/ref/latent_in.f32");
    std::vector<float> out(latent.size()), planes(size_t(3) * c.width * c.height);
    cmf_text_to_image_args a{};
    a.struct_size = sizeof a;
    a.width = c.width;
    a.height = c.height;
    a.steps = c.steps;
    a.guidance_scale = float(c.guidance);
    a.cfg_trunc_ratio = 1.0f;
    a.cfg_normalization = 1;
    a.prompt = c.ids.data();
    a.n_prompt = uint32_t(c.ids.size());
    a.negative = c.negative.data();
    a.n_negative = uint32_t(c.negative.size());
    a.latent_in = latent.data();
    a.latent_out = out.data();
    a.image = planes.data();
    o.pipe->text_to_image(a);
    const double err = rel_err(out, read_f32(dir() + "/ref/latent_out.f32"));
    MESSAGE("final latent after " << c.steps << " steps: max |diff| / max |ref| = " << err);
    CHECK(err < 1e-3);
}

TEST_CASE("lumina2: cmf_imagine from the prompt text equals the reference (template, tokenizer, <bos>)") {
    const Case c = load_case();
    TestRuntime t;
    cmf_model *m = nullptr;
    REQUIRE(cmf_open(t.rt, packed(t.rt).c_str(), nullptr, &m) == nullptr);
    cmf_image_pipeline *p = nullptr;
    REQUIRE(cmf_image_pipeline_create(t.rt, m, nullptr, &p) == nullptr);
    cmf_image_pipeline_info info;
    cmf_image_pipeline_info_init(&info);
    REQUIRE(cmf_image_pipeline_get_info(p, &info) == nullptr);
    CHECK(std::string(info.arch) == "lumina2");
    CHECK(info.latent_channels == c.channels);
    CHECK(info.latent_scale == c.width / c.lw);
    const std::vector<float> latent = read_f32(dir() + "/ref/latent_in.f32");
    std::vector<float> out(latent.size());
    std::vector<uint8_t> rgb(size_t(3) * c.width * c.height);
    uint32_t calls = 0;
    cmf_imagine_options o;
    cmf_imagine_options_init(&o);
    o.width = c.width;
    o.height = c.height;
    o.steps = c.steps;
    o.guidance_scale = float(c.guidance);
    o.prompt = c.prompt.c_str();
    o.latent_in = latent.data();
    o.latent_in_len = latent.size();
    o.latent_out = out.data();
    o.latent_out_len = out.size();
    o.on_step = [](void *u, uint32_t, uint32_t) -> int32_t {
        ++*static_cast<uint32_t *>(u);
        return 0;
    };
    o.user = &calls;
    cmf_error *e = cmf_imagine(p, &o, rgb.data(), rgb.size());
    INFO(cmf_error_message(e));
    REQUIRE(e == nullptr);
    CHECK(calls == c.steps);
    const double err = rel_err(out, read_f32(dir() + "/ref/latent_out.f32"));
    MESSAGE("cmf_imagine final latent: max |diff| / max |ref| = " << err);
    CHECK(err < 1e-3);
    compare_u8(rgb.data(), read_bytes(dir() + "/ref/image.u8"), rgb.size());

    // A wrong latent size and a size off the multiple are refused by name.
    o.latent_in_len = latent.size() - 1;
    e = cmf_imagine(p, &o, rgb.data(), rgb.size());
    REQUIRE(e != nullptr);
    CHECK(std::string(cmf_error_message(e)).find("latent_in holds") != std::string::npos);
    cmf_error_free(e);
    o.latent_in_len = latent.size();
    o.width = c.width + 1;
    e = cmf_imagine(p, &o, nullptr, 0);
    REQUIRE(e != nullptr);
    CHECK(std::string(cmf_error_message(e)).find("multiples of") != std::string::npos);
    cmf_error_free(e);
    // Stopping from the step callback cancels the run.
    o.width = c.width;
    o.on_step = [](void *, uint32_t, uint32_t) -> int32_t { return 1; };
    e = cmf_imagine(p, &o, nullptr, 0);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_CANCELLED);
    cmf_error_free(e);
    cmf_image_pipeline_free(p);
    cmf_close(m);
}

TEST_CASE("lumina2: a text session on a pipeline file points to cmf_imagine") {
    TestRuntime t;
    cmf_model *m = nullptr;
    REQUIRE(cmf_open(t.rt, packed(t.rt).c_str(), nullptr, &m) == nullptr);
    cmf_session *s = nullptr;
    cmf_error *e = cmf_session_create_for_model(t.rt, m, nullptr, &s);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_UNSUPPORTED);
    CHECK(std::string(cmf_error_message(e)).find("image pipeline") != std::string::npos);
    cmf_error_free(e);
    cmf_close(m);
}
