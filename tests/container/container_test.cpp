// Container tests through cmf.h (plus the writer's crash hook, white-box).
#include <doctest/doctest.h>

#include <cmf/cmf.h>

#include "common/error.hpp"
#include "container/writer.hpp"
#include "plugin_host/runtime.hpp"
#include "support/test_runtime.hpp"

#include <openssl/evp.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

struct Rt : TestRuntime {
    Rt() : TestRuntime(CMF_LOG_ERROR) {
        // Refused (and harmless) once the real codecs plugin registers 11 and 13.
        cmf_error_free(cmf_runtime_load_plugin(rt, CMF_TEST_CONTAINER_CODECS));
    }
};
Rt &runtime() {
    static Rt rt;
    return rt;
}

// One scratch dir per test process, removed at exit (by the process that made it,
// not by forked children, which leave through _exit).
struct ScratchDir {
    fs::path path = fs::temp_directory_path() / ("cmf-container-test-" + std::to_string(::getpid()));
    pid_t owner = ::getpid();
    ScratchDir() { fs::create_directories(path); }
    ~ScratchDir() {
        std::error_code ec;
        if (::getpid() == owner) fs::remove_all(path, ec);
    }
};
fs::path tmpdir() {
    static ScratchDir d;
    return d.path;
}
Bytes read_all(const fs::path &p) {
    std::ifstream f(p, std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(f), {});
}
void write_all(const fs::path &p, const Bytes &b) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
}
std::string sha256_hex(const Bytes &b) {
    unsigned char d[32];
    unsigned int n = 32;
    EVP_Digest(b.data(), b.size(), d, &n, EVP_sha256(), nullptr);
    char out[65];
    for (int i = 0; i < 32; ++i) std::snprintf(out + 2 * i, 3, "%02x", d[i]);
    return out;
}
// Error code of opening `p` (0 = opened); the message goes to `msg`.
int32_t open_code(const fs::path &p, std::string *msg = nullptr, cmf_model **keep = nullptr, uint32_t flags = 0) {
    cmf_open_options o;
    cmf_open_options_init(&o);
    o.flags = flags;
    cmf_model *m = nullptr;
    cmf_error *e = cmf_open(runtime().rt, p.c_str(), &o, &m);
    int32_t code = cmf_error_code(e);
    if (msg) *msg = cmf_error_message(e);
    cmf_error_free(e);
    if (keep) *keep = m;
    else cmf_close(m);
    return code;
}
std::vector<std::string> verify_problems(cmf_model *m, std::vector<const char *> trusted = {}) {
    cmf_verify_options o;
    cmf_verify_options_init(&o);
    o.trusted_keys = trusted.data();
    o.n_trusted_keys = trusted.size();
    // Progress (every verify here): pool threads call in any order, yet the
    // calls never go back and the last one has done == total.
    std::vector<std::pair<uint64_t, uint64_t>> seen;
    o.progress = [](void *u, uint64_t done, uint64_t total) {
        static_cast<std::vector<std::pair<uint64_t, uint64_t>> *>(u)->emplace_back(done, total);
    };
    o.progress_user = &seen;
    cmf_verify_report *r = nullptr;
    REQUIRE(cmf_verify(m, &o, &r) == nullptr);
    for (size_t i = 1; i < seen.size(); ++i) CHECK(seen[i].first >= seen[i - 1].first);
    if (!seen.empty()) CHECK(seen.back().first == seen.back().second);
    std::vector<std::string> out;
    for (size_t i = 0; i < cmf_verify_problem_count(r); ++i) out.push_back(cmf_verify_problem(r, i));
    cmf_verify_report_free(r);
    return out;
}
// Opens and verifies; returns "" when clean, else the first error or problem.
std::string open_and_verify(const fs::path &p) {
    cmf_model *m = nullptr;
    std::string msg;
    if (open_code(p, &msg, &m) != 0) return "open: " + msg;
    auto probs = verify_problems(m);
    cmf_close(m);
    return probs.empty() ? "" : probs.front();
}

// ---- the original's 4490-byte worked example file ---------------------------------------
const char *kSampleHeader =
    R"({"format":"cmf","version":2,"arch":{"arch_name":"tiny-test","hidden_size":8,"intermediate_size":16,)"
    R"("num_layers":2,"num_attention_heads":2,"num_kv_heads":1,"head_dim":4,"vocab_size":10,)"
    R"("layer_types":["FullAttention","FullAttention"],"rms_norm_eps":1e-6,"norm_style":"qwen","rope_theta":10000.0,)"
    R"("tie_word_embeddings":false,"partial_rotary_factor":1.0,"max_position_embeddings":64,)"
    R"("linear_conv_kernel_dim":null,"linear_num_key_heads":null,"linear_num_value_heads":null},"quant_type":"F16"})";
const Bytes kNorm = {0x00, 0x3c, 0x00, 0x3e, 0x00, 0x40, 0x00, 0xb8, 0x00, 0x34, 0x00, 0x30, 0x00, 0x42, 0x00, 0xbc};
const Bytes kGate = {0x25, 0x31, 0x11, 0x53, 0xb7, 0x6f, 0x4b, 0x5b, 0x9e, 0x25, 0xde, 0xcc, 0xed, 0x52, 0xe9, 0xb5, 0xb4, 0xf6};
const Bytes kMaskBlob = {0x55, 0x55, 0xff, 0x00, 0x03, 0x03, 0x03};
const std::string kVocab = R"({"version":"1.0"})";
const char *kSampleSha = "9063442b9b7fa9fbc43436c616890acf08cef97fe50e91426798da3f6f1d53ac";

cmf_error *write_sample(const fs::path &p, uint64_t shard_max = 0, bool masks_and_vocab = true, uint32_t flags = 0) {
    cmf_writer_options o;
    cmf_writer_options_init(&o);
    o.shard_max_bytes = shard_max;
    o.flags = flags;
    cmf_writer *w = nullptr;
    if (cmf_error *e = cmf_writer_create(runtime().rt, p.c_str(), kSampleHeader, std::strlen(kSampleHeader), &o, &w)) return e;
    const uint64_t s1[] = {8}, s2[] = {1, 32};
    cmf_error *e = cmf_writer_add_tensor(w, "model.norm.weight", CMF_DTYPE_F16, 1, s1, kNorm.data(), kNorm.size());
    if (!e) e = cmf_writer_add_tensor(w, "model.layers.0.mlp.gate_proj.weight", CMF_DTYPE_Q4_TILED, 2, s2, kGate.data(), kGate.size());
    if (!e && masks_and_vocab) {
        cmf_mask_spec m;
        cmf_mask_spec_init(&m);
        m.task_id = 0;
        m.name = "general";
        m.sparsity = 0.5f;
        m.priority = "Fallback";
        m.blob = kMaskBlob.data();
        m.blob_len = kMaskBlob.size();
        e = cmf_writer_add_mask(w, &m);
        if (!e) e = cmf_writer_set_vocab(w, kVocab.data(), kVocab.size());
    }
    if (!e) e = cmf_writer_finish(w);
    cmf_writer_free(w);
    return e;
}
fs::path sample_path() {
    static fs::path p = [] {
        fs::path q = tmpdir() / "sample.cmf";
        REQUIRE(write_sample(q) == nullptr);
        return q;
    }();
    return p;
}

}  // namespace

