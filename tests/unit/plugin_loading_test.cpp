// Plugin discovery and version negotiation through cmf.h: broken plugins are
// refused with a message naming the file and both versions, and the host
// keeps working with the good ones.
#include <doctest/doctest.h>

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <cstdlib>
#include <string>

namespace {

std::string bad(const char *name) { return std::string(CMF_TEST_BAD_PLUGIN_DIR) + "/" + name; }

struct Rt {
    cmf_runtime *rt = nullptr;
    explicit Rt(const std::string &path, uint32_t flags = 0) {
        cmf_runtime_options o;
        cmf_runtime_options_init(&o);
        o.plugin_path = path.c_str();
        o.flags = flags;
        o.log_level = -1;  // silence refusals in test output
        cmf_error *e = cmf_runtime_create(&o, &rt);
        REQUIRE(e == nullptr);
    }
    ~Rt() { cmf_runtime_free(rt); }
};

std::string refusal_of(cmf_runtime *rt, const std::string &path_suffix) {
    for (size_t i = 0; i < cmf_runtime_plugin_count(rt); ++i) {
        cmf_plugin_info p;
        cmf_plugin_info_init(&p);
        REQUIRE(cmf_runtime_plugin_info(rt, i, &p) == nullptr);
        std::string path = p.path;
        if (path.size() >= path_suffix.size() && path.compare(path.size() - path_suffix.size(), path_suffix.size(), path_suffix) == 0) {
            if (p.status == CMF_PLUGIN_STATUS_LOADED) return "LOADED";
            return p.message;
        }
    }
    return "NOT SEEN";
}

std::string load_error(cmf_runtime *rt, const std::string &path, int32_t *code = nullptr) {
    cmf_error *e = cmf_runtime_load_plugin(rt, path.c_str());
    if (!e) return "";
    std::string msg = cmf_error_message(e);
    if (code) *code = cmf_error_code(e);
    cmf_error_free(e);
    return msg;
}

bool has_codec(cmf_runtime *rt, int32_t dtype) {
    for (size_t i = 0; i < cmf_runtime_component_count(rt, CMF_COMPONENT_CODEC); ++i) {
        cmf_component_info c;
        cmf_component_info_init(&c);
        REQUIRE(cmf_runtime_component_info(rt, CMF_COMPONENT_CODEC, i, &c) == nullptr);
        if (c.dtype_id == dtype) return true;
    }
    return false;
}

}  // namespace

TEST_CASE("the build's plugins load from CMF_PLUGIN_PATH") {
    Rt rt("");
    CHECK(has_codec(rt.rt, CMF_DTYPE_F32));
    CHECK(has_codec(rt.rt, CMF_DTYPE_F16));
    CHECK(has_codec(rt.rt, CMF_DTYPE_BF16));
    CHECK(has_codec(rt.rt, CMF_DTYPE_MEM_Q4_ROWS));  // a memory-only dtype (q4_block's decode copy)
    CHECK(has_codec(rt.rt, CMF_DTYPE_MEM_Q1_PASSES));  // q1's decode copy
    CHECK(has_codec(rt.rt, CMF_DTYPE_MEM_Q1T_PASSES));  // q1t's decode copy
    CHECK(has_codec(rt.rt, CMF_DTYPE_MEM_Q1S_PASSES));  // q1s's decode copy
    CHECK(cmf_runtime_component_count(rt.rt, CMF_COMPONENT_BACKEND) >= 1);
}

TEST_CASE("a plugin answering a newer ABI is refused, naming the file and both versions") {
    Rt rt("");
    int32_t code = 0;
    std::string msg = load_error(rt.rt, bad("cmf-test-too-new.so"), &code);
    CHECK(code == CMF_ERR_PLUGIN);
    CHECK(msg.find("cmf-test-too-new.so") != std::string::npos);
    CHECK(msg.find("plugin ABI " + std::to_string(CMF_PLUGIN_ABI_VERSION + 1)) != std::string::npos);
    CHECK(msg.find(std::to_string(CMF_PLUGIN_ABI_VERSION)) != std::string::npos);
    CHECK_FALSE(has_codec(rt.rt, 200));
    CHECK(has_codec(rt.rt, CMF_DTYPE_F16));  // the host keeps working
}

TEST_CASE("a plugin answering an older ABI is refused") {
    Rt rt("");
    std::string msg = load_error(rt.rt, bad("cmf-test-too-old.so"));
    CHECK(msg.find("cmf-test-too-old.so") != std::string::npos);
    CHECK(msg.find("plugin ABI 0") != std::string::npos);
    CHECK(msg.find("minimum " + std::to_string(CMF_PLUGIN_ABI_MIN)) != std::string::npos);
    CHECK_FALSE(has_codec(rt.rt, 200));
}

TEST_CASE("a library without the entry point is refused") {
    Rt rt("");
    std::string msg = load_error(rt.rt, bad("cmf-test-no-entry.so"));
    CHECK(msg.find("no entry point cmf_plugin_init_v1") != std::string::npos);
}

TEST_CASE("a plugin built only for a future ABI major is refused with its version") {
    Rt rt("");
    std::string msg = load_error(rt.rt, bad("cmf-test-future-only.so"));
    CHECK(msg.find("built for plugin ABI 2") != std::string::npos);
}

TEST_CASE("a plugin with an unresolved symbol is refused at load, not mid-run") {
    Rt rt("");
    std::string msg = load_error(rt.rt, bad("cmf-test-unresolved.so"));
    CHECK(msg.find("cannot load") != std::string::npos);
    CHECK(msg.find("cmf_test_symbol_that_does_not_exist") != std::string::npos);
}

