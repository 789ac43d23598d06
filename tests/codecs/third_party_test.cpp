// A codec built outside the tree (sdk/examples/codec-example, dtype 200
// "i8_sym") loads through cmf_runtime_load_plugin, is listed next to the
// standard codecs and quantizes/dequantizes through the runtime's registry.
#include <doctest/doctest.h>

#include "common/byte_views.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>
#include <cmf/plugin.hpp>

#include <string>
#include <vector>

TEST_CASE("third_party: the SDK example codec loads, is listed and decodes through the registry") {
    cmf_runtime_options o;
    cmf_runtime_options_init(&o);
    o.log_level = -1;
    cmf_runtime *rt = nullptr;
    REQUIRE(cmf_runtime_create(&o, &rt) == nullptr);
    cmf_error *e = cmf_runtime_load_plugin(rt, CMF_CODEC_EXAMPLE);
    if (e) FAIL(cmf_error_message(e));

    bool listed = false, standard = false;
    for (size_t i = 0; i < cmf_runtime_component_count(rt, CMF_COMPONENT_CODEC); ++i) {
        cmf_component_info c;
        cmf_component_info_init(&c);
        REQUIRE(cmf_runtime_component_info(rt, CMF_COMPONENT_CODEC, i, &c) == nullptr);
        if (c.dtype_id == 200) listed = std::string(c.name) == "i8_sym";
        if (c.dtype_id == CMF_DTYPE_Q4TP) standard = std::string(c.name) == "q4tp";
    }
    CHECK(listed);
    CHECK(standard);

    const cmf::CodecEntry *codec = static_cast<cmf::Runtime *>(rt)->codec(200);
    REQUIRE(codec != nullptr);
    const uint64_t shape[2] = {2, 3};
    const float src[6] = {1.27f, -0.5f, 0.0f, 0.01f, -1.27f, 0.635f};
    std::vector<uint8_t> bytes;
    cmf_byte_sink sink = cmf::vector_sink(bytes);
    REQUIRE(codec->vt.quantize(codec->ctx, 2, shape, src, nullptr, &sink) == nullptr);
    uint64_t size = 0;
    REQUIRE(codec->vt.expected_size(codec->ctx, 2, shape, &size) == nullptr);
    CHECK(bytes.size() == size);
    CHECK(size == 10);
    CHECK(static_cast<int8_t>(bytes[0]) == 127);
    CHECK(static_cast<int8_t>(bytes[1]) == -50);

    cmf_tensor_view t = cmf::tensor_view(200, {2, 3}, bytes);
    REQUIRE(codec->vt.validate(codec->ctx, &t) == nullptr);
    float out[3];
    REQUIRE(codec->vt.dequantize_rows(codec->ctx, &t, 1, 2, out) == nullptr);
    CHECK(out[0] == doctest::Approx(0.01).epsilon(0.01));
    CHECK(out[1] == doctest::Approx(-1.27));
    CHECK(out[2] == doctest::Approx(0.635).epsilon(0.01));

    t.nbytes = 9;  // a truncated payload is refused with the codec's message
    cmf_error *bad = codec->vt.validate(codec->ctx, &t);
    REQUIRE(bad != nullptr);
    CHECK(std::string(cmf_error_message(bad)).find("i8_sym payload is 9 bytes") != std::string::npos);
    CHECK(cmf_error_code(bad) == CMF_ERR_BOUNDS);
    cmf_error_free(bad);
    cmf_runtime_free(rt);
}