TEST_CASE("container: the original's 4490-byte sample is written byte for byte") {
    Bytes b = read_all(sample_path());
    CHECK(b.size() == 4490);
    CHECK(sha256_hex(b) == kSampleSha);
    // cli_test.sh asks for a copy to run cmfhost on.
    if (const char *copy = std::getenv("CMF_TEST_SAMPLE_COPY")) fs::copy_file(sample_path(), copy, fs::copy_options::overwrite_existing);
}

TEST_CASE("container: the sample reads back") {
    cmf_model *m = nullptr;
    REQUIRE(open_code(sample_path(), nullptr, &m) == 0);
    cmf_model_info info;
    cmf_model_info_init(&info);
    REQUIRE(cmf_model_get_info(m, &info) == nullptr);
    CHECK(info.required_features == 3u);
    CHECK(info.header_len == 586);
    CHECK(info.dir_off == 714);
    CHECK(info.data_off == 4096);
    CHECK(info.masks_off == 4178);
    CHECK(info.index_len == 48);
    CHECK(info.header_hash == 0xcbea33faee65d5daull);
    CHECK(std::string(info.arch_name) == "tiny-test");
    CHECK(std::string(info.quant_type) == "F16");
    CHECK(info.shard_count == 1);
    CHECK(cmf_tensor_count(m) == 2);
    cmf_tensor_info t;
    cmf_tensor_info_init(&t);
    REQUIRE(cmf_tensor(m, "model.layers.0.mlp.gate_proj.weight", &t) == nullptr);
    CHECK(t.dtype == CMF_DTYPE_Q4_TILED);
    CHECK(t.offset == 64);
    CHECK(t.nbytes == 18);
    CHECK(t.hash == 0x2f9064c4a3f65aa7ull);
    CHECK(std::memcmp(t.data, kGate.data(), 18) == 0);
    cmf_error *e = cmf_tensor(m, "nope", &t);
    CHECK(cmf_error_code(e) == CMF_ERR_MISSING_TENSOR);
    cmf_error_free(e);
    // f16 through the real codec: 1, 1.5, 2, -0.5, 0.25, 0.125, 3, -1
    float f[8];
    REQUIRE(cmf_tensor_dequantize(m, 0, 0, 1, f, 8) == nullptr);
    const float want[8] = {1, 1.5f, 2, -0.5f, 0.25f, 0.125f, 3, -1};
    for (int i = 0; i < 8; ++i) CHECK(f[i] == want[i]);
    // q4_tiled decodes to input A within the quantization step (absmax/7 = 18/16/7).
    float g[32];
    REQUIRE(cmf_tensor_dequantize(m, 1, 0, 1, g, 32) == nullptr);
    for (int i = 0; i < 32; ++i) CHECK(std::fabs(g[i] - float((i * i) % 37 - 18) / 16.0f) <= 18.0f / 16 / 7 / 2 + 1e-3f);
    // vocab, masks, index
    const void *v = nullptr;
    uint64_t vlen = 0;
    REQUIRE(cmf_model_vocab(m, &v, &vlen) == nullptr);
    CHECK(std::string(static_cast<const char *>(v), vlen) == kVocab);
    REQUIRE(cmf_mask_count(m) == 1);
    CHECK(std::string(cmf_mask_default_task(m)) == "general");
    cmf_mask_info mi;
    cmf_mask_info_init(&mi);
    REQUIRE(cmf_mask_at(m, 0, &mi) == nullptr);
    CHECK(std::string(mi.name) == "general");
    CHECK(std::string(mi.priority) == "Fallback");
    CHECK(mi.quality_json == nullptr);
    CHECK(mi.sparsity == 0.5f);
    CHECK(mi.ffn_rows == 2);
    CHECK(Bytes(mi.blob, mi.blob + mi.blob_len) == kMaskBlob);
    REQUIRE(cmf_index_entry_count(m) == 2);
    cmf_index_entry ie;
    cmf_index_entry_init(&ie);
    REQUIRE(cmf_index_entry_at(m, 1, &ie) == nullptr);
    CHECK(ie.layer == 1);
    CHECK(ie.n_groups == 1);
    CHECK(ie.groups[0] == 0);
    CHECK(ie.n_heads == 2);
    CHECK(ie.heads[1] == 1);
    CHECK(verify_problems(m).empty());
    cmf_close(m);
    // the read() fallback sees the same file
    CHECK(open_code(sample_path(), nullptr, nullptr, CMF_OPEN_NO_MMAP) == 0);
}