TEST_CASE("a plugin whose init fails, or that registers nothing, is refused") {
    Rt rt("");
    CHECK(load_error(rt.rt, bad("cmf-test-init-fails.so")).find("this test plugin always fails") != std::string::npos);
    CHECK(load_error(rt.rt, bad("cmf-test-registers-nothing.so")).find("registered no component") != std::string::npos);
}

TEST_CASE("garbage vtables are refused with what is wrong, naming the file") {
    Rt rt("");
    struct Case {
        const char *file, *message;
    };
    const Case cases[] = {
        {"cmf-test-vt-too-small.so", "init failed: codec 'test-dtype': vtable struct_size 8 is smaller than the v1 minimum 64"},
        {"cmf-test-null-required.so", "init failed: codec 'test-dtype': expected_size and dequantize_rows are required"},
        {"cmf-test-bad-name.so", "init failed: codec name has byte 0xff at 3 (must be UTF-8 without control characters)"},
        {"cmf-test-long-name.so", "init failed: codec name is 300 bytes long (at most 256)"},
        {"cmf-test-dtype-between-ranges.so",
         "init failed: codec 'test-dtype': dtype id 300 outside 0..255 (file dtypes) and 512..1023 (memory-only dtypes)"},
        {"cmf-test-null-vtable.so", "init failed: register_codec: NULL argument"},
        {"cmf-test-backend-null-ops.so",
         "init failed: backend 'hollow': required operations are NULL: weight_bind, weight_free, matmul, buffer_alloc, "
         "buffer_free, buffer_write, buffer_read, copy, rms_norm, rope, attention, gated_act, add, add_bias, embed"},
    };
    for (const Case &c : cases) {
        INFO(c.file);
        int32_t code = 0;
        const std::string msg = load_error(rt.rt, bad(c.file), &code);
        CHECK(code == CMF_ERR_PLUGIN);
        CHECK(msg == "plugin " + bad(c.file) + " refused: " + c.message);
    }
    CHECK_FALSE(has_codec(rt.rt, 200));
    CHECK(cmf_runtime_component_count(rt.rt, CMF_COMPONENT_BACKEND) == 1);  // only the cpu backend
    CHECK(has_codec(rt.rt, CMF_DTYPE_F16));                                  // the host keeps working
}

TEST_CASE("a vtable larger than the host's is read up to the host's size") {
    Rt rt("");
    CHECK(load_error(rt.rt, bad("cmf-test-vt-huge.so")) == "");
    CHECK(has_codec(rt.rt, 200));
}

TEST_CASE("cmf_plugin_in_progress is NULL outside plugin loading") {
    // Inside an init it names the plugin: the bad input matrix shows it
    // through cmfhost (tests/reliability), where libcmf.so exports it to
    // the plugin's dlsym.
    CHECK(cmf_plugin_in_progress() == nullptr);
    Rt rt("");
    CHECK(load_error(rt.rt, bad("cmf-test-init-fails.so")).find("always fails") != std::string::npos);
    CHECK(cmf_plugin_in_progress() == nullptr);
}

TEST_CASE("scanning a directory records refusals instead of failing, and loads the good ones") {
    Rt rt(CMF_TEST_BAD_PLUGIN_DIR);
    CHECK(refusal_of(rt.rt, "cmf-test-too-new.so").find("newer than this host") != std::string::npos);
    CHECK(refusal_of(rt.rt, "cmf-test-too-old.so").find("older than this host") != std::string::npos);
    CHECK(refusal_of(rt.rt, "cmf-test-no-entry.so").find("no entry point") != std::string::npos);
    CHECK(refusal_of(rt.rt, "cmf-test-good.so") == "LOADED");
    CHECK(has_codec(rt.rt, 200));
    CHECK(has_codec(rt.rt, CMF_DTYPE_F16));
}

TEST_CASE("a missing plugin file is a clear error") {
    Rt rt("");
    int32_t code = 0;
    std::string msg = load_error(rt.rt, "/nonexistent/cmf-nothing.so", &code);
    CHECK(code == CMF_ERR_FILE_NOT_FOUND);
    CHECK(msg.find("/nonexistent/cmf-nothing.so") != std::string::npos);
}

TEST_CASE("NO_DEFAULT_PLUGINS + IGNORE_ENV gives an empty registry") {
    Rt rt("", CMF_RUNTIME_NO_DEFAULT_PLUGINS | CMF_RUNTIME_IGNORE_ENV);
    CHECK(cmf_runtime_plugin_count(rt.rt) == 0);
    CHECK(cmf_runtime_component_count(rt.rt, CMF_COMPONENT_CODEC) == 0);
}

TEST_CASE("several runtimes in one process each get their own plugin state") {
    Rt a(""), b("");
    CHECK(has_codec(a.rt, CMF_DTYPE_F16));
    CHECK(has_codec(b.rt, CMF_DTYPE_F16));
}

TEST_CASE("errors: NULL is success, codes have stable names") {
    CHECK(cmf_error_code(nullptr) == 0);
    CHECK(std::string(cmf_error_message(nullptr)).empty());
    cmf_error_free(nullptr);
    CHECK(std::string(cmf_error_code_name(CMF_ERR_BOUNDS)) == "Bounds");
    CHECK(std::string(cmf_error_code_name(CMF_ERR_INVALID_MAGIC)) == "InvalidMagic");
    CHECK(std::string(cmf_error_code_name(CMF_ERR_UNSUPPORTED_FEATURE)) == "UnsupportedFeature");
    cmf_error *e = cmf_runtime_create(nullptr, nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    cmf_error_free(e);
}
