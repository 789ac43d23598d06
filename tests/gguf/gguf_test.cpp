// The GGUF reader: one crafted file per rule (each class of the parser bugs
// GGUF readers have had: overflowing counts, huge lengths, bad ndim,
// alignment 0, out-of-range offsets, duplicate names, overlapping tensors),
// every truncation of a valid file, and the dequantizers bit for bit
// against the reference decoders of tests/gguf/gguf_tool.py.
#include "convert/gguf.hpp"
#include "convert/gguf_import.hpp"
#include "convert/gguf_tokenizer.hpp"
#include "convert/source_tensor.hpp"
#include "common/error.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace cmf::convert;
namespace g = cmf::convert::gguf;

namespace {

// A GGUF image built field by field.
struct Img {
    std::vector<uint8_t> b;
    Img &raw(const void *p, size_t n) {
        const size_t at = b.size();
        b.resize(at + n);
        if (n) std::memcpy(b.data() + at, p, n);
        return *this;
    }
    Img &u32(uint32_t v) { return raw(&v, 4); }
    Img &u64(uint64_t v) { return raw(&v, 8); }
    Img &str(const std::string &s) { return u64(s.size()).raw(s.data(), s.size()); }
    Img &kv_u32(const std::string &k, uint32_t v) { return str(k).u32(g::U32).u32(v); }
    Img &kv_str(const std::string &k, const std::string &v) { return str(k).u32(g::STRING).str(v); }
    Img &tensor(const std::string &name, std::vector<uint64_t> dims, uint32_t type, uint64_t off) {
        str(name).u32(static_cast<uint32_t>(dims.size()));
        for (uint64_t d : dims) u64(d);
        return u32(type).u64(off);
    }
    Img &pad(size_t align = 32) {
        while (b.size() % align) b.push_back(0);
        return *this;
    }
    Img &zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
};

Img head(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    Img i;
    i.raw("GGUF", 4).u32(version).u64(tensors).u64(kvs);
    return i;
}

// A valid file: 2 keys, an F32 [8] and a Q8_0 [32, 2] tensor.
Img valid() {
    Img i = head(2, 2);
    i.kv_str("general.architecture", "qwen3").kv_u32("general.alignment", 32);
    i.tensor("a", {8}, g::F32, 0).tensor("b", {32, 2}, g::Q8_0, 32);
    i.pad();
    i.zeros(32 + 68);
    return i;
}

// The error a parse gives ("" = none).
struct Outcome {
    int32_t code = 0;
    std::string msg;
};
Outcome parse(const Img &i) {
    try {
        g::File f(i.b.data(), i.b.size(), "t.gguf");
        return {};
    } catch (const cmf::Error &e) {
        return {e.code(), e.message()};
    }
}

void expect_error(const Img &i, int32_t code, const std::string &needle) {
    Outcome o = parse(i);
    INFO("message: " << o.msg);
    CHECK(o.code == code);
    CHECK(o.msg.find(needle) != std::string::npos);
}

std::vector<uint8_t> slurp(const std::string &p) {
    std::ifstream f(p, std::ios::binary);
    REQUIRE(f);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("gguf reader: a valid file, its metadata and tensors") {
    Img i = valid();
    g::File f(i.b.data(), i.b.size(), "t.gguf");
    CHECK(f.version() == 3);
    CHECK(f.alignment() == 32);
    CHECK(f.get_str("general.architecture") == "qwen3");
    CHECK(f.get_u64("general.alignment") == 32u);
    REQUIRE(f.tensors().size() == 2);
    CHECK(f.find("b")->nbytes == 68);
    CHECK(f.find("b")->elements == 64);
    CHECK(f.find("b")->data == i.b.data() + f.data_offset() + 32);
    // a present key of another type is an error, not a silent default
    CHECK_THROWS_WITH_AS(f.get_u64("general.architecture"), doctest::Contains("is a string, expected an integer"), cmf::Error);
    // version 2 reads the same way
    Img v2 = valid();
    v2.b[4] = 2;
    CHECK(parse(v2).code == 0);
}

TEST_CASE("gguf reader: magic, version and byte order") {
    Img i = valid();
    i.b[0] = 'X';
    expect_error(i, CMF_ERR_INVALID_MAGIC, "not a GGUF file");
    expect_error(head(0, 0, 1), CMF_ERR_UNSUPPORTED_VERSION, "version 1 is not supported");
    expect_error(head(0, 0, 4), CMF_ERR_UNSUPPORTED_VERSION, "version 4 is not supported");
    expect_error(head(0, 0, 0x03000000), CMF_ERR_UNSUPPORTED_VERSION, "big-endian");
    Img empty;
    expect_error(empty, CMF_ERR_INVALID_MAGIC, "not a GGUF file");
}

TEST_CASE("gguf reader: counts that cannot fit are refused before any allocation") {
    expect_error(head(UINT64_MAX, 0), CMF_ERR_PARSE, "tensor count 18446744073709551615 cannot fit");
    expect_error(head(0, UINT64_MAX), CMF_ERR_PARSE, "metadata count 18446744073709551615 cannot fit");
    expect_error(head(1u << 30, 0), CMF_ERR_PARSE, "cannot fit");
    // an array count whose byte size overflows 64 bits
    Img a = head(0, 1);
    a.str("k").u32(g::ARRAY).u32(g::U64).u64(UINT64_MAX / 4);
    expect_error(a, CMF_ERR_BOUNDS, "cannot fit");
    Img s = head(0, 1);
    s.str("k").u32(g::ARRAY).u32(g::STRING).u64(1u << 20);
    expect_error(s, CMF_ERR_BOUNDS, "cannot fit");
}

TEST_CASE("gguf reader: string lengths past the end of the file") {
    Img k = head(0, 1);
    k.u64(UINT64_MAX).raw("abc", 3).zeros(16);
    expect_error(k, CMF_ERR_BOUNDS, "a metadata key claims 18446744073709551615 bytes");
    Img v = head(0, 1);
    v.str("k").u32(g::STRING).u64(1u << 31);
    expect_error(v, CMF_ERR_BOUNDS, "claims 2147483648 bytes");
    Img n = head(1, 0);
    n.u64(~0ull - 7).zeros(40);
    expect_error(n, CMF_ERR_BOUNDS, "a tensor name claims");
    Img longname = head(1, 0);
    longname.tensor(std::string(65, 'x'), {1}, g::F32, 0).pad().zeros(32);
    expect_error(longname, CMF_ERR_PARSE, "at most 64 are allowed");
}

TEST_CASE("gguf reader: value types, bools, nesting and duplicate keys") {
    Img t = head(0, 1);
    t.str("k").u32(13).u32(0);
    expect_error(t, CMF_ERR_PARSE, "unknown value type 13");
    Img b = head(0, 1);
    b.str("k").u32(g::BOOL).raw("\x02", 1);
    expect_error(b, CMF_ERR_PARSE, "bool value 2 is neither 0 nor 1");
    Img nest = head(0, 1);
    nest.str("k").u32(g::ARRAY).u32(g::ARRAY).u64(1).u32(g::U8).u64(0);
    expect_error(nest, CMF_ERR_PARSE, "nested arrays are not supported");
    Img et = head(0, 1);
    et.str("k").u32(g::ARRAY).u32(99).u64(1);
    expect_error(et, CMF_ERR_PARSE, "unknown array element type 99");
    Img dup = head(0, 2);
    dup.kv_u32("k", 1).kv_u32("k", 2);
    expect_error(dup, CMF_ERR_PARSE, "duplicate metadata key \"k\"");
    Img empty = head(0, 1);
    empty.str("").u32(g::U8).raw("\0", 1);
    expect_error(empty, CMF_ERR_PARSE, "is empty");
}

TEST_CASE("gguf reader: alignment must be a u32 power of two") {
    for (uint32_t a : {0u, 3u, 48u}) {
        Img i = head(0, 1);
        i.kv_u32("general.alignment", a);
        expect_error(i, CMF_ERR_PARSE, "is not a power of two");
    }
    Img wrong = head(0, 1);
    wrong.str("general.alignment").u32(g::U64).u64(32);
    expect_error(wrong, CMF_ERR_PARSE, "general.alignment is a u64, not a u32");
    // A larger alignment is honoured: the data section moves to it.
    Img big = head(1, 1);
    big.kv_u32("general.alignment", 256).tensor("a", {8}, g::F32, 0).pad(256).zeros(32);
    g::File f(big.b.data(), big.b.size(), "t.gguf");
    CHECK(f.data_offset() == 256);
    Img unaligned = head(1, 1);
    unaligned.kv_u32("general.alignment", 64).tensor("a", {8}, g::F32, 32).pad(64).zeros(64);
    expect_error(unaligned, CMF_ERR_BOUNDS, "offset 32 is not a multiple of the alignment 64");
}

TEST_CASE("gguf reader: dimensions and types") {
    auto one = [](std::vector<uint64_t> dims, uint32_t type) {
        Img i = head(1, 0);
        i.tensor("t", dims, type, 0).pad().zeros(64);
        return i;
    };
    expect_error(one({}, g::F32), CMF_ERR_PARSE, "0 dimensions; GGUF tensors have 1 to 4");
    expect_error(one({1, 1, 1, 1, 1}, g::F32), CMF_ERR_PARSE, "5 dimensions");
    Img huge_nd = head(1, 0);
    huge_nd.str("t").u32(0xFFFFFFFFu).zeros(64);
    expect_error(huge_nd, CMF_ERR_PARSE, "4294967295 dimensions");
    expect_error(one({8, 0}, g::F32), CMF_ERR_PARSE, "dimension 1 is 0");
    expect_error(one({1ull << 32, 1ull << 32}, g::F32), CMF_ERR_BOUNDS, "overflows 63 bits");
    expect_error(one({1ull << 63}, g::F32), CMF_ERR_BOUNDS, "overflows 63 bits");
    expect_error(one({8}, 4), CMF_ERR_PARSE, "unknown GGUF tensor type 4");
    expect_error(one({8}, 1000), CMF_ERR_PARSE, "unknown GGUF tensor type 1000");
    expect_error(one({48}, g::Q4_K), CMF_ERR_PARSE, "a row of 48 values is not a whole number of Q4_K blocks (256 values each)");
}

TEST_CASE("gguf reader: offsets and extents") {
    Img past = head(1, 0);
    past.tensor("t", {8}, g::F32, 32).pad().zeros(32);  // [32, 64) of a 32-byte data section
    expect_error(past, CMF_ERR_BOUNDS, "ends past the data section's 32 bytes");
    Img wrap = head(1, 0);
    wrap.tensor("t", {8}, g::F32, ~0ull - 31).pad().zeros(32);
    expect_error(wrap, CMF_ERR_BOUNDS, "ends past the data section");
    Img dup = head(2, 0);
    dup.tensor("t", {8}, g::F32, 0).tensor("t", {8}, g::F32, 32).pad().zeros(64);
    expect_error(dup, CMF_ERR_PARSE, "duplicate tensor name \"t\"");
    Img overlap = head(2, 0);
    overlap.tensor("a", {16}, g::F32, 0).tensor("b", {8}, g::F32, 32).pad().zeros(64);
    expect_error(overlap, CMF_ERR_BOUNDS, "tensors \"a\" and \"b\" overlap");
    Img same = head(2, 0);
    same.tensor("a", {8}, g::F32, 0).tensor("b", {8}, g::F32, 0).pad().zeros(32);
    expect_error(same, CMF_ERR_BOUNDS, "overlap");
    // The padding before the data section must be there.
    Img nopad = head(1, 0);
    nopad.tensor("t", {1}, g::F32, 0);
    expect_error(nopad, CMF_ERR_BOUNDS, "truncated");
}

TEST_CASE("gguf reader: every truncation of a valid file is an error, never a crash") {
    const Img full = valid();
    CHECK(parse(full).code == 0);
    for (size_t n = 0; n < full.b.size(); ++n) {
        Img cut;
        cut.b.assign(full.b.begin(), full.b.begin() + static_cast<long>(n));
        INFO("prefix of " << n << " bytes");
        CHECK(parse(cut).code != 0);
    }
}

TEST_CASE("gguf dequantizers: bit for bit the reference decoders of every type") {
    const std::string dir = CMF_TEST_GGUF_BLOCKS_DIR;
    simdjson::dom::parser p;
    simdjson::dom::object index = p.load(dir + "/index.json").get_object();
    size_t types = 0;
    for (auto [name, info] : index) {
        const uint32_t type = static_cast<uint32_t>(uint64_t(info["type"]));
        const uint64_t n = uint64_t(info["values"]);
        const std::vector<uint8_t> payload = slurp(dir + "/" + std::string(name) + ".bin");
        const std::vector<uint8_t> want = slurp(dir + "/" + std::string(name) + ".f32");
        REQUIRE(want.size() == n * 4);
        const g::TypeInfo *ti = g::type_info(type);
        REQUIRE(ti);
        REQUIRE(payload.size() == n / ti->elems * ti->bytes);
        std::vector<float> got(n);
        g::dequantize(type, payload.data(), n, got.data());
        INFO(std::string(name));
        CHECK(std::memcmp(got.data(), want.data(), n * 4) == 0);
        // Element ranges that start and end inside blocks (the converter's
        // row chunks) give the same values.
        SourceTensor t;
        t.name = std::string(name);
        t.dtype = type == g::F32 ? SourceDtype::F32 : type == g::F16 ? SourceDtype::F16 : type == g::BF16 ? SourceDtype::BF16 : SourceDtype::Ggml;
        t.ggml_type = type;
        t.data = payload.data();
        t.nbytes = payload.size();
        t.elements = n;
        const uint64_t first = ti->elems > 1 ? ti->elems / 2 + 3 : 5, count = n - first - 7;
        std::vector<float> part(count);
        read_f32(t, first, count, part.data());
        CHECK(std::memcmp(part.data(), got.data() + first, count * 4) == 0);
        ++types;
    }
    CHECK(types == 13);
}

TEST_CASE("gguf dequantizers: the other types are refused by name") {
    float out[256];
    uint8_t zero[512] = {};
    CHECK_THROWS_WITH_AS(g::dequantize(g::IQ2_XXS, zero, 256, out), "unsupported GGUF type IQ2_XXS", cmf::Error);
    CHECK_THROWS_WITH_AS(g::dequantize(g::IQ4_NL, zero, 32, out), "unsupported GGUF type IQ4_NL", cmf::Error);
    CHECK_THROWS_WITH_AS(g::dequantize(g::Q8_K, zero, 256, out), "unsupported GGUF type Q8_K", cmf::Error);
    CHECK_THROWS_WITH_AS(g::dequantize(77, zero, 1, out), "unsupported GGUF type type 77", cmf::Error);
    CHECK(g::nearest_quant(g::Q6_K) == "q8");
    CHECK(g::nearest_quant(g::Q4_K) == "q4tp");
    CHECK(g::nearest_quant(g::BF16) == "bf16");
    CHECK_THROWS_AS(g::nearest_quant(g::IQ1_S), cmf::Error);
}

TEST_CASE("gguf import: llama.cpp tensor names back to Hugging Face's") {
    CHECK(g::hf_name("qwen3", "token_embd.weight") == "model.embed_tokens.weight");
    CHECK(g::hf_name("qwen3", "output.weight") == "lm_head.weight");
    CHECK(g::hf_name("qwen3", "output_norm.weight") == "model.norm.weight");
    CHECK(g::hf_name("qwen3", "rope_freqs.weight").empty());
    CHECK(g::hf_name("qwen2", "blk.11.attn_q.bias") == "model.layers.11.self_attn.q_proj.bias");
    CHECK(g::hf_name("qwen3", "blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight");
    CHECK(g::hf_name("gemma", "blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight");
    CHECK(g::hf_name("gemma2", "blk.0.ffn_norm.weight") == "model.layers.0.pre_feedforward_layernorm.weight");
    CHECK(g::hf_name("gemma3", "blk.3.post_attention_norm.weight") == "model.layers.3.post_attention_layernorm.weight");
    CHECK(g::hf_name("gemma3", "blk.3.post_ffw_norm.weight") == "model.layers.3.post_feedforward_layernorm.weight");
    CHECK(g::hf_name("qwen3moe", "blk.2.ffn_up_exps.weight") == "model.layers.2.mlp.experts.{}.up_proj.weight");
    CHECK(g::hf_name("qwen2moe", "blk.2.ffn_gate_inp_shexp.weight") == "model.layers.2.mlp.shared_expert_gate.weight");
    CHECK_THROWS_WITH_AS(g::hf_name("qwen3", "blk.0.ssm_conv1d.weight"), doctest::Contains("has no Hugging Face counterpart"), cmf::Error);
    CHECK_THROWS_AS(g::hf_name("qwen3", "blk.x.attn_q.weight"), cmf::Error);
    CHECK_THROWS_AS(g::hf_name("qwen3", "blk..attn_q.weight"), cmf::Error);
}

TEST_CASE("gguf import: metadata -> HF config, and what is refused") {
    Img i = head(0, 10);
    i.kv_str("general.architecture", "gemma2").kv_u32("gemma2.vocab_size", 128).kv_u32("gemma2.embedding_length", 64).kv_u32("gemma2.block_count", 4);
    i.kv_u32("gemma2.attention.head_count", 4).kv_u32("gemma2.attention.head_count_kv", 2).kv_u32("gemma2.attention.key_length", 32);
    i.kv_u32("gemma2.feed_forward_length", 128).kv_u32("gemma2.context_length", 256).kv_u32("gemma2.attention.sliding_window", 4);
    g::File f(i.b.data(), i.b.size(), "t.gguf");
    simdjson::dom::parser p;
    const std::string cfg = g::hf_config(f);
    simdjson::dom::element c = p.parse(cfg);
    CHECK(std::string_view(c["model_type"]) == "gemma2");
    CHECK(uint64_t(c["head_dim"]) == 32);
    CHECK(double(c["query_pre_attn_scalar"]) == 32.0);  // llama.cpp's rule without attention.scale: head_dim
    CHECK(bool(c["tie_word_embeddings"]) == true);      // no output.weight
    CHECK(std::string_view(c["hidden_activation"]) == "gelu_pytorch_tanh");

    Img next = head(0, 1);
    next.kv_str("general.architecture", "qwen3next");
    g::File fn(next.b.data(), next.b.size(), "t.gguf");
    CHECK_THROWS_WITH_AS(g::hf_config(fn), doctest::Contains("linear-attention hybrid"), cmf::Error);
    Img llama = head(0, 1);
    llama.kv_str("general.architecture", "llama");
    g::File fl(llama.b.data(), llama.b.size(), "t.gguf");
    CHECK_THROWS_WITH_AS(g::hf_config(fl), doctest::Contains("\"llama\" is not imported from GGUF"), cmf::Error);
    Img missing = head(0, 1);
    missing.kv_str("general.architecture", "qwen3");
    g::File fm(missing.b.data(), missing.b.size(), "t.gguf");
    CHECK_THROWS_WITH_AS(g::hf_config(fm), doctest::Contains("missing metadata key qwen3.embedding_length"), cmf::Error);
}

TEST_CASE("gguf import: tokenizer metadata that cannot be rebuilt is refused by name") {
    auto tok = [](const std::string &model, const std::string &pre, uint32_t type0) {
        Img i = head(0, 4);
        i.kv_str("tokenizer.ggml.model", model).kv_str("tokenizer.ggml.pre", pre);
        i.str("tokenizer.ggml.tokens").u32(g::ARRAY).u32(g::STRING).u64(2).str("a").str("b");
        i.str("tokenizer.ggml.token_type").u32(g::ARRAY).u32(g::I32v).u64(2).u32(type0).u32(1);
        return i;
    };
    Img ok = tok("gpt2", "qwen2", 1);
    g::File f(ok.b.data(), ok.b.size(), "t.gguf");
    GgufTokenizer t = build_gguf_tokenizer(f);
    CHECK(t.tokenizer_json.find("\"NFC\"") != std::string::npos);
    CHECK(t.tokenizer_config_json == R"({"eos_token_ids":[],"bos_token_id":null,"pad_token_id":null})");
    Img spm = tok("llama", "default", 1);
    g::File fs(spm.b.data(), spm.b.size(), "t.gguf");
    CHECK_THROWS_WITH_AS(build_gguf_tokenizer(fs), doctest::Contains("there are no tokenizer.ggml.scores"), cmf::Error);
    Img other = tok("bert", "default", 1);
    g::File fo(other.b.data(), other.b.size(), "t.gguf");
    CHECK_THROWS_WITH_AS(build_gguf_tokenizer(fo), doctest::Contains("tokenizer.ggml.model \"bert\""), cmf::Error);
    Img pre = tok("gpt2", "llama-bpe", 1);
    g::File fp(pre.b.data(), pre.b.size(), "t.gguf");
    CHECK_THROWS_WITH_AS(build_gguf_tokenizer(fp), doctest::Contains("tokenizer.ggml.pre \"llama-bpe\""), cmf::Error);
    Img badtype = tok("gpt2", "qwen2", 9);
    g::File fb(badtype.b.data(), badtype.b.size(), "t.gguf");
    CHECK_THROWS_WITH_AS(build_gguf_tokenizer(fb), doctest::Contains("is 9, not a llama.cpp token type"), cmf::Error);
}