namespace {
struct Mutation {
    const char *rule;
    std::function<void(Bytes &)> apply;
    int32_t code;
};
void put64(Bytes &b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }
void put32(Bytes &b, size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
void replace(Bytes &b, const std::string &from, const std::string &to) {
    REQUIRE(from.size() == to.size());
    auto it = std::search(b.begin(), b.end(), from.begin(), from.end());
    REQUIRE(it != b.end());
    std::copy(to.begin(), to.end(), it);
}
constexpr size_t kDir = 714, kRec0 = kDir + 16, kRec1 = kRec0 + 56, kMasks = 4178, kIndex = 4442;
}  // namespace

TEST_CASE("container: every open() rule has its own crafted file and error code") {
    const Bytes good = read_all(sample_path());
    const std::vector<Mutation> cases = {
        {"shorter than the envelope", [](Bytes &b) { b.resize(100); }, CMF_ERR_BOUNDS},
        {"magic", [](Bytes &b) { b[3] = 2; }, CMF_ERR_INVALID_MAGIC},
        {"version", [](Bytes &b) { put32(b, 4, 3); }, CMF_ERR_UNSUPPORTED_VERSION},
        {"unknown feature bit (DELTA_MASKS)", [](Bytes &b) { put32(b, 12, 0x0b); }, CMF_ERR_UNSUPPORTED_FEATURE},
        {"unknown feature bit 31", [](Bytes &b) { put32(b, 12, 0x80000003u); }, CMF_ERR_UNSUPPORTED_FEATURE},
        {"header len 0", [](Bytes &b) { put64(b, 0x18, 0); }, CMF_ERR_BOUNDS},
        {"dir len 0", [](Bytes &b) { put64(b, 0x28, 0); }, CMF_ERR_BOUNDS},
        {"masks past EOF", [](Bytes &b) { put64(b, 0x48, 400); }, CMF_ERR_BOUNDS},
        {"index off+len overflows", [](Bytes &b) { put64(b, 0x60, ~uint64_t(0) - 8); }, CMF_ERR_BOUNDS},
        {"data_off not 4096-aligned", [](Bytes &b) { put64(b, 0x30, 64); }, CMF_ERR_BOUNDS},
        {"header not JSON", [](Bytes &b) { b[128] = 'x'; }, CMF_ERR_PARSE},
        {"header missing quant_type", [](Bytes &b) { replace(b, "\"quant_type\"", "\"quant_typX\""); }, CMF_ERR_PARSE},
        {"header unknown quant_type", [](Bytes &b) { replace(b, "\"F16\"", "\"F17\""); }, CMF_ERR_PARSE},
        {"header unknown layer type", [](Bytes &b) { replace(b, "\"FullAttention\"", "\"FullAttentiom\""); }, CMF_ERR_PARSE},
        {"header invalid UTF-8", [](Bytes &b) { replace(b, "tiny-test", "tiny\xff" "test"); }, CMF_ERR_PARSE},
        {"dir shorter than 16", [](Bytes &b) { put64(b, 0x28, 8); }, CMF_ERR_PARSE},
        {"dir count overflows", [](Bytes &b) { put64(b, kDir, uint64_t(1) << 62); }, CMF_ERR_PARSE},
        {"dir records past dir_len", [](Bytes &b) { put64(b, kDir, 4); }, CMF_ERR_PARSE},
        {"pool_off beyond dir", [](Bytes &b) { put64(b, kDir + 8, 500); }, CMF_ERR_PARSE},
        {"pool_off inside records", [](Bytes &b) { put64(b, kDir + 8, 64); }, CMF_ERR_PARSE},
        {"ndim 7", [](Bytes &b) { b[kRec0 + 7] = 7; }, CMF_ERR_PARSE},
        {"name beyond pool", [](Bytes &b) { b[kRec1 + 4] = 200; }, CMF_ERR_PARSE},
        {"name not UTF-8", [](Bytes &b) { b[kDir + 128] = 0xff; }, CMF_ERR_PARSE},
        {"dtype 17", [](Bytes &b) { b[kRec0 + 6] = 17; }, CMF_ERR_UNKNOWN_DTYPE},
        {"offset not 64-aligned", [](Bytes &b) { put64(b, kRec1 + 32, 65); }, CMF_ERR_BOUNDS},
        {"off+nbytes overflows", [](Bytes &b) { put64(b, kRec1 + 32, ~uint64_t(0) - 63); }, CMF_ERR_BOUNDS},
        {"payload past data_len", [](Bytes &b) { put64(b, kRec1 + 32, 128); }, CMF_ERR_BOUNDS},
        {"shape product overflows", [](Bytes &b) { b[kRec1 + 7] = 6; for (int k = 0; k < 6; ++k) put32(b, kRec1 + 8 + 4 * k, 0xffffffffu); }, CMF_ERR_BOUNDS},
        {"nbytes != expected (f16)", [](Bytes &b) { put64(b, kRec0 + 40, 14); }, CMF_ERR_BOUNDS},
        {"dtype size rule (q8_row: n + 2*rows bytes)", [](Bytes &b) { b[kRec1 + 6] = 3; }, CMF_ERR_BOUNDS},
        {"codec validate() refuses (q1s shorter than its count)", [](Bytes &b) { b[kRec0 + 6] = 13; put64(b, kRec0 + 40, 2); }, CMF_ERR_BOUNDS},
        {"duplicate tensor name", [](Bytes &b) { put32(b, kRec1, 0); b[kRec1 + 4] = 17; b[kRec1 + 5] = 0; b[kRec1 + 6] = 1; b[kRec1 + 7] = 1; put32(b, kRec1 + 8, 9); }, CMF_ERR_PARSE},
        {"n_masks != meta", [](Bytes &b) { put32(b, kMasks, 2); }, CMF_ERR_PARSE},
        {"mask meta past section", [](Bytes &b) { put32(b, kMasks + 4, 4000); }, CMF_ERR_PARSE},
        {"mask blob_len matches no layout", [](Bytes &b) { replace(b, "\"blob_len\":7", "\"blob_len\":6"); }, CMF_ERR_PARSE},
        {"mask unknown priority", [](Bytes &b) { replace(b, "Fallback", "Fallbacc"); }, CMF_ERR_PARSE},
        {"mask head tail bits set", [](Bytes &b) { b[kMasks + 240 + 4] = 0x07; }, CMF_ERR_PARSE},
        {"mask gate tail bits set", [](Bytes &b) { b[kMasks + 240 + 6] = 0x07; }, CMF_ERR_PARSE},
        {"index entries past the section", [](Bytes &b) { put32(b, kIndex, 9); }, CMF_ERR_PARSE},
    };
    int n = 0;
    for (const auto &c : cases) {
        Bytes b = good;
        c.apply(b);
        fs::path p = tmpdir() / ("rule" + std::to_string(n++) + ".cmf");
        write_all(p, b);
        std::string msg;
        INFO(c.rule);
        CHECK(cmf_error_code_name(open_code(p, &msg)) == std::string(cmf_error_code_name(c.code)));
        CHECK(!msg.empty());
    }
    std::string msg;
    CHECK(open_code(tmpdir() / "does-not-exist.cmf", &msg) == CMF_ERR_FILE_NOT_FOUND);
    // The message names the unknown dtype id.
    Bytes b = good;
    b[kRec0 + 6] = 17;
    write_all(tmpdir() / "dtype17.cmf", b);
    open_code(tmpdir() / "dtype17.cmf", &msg);
    CHECK(msg.find("17") != std::string::npos);
}

TEST_CASE("container: every byte flip in header and directory is caught") {
    const Bytes good = read_all(sample_path());
    const fs::path p = tmpdir() / "flip.cmf";
    int caught = 0, total = 0;
    for (size_t at = 128; at < kDir + 180; ++at) {
        Bytes b = good;
        b[at] ^= 0x20;
        write_all(p, b);
        ++total;
        if (!open_and_verify(p).empty()) ++caught;
        else FAIL_CHECK("flip at byte " << at << " went unnoticed");
    }
    CHECK(caught == total);
    // and a payload flip is named by verify
    Bytes b = good;
    b[4096 + 70] ^= 1;
    write_all(p, b);
    CHECK(open_and_verify(p).find("tensor 'model.layers.0.mlp.gate_proj.weight': hash64 mismatch") == 0);
}

TEST_CASE("container: truncation at every section boundary") {
    const Bytes good = read_all(sample_path());
    for (size_t cut : {size_t(128), size_t(714), size_t(894), size_t(4096), size_t(4177), size_t(4178), size_t(4425),
                       size_t(4442), size_t(4489)}) {
        Bytes b(good.begin(), good.begin() + long(cut));
        fs::path p = tmpdir() / "cut.cmf";
        write_all(p, b);
        INFO("cut at " << cut);
        CHECK(open_code(p) == CMF_ERR_BOUNDS);
    }
}

TEST_CASE("container: sharded round trip") {
    const fs::path base = tmpdir() / "sh";
    fs::create_directories(base);
    REQUIRE(write_sample(base / "m.cmf", 17) == nullptr);
    REQUIRE(fs::exists(base / "m-00001-of-00002.cmf"));
    REQUIRE(fs::exists(base / "m-00002-of-00002.cmf"));
    for (const char *name : {"m-00001-of-00002.cmf", "m-00002-of-00002.cmf"}) {
        cmf_model *m = nullptr;
        INFO(name);
        REQUIRE(open_code(base / name, nullptr, &m) == 0);
        CHECK(cmf_tensor_count(m) == 2);
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        REQUIRE(cmf_tensor(m, "model.layers.0.mlp.gate_proj.weight", &t) == nullptr);
        CHECK(t.shard == 1);
        CHECK(std::memcmp(t.data, kGate.data(), 18) == 0);
        CHECK(cmf_mask_count(m) == 1);
        cmf_model_info info;
        cmf_model_info_init(&info);
        REQUIRE(cmf_model_get_info(m, &info) == nullptr);
        CHECK(info.shard_count == 2);
        CHECK(verify_problems(m).empty());
        cmf_close(m);
    }
    // one shard alone
    cmf_model *m = nullptr;
    REQUIRE(open_code(base / "m-00002-of-00002.cmf", nullptr, &m, CMF_OPEN_NO_SHARD_MERGE) == 0);
    CHECK(cmf_tensor_count(m) == 1);
    cmf_close(m);
    // count mismatch between name and header; missing neighbour
    fs::copy_file(base / "m-00001-of-00002.cmf", base / "m-00001-of-00003.cmf");
    std::string msg;
    CHECK(open_code(base / "m-00001-of-00003.cmf", &msg) == CMF_ERR_PARSE);
    fs::remove(base / "m-00002-of-00002.cmf");
    CHECK(open_code(base / "m-00001-of-00002.cmf", &msg) == CMF_ERR_FILE_NOT_FOUND);
    CHECK(msg.find("m-00002-of-00002.cmf") != std::string::npos);
}

TEST_CASE("container: signatures round trip, untrusted and tampered") {
    const fs::path dir = tmpdir() / "sig";
    fs::create_directories(dir);
    const fs::path model = dir / "s.cmf", key = dir / "k.key", other = dir / "other.key";
    REQUIRE(write_sample(model) == nullptr);
    REQUIRE(cmf_sign_keygen(key.c_str()) == nullptr);
    REQUIRE(cmf_sign_keygen(other.c_str()) == nullptr);
    cmf_error *e = cmf_sign_keygen(key.c_str());
    CHECK(cmf_error_code(e) == CMF_ERR_IO);  // never overwrites a key
    cmf_error_free(e);
    char fp[17];
    REQUIRE(cmf_sign_file(model.c_str(), key.c_str(), fp) == nullptr);
    Bytes pub = read_all(key.string() + ".pub");
    std::string pub_hex(pub.begin(), pub.end()), other_pub;
    {
        Bytes o = read_all(other.string() + ".pub");
        other_pub.assign(o.begin(), o.end());
    }
    cmf_model *m = nullptr;
    REQUIRE(open_code(model, nullptr, &m) == 0);
    cmf_verify_report *r = nullptr;
    REQUIRE(cmf_verify(m, nullptr, &r) == nullptr);
    CHECK(cmf_verify_problem_count(r) == 0);
    REQUIRE(cmf_verify_signature_count(r) == 1);
    cmf_signature_info si;
    cmf_signature_info_init(&si);
    REQUIRE(cmf_verify_signature_at(r, 0, &si) == nullptr);
    CHECK(std::string(si.fingerprint) == fp);
    CHECK(std::string(si.pubkey_hex) == pub_hex);
    cmf_verify_report_free(r);
    CHECK(verify_problems(m, {pub_hex.c_str()}).empty());
    CHECK(verify_problems(m, {fp}).empty());
    auto untrusted = verify_problems(m, {other_pub.c_str()});
    REQUIRE(untrusted.size() == 1);
    CHECK(untrusted[0].find("not a trusted key") != std::string::npos);
    cmf_close(m);
    // Tamper a byte nothing else covers (envelope flags): only the signature sees it.
    Bytes b = read_all(model);
    b[8] = 1;
    write_all(model, b);
    REQUIRE(open_code(model, nullptr, &m) == 0);
    auto probs = verify_problems(m);
    REQUIRE(probs.size() == 1);
    CHECK(probs[0].find("signature: SHA-256") == 0);
    cmf_close(m);
    // no .sig but trusted keys required
    fs::remove(model.string() + ".sig");
    REQUIRE(open_code(model, nullptr, &m) == 0);
    CHECK(verify_problems(m, {pub_hex.c_str()}).size() == 1);
    cmf_close(m);
}

namespace {
// Runs `body` in a child that SIGKILLs itself at the hook point `point`.
void run_and_kill_at(const char *point, const std::function<void()> &body) {
    fflush(nullptr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        static const char *target;
        target = point;
        cmf::container::write_crash_hook = [](const char *p) {
            if (std::strcmp(p, target) == 0) ::raise(SIGKILL);
        };
        body();
        _exit(0);  // the hook did not fire
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
}
}  // namespace

TEST_CASE("container: a killed writer never replaces a good file") {
    const fs::path p = tmpdir() / "kill.cmf";
    fs::copy_file(sample_path(), p, fs::copy_options::overwrite_existing);
    const Bytes before = read_all(p);
    for (const char *point : {"payload", "before-rename"}) {
        run_and_kill_at(point, [&] { (void)write_sample(p, 0, false); });
        CHECK(read_all(p) == before);
        CHECK(open_and_verify(p) == "");
    }
}

TEST_CASE("container: a killed sign or keygen never leaves a torn signature or key") {
    const fs::path dir = tmpdir() / "killsig";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path model = dir / "s.cmf", k1 = dir / "k1.key", k2 = dir / "k2.key";
    REQUIRE(write_sample(model) == nullptr);
    REQUIRE(cmf_sign_keygen(k1.c_str()) == nullptr);
    REQUIRE(cmf_sign_keygen(k2.c_str()) == nullptr);
    REQUIRE(cmf_sign_file(model.c_str(), k1.c_str(), nullptr) == nullptr);
    const Bytes old_sig = read_all(model.string() + ".sig");
    // The last moment before the new signature would appear.
    run_and_kill_at("before-rename", [&] { cmf_error_free(cmf_sign_file(model.c_str(), k2.c_str(), nullptr)); });
    CHECK(read_all(model.string() + ".sig") == old_sig);
    run_and_kill_at("before-rename", [&] { cmf_error_free(cmf_sign_keygen((dir / "k3.key").c_str())); });
    CHECK_FALSE(fs::exists(dir / "k3.key"));
    // Nothing else was left: no temp file beside them.
    std::vector<std::string> names;
    for (const auto &e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"k1.key", "k1.key.pub", "k2.key", "k2.key.pub", "s.cmf", "s.cmf.sig"});
}

TEST_CASE("container: the W2 streaming writer lays out the sample behind a 7 032 832-byte gap") {
    const fs::path p = tmpdir() / "w2.cmf";
    REQUIRE(write_sample(p, 0, true, CMF_WRITER_STREAM) == nullptr);
    CHECK(open_and_verify(p) == "");
    const Bytes w1 = read_all(sample_path()), w2 = read_all(p);
    const size_t gap = 7032832;  // the original W2's gap, up to 4096 source tensors
    REQUIRE(w2.size() == w1.size() - 4096 + gap);
    // Same header and directory (offsets are data-relative), same data,
    // masks, vocab and index; only the envelope's offsets and the gap differ.
    CHECK(std::equal(w1.begin() + 128, w1.begin() + 4096, w2.begin() + 128));
    CHECK(std::all_of(w2.begin() + 4096, w2.begin() + gap, [](uint8_t b) { return b == 0; }));
    CHECK(std::equal(w1.begin() + 4096, w1.end(), w2.begin() + gap));
    CHECK(std::memcmp(w1.data(), w2.data(), 16) == 0);  // magic, version, features
    // sharded, streamed
    const fs::path base = tmpdir() / "w2sh";
    fs::create_directories(base);
    REQUIRE(write_sample(base / "m.cmf", 17, true, CMF_WRITER_STREAM) == nullptr);
    CHECK(!fs::exists(base / "m.cmf"));
    for (const char *name : {"m-00001-of-00002.cmf", "m-00002-of-00002.cmf"}) {
        INFO(name);
        CHECK(open_and_verify(base / name) == "");
    }
    cmf_model *m = nullptr;
    REQUIRE(open_code(base / "m-00002-of-00002.cmf", nullptr, &m) == 0);
    cmf_tensor_info t;
    cmf_tensor_info_init(&t);
    REQUIRE(cmf_tensor(m, "model.layers.0.mlp.gate_proj.weight", &t) == nullptr);
    CHECK(t.shard == 1);
    CHECK(std::memcmp(t.data, kGate.data(), kGate.size()) == 0);
    REQUIRE(cmf_tensor(m, "model.norm.weight", &t) == nullptr);
    CHECK(t.shard == 0);
    CHECK(std::memcmp(t.data, kNorm.data(), kNorm.size()) == 0);
    CHECK(cmf_mask_count(m) == 1);
    cmf_close(m);
    CHECK(std::distance(fs::directory_iterator(base), fs::directory_iterator()) == 2);  // no temp files left
}

TEST_CASE("container: a W2 writer whose directory outgrows the gap fails and leaves nothing") {
    const fs::path base = tmpdir() / "w2gap";
    fs::create_directories(base);
    cmf_writer_options o;
    cmf_writer_options_init(&o);
    o.flags = CMF_WRITER_STREAM;
    cmf_writer *w = nullptr;
    REQUIRE(cmf_writer_create(runtime().rt, (base / "g.cmf").c_str(), kSampleHeader, std::strlen(kSampleHeader), &o, &w) == nullptr);
    const uint64_t s1[] = {1};
    const uint16_t one = 0x3c00;
    // 110 names of 65 535 bytes: a 7.2 MB directory against the 7.03 MB gap.
    for (int i = 0; i < 110; ++i) {
        std::string name = std::to_string(i) + std::string(65535 - 4, 'n');
        name.resize(65535, 'x');
        REQUIRE(cmf_writer_add_tensor(w, name.c_str(), CMF_DTYPE_F16, 1, s1, &one, 2) == nullptr);
    }
    cmf_error *e = cmf_writer_finish(w);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    CHECK(std::string(cmf_error_message(e)).find("reserved gap") != std::string::npos);
    cmf_error_free(e);
    cmf_writer_free(w);
    CHECK(fs::is_empty(base));
    // unknown flags are refused
    o.flags = 0x80;
    e = cmf_writer_create(runtime().rt, (base / "g.cmf").c_str(), kSampleHeader, std::strlen(kSampleHeader), &o, &w);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    cmf_error_free(e);
}

TEST_CASE("container: a killed W2 writer never replaces a good file") {
    const fs::path p = tmpdir() / "killw2.cmf";
    fs::copy_file(sample_path(), p, fs::copy_options::overwrite_existing);
    const Bytes before = read_all(p);
    for (const char *point : {"payload", "before-rename"}) {
        run_and_kill_at(point, [&] { (void)write_sample(p, 0, false, CMF_WRITER_STREAM); });
        CHECK(read_all(p) == before);
        CHECK(open_and_verify(p) == "");
    }
}

TEST_CASE("container: append-only growth is valid at every crash point, then compacts") {
    const fs::path p = tmpdir() / "grow.cmf";
    fs::copy_file(sample_path(), p, fs::copy_options::overwrite_existing);
    const Bytes before = read_all(p);
    std::vector<uint16_t> big(20000, 0x3c00);  // 40000 bytes of f16 ones: page-aligned payload
    auto append = [&] {
        cmf_writer *w = nullptr;
        REQUIRE(cmf_writer_open_append(runtime().rt, p.c_str(), nullptr, 0, &w) == nullptr);
        const uint64_t s[] = {100, 200};
        REQUIRE(cmf_writer_add_tensor(w, "skill.sql.model.norm.weight", CMF_DTYPE_F16, 2, s, big.data(), 40000) == nullptr);
        cmf_error *e = cmf_writer_finish(w);
        cmf_writer_free(w);
        return e;
    };
    for (const char *point : {"payload", "before-envelope"}) {
        run_and_kill_at(point, [&] { cmf_error_free(append()); });
        INFO(point);
        CHECK(open_and_verify(p) == "");
        const Bytes now = read_all(p);
        CHECK(Bytes(now.begin(), now.begin() + 128) == Bytes(before.begin(), before.begin() + 128));
    }
    fs::copy_file(sample_path(), p, fs::copy_options::overwrite_existing);
    REQUIRE(append() == nullptr);
    cmf_model *m = nullptr;
    REQUIRE(open_code(p, nullptr, &m) == 0);
    CHECK(cmf_tensor_count(m) == 3);
    cmf_tensor_info t;
    cmf_tensor_info_init(&t);
    REQUIRE(cmf_tensor(m, "model.layers.0.mlp.gate_proj.weight", &t) == nullptr);
    CHECK(t.offset == 64);  // old payloads never move
    REQUIRE(cmf_tensor(m, "skill.sql.model.norm.weight", &t) == nullptr);
    CHECK(t.offset % 4096 == 0);
    CHECK(verify_problems(m).empty());
    CHECK(cmf_mask_count(m) == 1);
    cmf_close(m);
    const Bytes grown = read_all(p);
    CHECK(Bytes(grown.begin() + 4096, grown.begin() + 4490) == Bytes(before.begin() + 4096, before.end()));
    // compaction drops the dead header/directory bytes
    const fs::path c = tmpdir() / "compact.cmf";
    REQUIRE(cmf_compact(runtime().rt, p.c_str(), c.c_str()) == nullptr);
    CHECK(fs::file_size(c) < fs::file_size(p));
    CHECK(open_and_verify(c) == "");
    // compacting the untouched sample reproduces it exactly
    REQUIRE(cmf_compact(runtime().rt, sample_path().c_str(), c.c_str()) == nullptr);
    CHECK(sha256_hex(read_all(c)) == kSampleSha);
}

#include "container/json_emit.hpp"

#include <boost/json.hpp>

TEST_CASE("container: header floats are spelled as serde_json does") {
    using namespace cmf::container::json;
    CHECK(format_f64(1e-6) == "1e-6");
    CHECK(format_f64(10000.0) == "10000.0");
    CHECK(format_f64(1.0) == "1.0");
    CHECK(format_f64(0.0) == "0.0");
    CHECK(format_f64(-0.0) == "-0.0");
    CHECK(format_f64(1.05) == "1.05");
    CHECK(format_f64(-2.5) == "-2.5");
    CHECK(format_f64(0.00001) == "0.00001");
    CHECK(format_f64(1e15) == "1000000000000000.0");
    CHECK(format_f64(1e16) == "1e+16");
    CHECK(format_f64(1.5e300) == "1.5e+300");
    CHECK(format_f64(1000000.0) == "1000000.0");
    CHECK(format_f64(std::nan("")) == "null");
    CHECK(format_f32(0.1f) == "0.1");
    CHECK(format_f32(0.62f) == "0.62");
    CHECK(format_f32(1e-6f) == "0.000001");
    CHECK(format_f32(1e-7f) == "1e-7");
    CHECK(format_f32(1e12f) == "1000000000000.0");
    CHECK(format_f32(1e13f) == "1e+13");
    std::string s;
    append_string(s, "a\"b\\c\n\x01\xd0\x9f");
    CHECK(s == "\"a\\\"b\\\\c\\n\\u0001\xd0\x9f\"");
}

TEST_CASE("container: header keys are re-emitted in the original's order") {
    // Shuffled keys, an integer rope_theta, free-form provenance with unsorted keys.
    const char *in = R"({"quant_type":"F16","arch":{"vocab_size":10,"arch_name":"t","rope_theta":500000,"hidden_size":8,)"
                     R"("intermediate_size":16,"num_layers":2,"num_attention_heads":2,"num_kv_heads":1,"head_dim":4,)"
                     R"("layer_types":["FullAttention","FullAttention"],"rms_norm_eps":0.00001,"max_position_embeddings":64,)"
                     R"("hidden_act":"silu","embed_multiplier":1,"num_loops":1,"moe":{"top_k":2,"num_experts":4,"moe_intermediate_size":8}},)"
                     R"("provenance":{"tool":"x","a":[1,2.5]},"version":2,"tokenizer_config":null})";
    std::string out = cmf::container::json::emit_header(boost::json::parse(in));
    CHECK(out ==
          R"({"format":"cmf","version":2,"arch":{"arch_name":"t","hidden_size":8,"intermediate_size":16,"num_layers":2,)"
          R"("num_attention_heads":2,"num_kv_heads":1,"head_dim":4,"vocab_size":10,"layer_types":["FullAttention","FullAttention"],)"
          R"("rms_norm_eps":0.00001,"norm_style":"qwen","rope_theta":500000.0,"tie_word_embeddings":false,"partial_rotary_factor":1.0,)"
          R"("moe":{"num_experts":4,"top_k":2,"moe_intermediate_size":8,"norm_topk_prob":false},"max_position_embeddings":64,)"
          R"("linear_conv_kernel_dim":null,"linear_num_key_heads":null,"linear_num_value_heads":null},"quant_type":"F16",)"
          R"("provenance":{"a":[1,2.5],"tool":"x"}})");
}

namespace {
std::string tiny_header(const std::string &arch_extra, const std::string &top_extra) {
    return R"({"format":"cmf","version":2,"arch":{"arch_name":"tiny-test","hidden_size":8,"intermediate_size":16,)"
           R"("num_layers":2,"num_attention_heads":2,"num_kv_heads":1,"head_dim":4,"vocab_size":10,)"
           R"("layer_types":["FullAttention","FullAttention"],"rms_norm_eps":1e-6,"max_position_embeddings":64)" +
           arch_extra + R"(},"quant_type":"F16")" + top_extra + "}";
}
// Writes a file with one f16 tensor and the given masks; returns the error code.
int32_t write_with(const fs::path &p, const std::string &header, const std::vector<cmf_mask_spec> &masks,
                   int32_t dtype = CMF_DTYPE_F16, uint64_t nbytes = 16) {
    cmf_writer *w = nullptr;
    cmf_error *e = cmf_writer_create(runtime().rt, p.c_str(), header.data(), header.size(), nullptr, &w);
    const uint64_t shape[] = {8};
    if (!e) e = cmf_writer_add_tensor(w, "model.norm.weight", dtype, 1, shape, kNorm.data(), nbytes);
    for (const auto &m : masks)
        if (!e) e = cmf_writer_add_mask(w, &m);
    if (!e) e = cmf_writer_finish(w);
    cmf_writer_free(w);
    int32_t code = cmf_error_code(e);
    cmf_error_free(e);
    return code;
}
cmf_mask_spec mask(const char *name, const Bytes &blob, bool experts = false) {
    cmf_mask_spec m;
    cmf_mask_spec_init(&m);
    m.name = name;
    m.sparsity = 0.25f;
    m.blob = blob.data();
    m.blob_len = blob.size();
    m.has_expert_fields = experts;
    return m;
}
uint32_t features_of(const fs::path &p) {
    Bytes b = read_all(p);
    uint32_t f;
    std::memcpy(&f, b.data() + 12, 4);
    return f;
}
}  // namespace

TEST_CASE("container: feature bits, loop masks, expert fields and skill files") {
    const fs::path p = tmpdir() / "features.cmf";
    // plain: TENSOR_DIR only
    REQUIRE(write_with(p, tiny_header("", ""), {}) == 0);
    CHECK(features_of(p) == CMF_FEATURE_TENSOR_DIR);
    // looped arch + masks stored per visit (4 FFN rows): LOOP_MASKS
    const Bytes loop_blob = {0xff, 0xff, 0x0f, 0x00, 0xf0, 0x00, 0x01, 0x00, 0x03, 0x01, 0x03};
    REQUIRE(write_with(p, tiny_header(R"(,"num_loops":2)", ""), {mask("loop", loop_blob)}) == 0);
    CHECK(features_of(p) == (CMF_FEATURE_TENSOR_DIR | CMF_FEATURE_BINARY_MASKS | CMF_FEATURE_LOOP_MASKS));
    cmf_model *m = nullptr;
    REQUIRE(open_code(p, nullptr, &m) == 0);
    cmf_mask_info mi;
    cmf_mask_info_init(&mi);
    REQUIRE(cmf_mask_at(m, 0, &mi) == nullptr);
    CHECK(mi.ffn_rows == 4);
    CHECK(mi.layers == 2);
    CHECK(verify_problems(m).empty());
    cmf_close(m);
    // MoE expert fields: 10 experts -> 2 bytes per layer
    const Bytes moe_blob = {0x55, 0x55, 0xff, 0x00, 0x03, 0x03, 0x03, 0xff, 0x03, 0x01, 0x00};
    const std::string moe = R"(,"moe":{"num_experts":10,"top_k":2,"moe_intermediate_size":8})";
    REQUIRE(write_with(p, tiny_header(moe, ""), {mask("experts", moe_blob, true)}) == 0);
    REQUIRE(open_code(p, nullptr, &m) == 0);
    REQUIRE(cmf_mask_at(m, 0, &mi) == nullptr);
    CHECK(mi.has_expert_fields == 1);
    CHECK(mi.expert_row_bytes == 2);
    cmf_close(m);
    // expert tail bits (experts 10..15) must be zero: the writer refuses, the reader too
    Bytes bad_tail = moe_blob;
    bad_tail[8] = 0x07;
    CHECK(write_with(tmpdir() / "tail.cmf", tiny_header(moe, ""), {mask("experts", bad_tail, true)}) == CMF_ERR_INVALID_ARGUMENT);
    Bytes file = read_all(p);
    auto at = std::search(file.begin(), file.end(), moe_blob.begin(), moe_blob.end());
    REQUIRE(at != file.end());
    at[8] = 0x07;
    write_all(p, file);
    CHECK(open_code(p) == CMF_ERR_PARSE);
    // expert fields without moe: the writer refuses
    CHECK(write_with(p, tiny_header("", ""), {mask("x", moe_blob, true)}) == CMF_ERR_INVALID_ARGUMENT);
    // a skills record with base_dir_hash: SKILL_FILE; registry visible in info
    REQUIRE(write_with(p, tiny_header("", R"(,"skills":[{"id":"sql","base_dir_hash":"2f09a1ab4cb543ab"}])"), {}) == 0);
    CHECK(features_of(p) == (CMF_FEATURE_TENSOR_DIR | CMF_FEATURE_SKILL_FILE));
    REQUIRE(open_code(p, nullptr, &m) == 0);
    cmf_model_info info;
    cmf_model_info_init(&info);
    REQUIRE(cmf_model_get_info(m, &info) == nullptr);
    CHECK(info.skill_count == 1);
    CHECK(std::string(info.skills_json) == R"([{"id":"sql","layers":[],"base_dir_hash":"2f09a1ab4cb543ab"}])");
    cmf_close(m);
}

TEST_CASE("container: the writer refuses what the reader would refuse, leaving no file") {
    const fs::path p = tmpdir() / "refused.cmf";
    fs::remove(p);
    CHECK(write_with(p, tiny_header("", ""), {}, CMF_DTYPE_F16, 14) == CMF_ERR_BOUNDS);        // size != shape
    CHECK(write_with(p, tiny_header("", ""), {}, CMF_DTYPE_Q8_ROW, 16) == CMF_ERR_BOUNDS);  // size != q8_row rule
    CHECK(write_with(p, tiny_header("", ""), {}, 40, 16) == CMF_ERR_UNKNOWN_DTYPE);
    CHECK(write_with(p, R"({"version":2})", {}) == CMF_ERR_PARSE);
    CHECK(write_with(p, "not json", {}) == CMF_ERR_PARSE);
    CHECK(write_with(p, tiny_header("", ""), {mask("short", Bytes(3, 0))}) == CMF_ERR_INVALID_ARGUMENT);
    CHECK(!fs::exists(p));
    for (auto &e : fs::directory_iterator(tmpdir()))
        CHECK_MESSAGE(e.path().filename().string().find("refused.cmf.tmp") == std::string::npos, "temp file left: " << e.path());
}

#include "common/hash64.hpp"

TEST_CASE("container: verify splits large tensors into pieces and still matches hash64") {
    Bytes data(9u << 20 | 5);  // > 8 MiB piece size, odd tail
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 2654435761u >> 13);
    const uint64_t whole = cmf::hash64(data.data(), data.size());
    const size_t cut = 8u << 20;
    CHECK(cmf::hash64_finish(cmf::hash64_partial(data.data(), cut, 0) ^
                                 cmf::hash64_partial(data.data() + cut, data.size() - cut, cut / 8),
                             data.size()) == whole);
    const fs::path p = tmpdir() / "big.cmf";
    cmf_writer *w = nullptr;
    const std::string h = tiny_header("", "");
    REQUIRE(cmf_writer_create(runtime().rt, p.c_str(), h.data(), h.size(), nullptr, &w) == nullptr);
    const uint64_t shape[] = {(9u << 20) / 4};
    REQUIRE(cmf_writer_add_tensor(w, "big", CMF_DTYPE_F32, 1, shape, data.data(), shape[0] * 4) == nullptr);
    REQUIRE(cmf_writer_finish(w) == nullptr);
    cmf_writer_free(w);
    CHECK(open_and_verify(p) == "");
    Bytes b = read_all(p);
    b[b.size() - 3] ^= 1;  // inside the second piece
    write_all(p, b);
    CHECK(open_and_verify(p).find("tensor 'big': hash64 mismatch") == 0);
}

TEST_CASE("container: the W2 writer takes a payload in pieces and checks their total") {
    const fs::path base = tmpdir() / "w2pieces";
    fs::create_directories(base);
    auto &rt = *static_cast<cmf::Runtime *>(runtime().rt);
    const uint64_t shape[2] = {3, 5};
    std::vector<uint8_t> payload(30);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 37 + 1);
    {
        cmf::container::StreamWriter w(rt, (base / "p.cmf").string(), kSampleHeader, 4, 0, std::nullopt);
        w.add_tensor("model.norm.weight", CMF_DTYPE_F16, 1, shape + 1, payload.data(), 10);
        w.begin_tensor("model.layers.0.mlp.gate_proj.weight", CMF_DTYPE_F16, 2, shape, 30);
        CHECK_THROWS_WITH_AS(w.add_tensor("x", CMF_DTYPE_F16, 1, shape + 1, payload.data(), 10), doctest::Contains("still being written"),
                             cmf::Error);
        CHECK_THROWS_AS(w.finish(), cmf::Error);
        w.append(payload.data(), 1);
        w.append(payload.data() + 1, 7);
        CHECK_THROWS_WITH_AS(w.end_tensor(), doctest::Contains("8 bytes written of the announced 30"), cmf::Error);
        CHECK_THROWS_WITH_AS(w.append(payload.data(), 23), doctest::Contains("exceed"), cmf::Error);
        w.append(payload.data() + 8, 22);
        w.end_tensor();
        CHECK_THROWS_AS(w.append(payload.data(), 1), cmf::Error);
        // a variable-size dtype cannot be announced by size
        CHECK_THROWS_WITH_AS(w.begin_tensor("model.layers.0.mlp.up_proj.weight", CMF_DTYPE_Q1S, 2, shape, 30),
                             doctest::Contains("variable payload size"), cmf::Error);
    }
    CHECK(!fs::exists(base / "p.cmf"));  // never finished: nothing left
    {
        cmf::container::StreamWriter w(rt, (base / "p.cmf").string(), kSampleHeader, 4, 0, std::nullopt);
        w.begin_tensor("model.layers.0.mlp.gate_proj.weight", CMF_DTYPE_F16, 2, shape, 30);
        for (size_t i = 0; i < 30; i += 3) w.append(payload.data() + i, 3);
        w.end_tensor();
        w.finish();
    }
    CHECK(open_and_verify(base / "p.cmf") == "");  // verify recomputes every hash
    cmf_model *m = nullptr;
    REQUIRE(open_code(base / "p.cmf", nullptr, &m) == 0);
    cmf_tensor_info t;
    cmf_tensor_info_init(&t);
    REQUIRE(cmf_tensor(m, "model.layers.0.mlp.gate_proj.weight", &t) == nullptr);
    CHECK(std::memcmp(t.data, payload.data(), 30) == 0);
    cmf_close(m);
}

// ---- in-place rewrites (requant --in-place, patch-tensor) ------------------

#include "container/in_place.hpp"

namespace {
// The sample's first f16 tensor (any bits are a valid f16 payload): its
// record index, dtype and payload bytes.
struct First {
    uint64_t record;
    int32_t dtype;
    Bytes payload;
};
First first_tensor(const fs::path &p) {
    cmf_model *m = nullptr;
    REQUIRE(open_code(p, nullptr, &m) == 0);
    for (size_t i = 0; i < cmf_tensor_count(m); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        REQUIRE(cmf_tensor_at(m, i, &t) == nullptr);
        if (t.dtype != CMF_DTYPE_F16) continue;
        First f{i, t.dtype, Bytes(static_cast<const uint8_t *>(t.data), static_cast<const uint8_t *>(t.data) + t.nbytes)};
        cmf_close(m);
        return f;
    }
    cmf_close(m);
    FAIL("the sample has no f16 tensor");
    return {};
}
}  // namespace

TEST_CASE("container: an in-place rewrite leaves the old or the new file at every crash point") {
    const fs::path p = tmpdir() / "inplace.cmf";
    const First old = first_tensor(sample_path());
    Bytes next = old.payload;
    for (auto &b : next) b ^= 0x11;  // same size, same dtype, other bytes
    const std::vector<cmf::container::SlotPatch> patch{{old.record, old.dtype, next}};
    const std::string journal = cmf::container::journal_path(p.string());

    // Before the journal is renamed into place: the file is untouched and
    // the partial journal is dropped by the next open.
    fs::copy_file(sample_path(), p, fs::copy_options::overwrite_existing);
    run_and_kill_at("in-place-journal-written", [&] { cmf::container::rewrite_in_place(p.string(), patch); });
    CHECK(read_all(p) == read_all(sample_path()));
    CHECK(fs::exists(journal + ".tmp"));
    CHECK(open_and_verify(p) == "");
    CHECK_FALSE(fs::exists(journal + ".tmp"));
    CHECK(first_tensor(p).payload == old.payload);

    // After it: whatever part of the file was written, the next open
    // replays the journal and the file is the new one, hashes clean.
    for (const char *point : {"in-place-journal-committed", "in-place-first-write", "in-place-applied"}) {
        INFO(point);
        fs::copy_file(sample_path(), p, fs::copy_options::overwrite_existing);
        run_and_kill_at(point, [&] { cmf::container::rewrite_in_place(p.string(), patch); });
        CHECK(fs::exists(journal));
        CHECK(open_and_verify(p) == "");
        CHECK_FALSE(fs::exists(journal));
        CHECK(first_tensor(p).payload == next);
        CHECK(fs::file_size(p) == fs::file_size(sample_path()));
    }

    // A journal that does not belong to the file is refused, never applied.
    fs::copy_file(sample_path(), p, fs::copy_options::overwrite_existing);
    run_and_kill_at("in-place-journal-committed", [&] { cmf::container::rewrite_in_place(p.string(), patch); });
    const fs::path other = tmpdir() / "inplace-other.cmf";
    fs::copy_file(sample_path(), other, fs::copy_options::overwrite_existing);
    {
        Bytes b = read_all(other);
        b.push_back(0);  // another size
        write_all(other, b);
    }
    fs::rename(journal, cmf::container::journal_path(other.string()));
    std::string msg;
    CHECK(open_code(other, &msg) == CMF_ERR_PARSE);
    CHECK(msg.find("does not belong") != std::string::npos);
    fs::remove(cmf::container::journal_path(other.string()));

    // Undisturbed: new payload, new record, new directory hash, same length.
    fs::copy_file(sample_path(), p, fs::copy_options::overwrite_existing);
    cmf::container::rewrite_in_place(p.string(), patch);
    CHECK(open_and_verify(p) == "");
    CHECK(first_tensor(p).payload == next);
    CHECK_FALSE(fs::exists(journal));
    // A payload larger than its slot is refused before anything is written.
    Bytes big(old.payload.size() + 1, 0);
    const Bytes before = read_all(p);
    CHECK_THROWS_WITH_AS(cmf::container::rewrite_in_place(p.string(), {{old.record, old.dtype, big}}), doctest::Contains("does not fit its"),
                         cmf::Error);
    CHECK_THROWS_WITH_AS(cmf::container::rewrite_in_place(p.string(), {{999, old.dtype, next}}), doctest::Contains("outside the directory"),
                         cmf::Error);
    CHECK(read_all(p) == before);
}

#include "common/file_mappings.hpp"
#include "container/mapped_file.hpp"

namespace {
// Resident KiB of the mapping that starts at `p` (/proc/self/smaps).
long mapping_rss_kib(const void *p) {
    std::ifstream f("/proc/self/smaps");
    std::string line;
    bool in = false;
    while (std::getline(f, line)) {
        unsigned long a = 0, b = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx", &a, &b) == 2) {  // a mapping's first line
            in = a == reinterpret_cast<uintptr_t>(p);
            continue;
        }
        long kib = 0;
        if (in && std::sscanf(line.c_str(), "Rss: %ld kB", &kib) == 1) return kib;
    }
    return -1;
}
}  // namespace

TEST_CASE("container: release_pages drops a mapped model file's pages and leaves other memory alone") {
    // The host's release_pages (cmf_host_api) is what a backend calls after
    // copying a weight; the registry knows which ranges are file mappings.
    const fs::path p = tmpdir() / "release-pages.bin";
    const long page = ::sysconf(_SC_PAGESIZE);
    Bytes want(size_t(1) << 20);
    for (size_t i = 0; i < want.size(); ++i) want[i] = uint8_t(i * 7 + (i >> 12));
    write_all(p, want);
    TestRuntime t;
    const cmf_host_api *host = t.rt->host_api();
    REQUIRE(host->struct_size >= offsetof(cmf_host_api, release_pages) + sizeof(void *));
    REQUIRE((host->release_pages != nullptr));
    {
        cmf::container::MappedFile f(p.string(), true);
        REQUIRE(f.mapped());
        volatile uint64_t sum = 0;
        for (size_t i = 0; i < f.size(); i += size_t(page)) sum = sum + f.data()[i];  // every page resident
        const long before = mapping_rss_kib(f.data());
        REQUIRE(before >= 1024);
        // A range from the middle of one page to the middle of another: the
        // whole pages inside it go, the partial ones stay.
        host->release_pages(host->host_ctx, f.data() + page / 2, 64 * uint64_t(page));
        const long after = mapping_rss_kib(f.data());
        CHECK(after <= before - 63 * page / 1024);
        CHECK(after > 0);
        // Read again: the file's bytes.
        CHECK(std::memcmp(f.data(), want.data(), want.size()) == 0);
        // A range that runs past the mapping's end: nothing.
        const long full = mapping_rss_kib(f.data());
        host->release_pages(host->host_ctx, f.data() + f.size() - 8 * uint64_t(page), 16 * uint64_t(page));
        CHECK(mapping_rss_kib(f.data()) == full);
    }
    // Anonymous memory (a vector, a weight an arch made itself) keeps its
    // bytes: DONTNEED would have zeroed them.
    Bytes anon = want;
    host->release_pages(host->host_ctx, anon.data(), anon.size());
    CHECK(anon == want);
    // After the file is closed its range is no longer a mapping of ours.
    CHECK_FALSE(cmf::file_mappings::release_pages(anon.data(), anon.size()));
}
