// The arch plugins' converter hooks, called directly: HF config -> arch
// block per family (expected blocks written by hand from the original
// converter's rules, docs/convert.md, for the tiny configs of
// tests/models/gen_tiny_models.py), and tensor plans (renames, fused splits, experts).
#include <doctest/doctest.h>

#include "gemma/hf_import.hpp"
#include "qwen/hf_import.hpp"

#include <fstream>
#include <sstream>
#include <string>

using namespace cmf::archs;

namespace {

std::string slurp(const std::string &path) {
    std::ifstream in(path);
    REQUIRE_MESSAGE(in.good(), "missing fixture " << path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}
std::string config_of(const std::string &model) { return slurp(std::string(CMF_TEST_MODELS_DIR) + "/" + model + "/config.json"); }

const char *kNoLinear = R"("linear_conv_kernel_dim":null,"linear_num_key_heads":null,"linear_num_value_heads":null)";

std::string plan(const std::string &arch, const std::string &name, Shape s, bool gemma = false) {
    ArchView a = parse_arch(arch);
    return plan_to_json(gemma ? gemma::import_tensor(a, name, s) : qwen::import_tensor(a, name, s));
}

}  // namespace

TEST_CASE("hf import: config -> arch block per family") {
    SUBCASE("qwen2: tied, implicit head_dim") {
        CHECK(qwen::import_config(config_of("qwen2")) ==
              std::string(R"({"arch_name":"qwen2","hidden_size":64,"intermediate_size":128,"num_layers":2,"num_attention_heads":4,)"
                          R"("num_kv_heads":2,"head_dim":16,"vocab_size":128,"layer_types":["FullAttention","FullAttention"],)"
                          R"("rms_norm_eps":1e-6,"norm_style":"qwen","rope_theta":10000.0,"tie_word_embeddings":true,)"
                          R"("partial_rotary_factor":1.0,"max_position_embeddings":256,)") + kNoLinear + "}");
    }
    SUBCASE("qwen3: explicit head_dim, untied") {
        CHECK(qwen::import_config(config_of("qwen3")) ==
              std::string(R"({"arch_name":"qwen3","hidden_size":64,"intermediate_size":128,"num_layers":2,"num_attention_heads":4,)"
                          R"("num_kv_heads":2,"head_dim":32,"vocab_size":128,"layer_types":["FullAttention","FullAttention"],)"
                          R"("rms_norm_eps":1e-6,"norm_style":"qwen","rope_theta":1000000.0,"tie_word_embeddings":false,)"
                          R"("partial_rotary_factor":1.0,"max_position_embeddings":256,)") + kNoLinear + "}");
    }
    SUBCASE("qwen2_moe: shared expert, no renorm") {
        CHECK(qwen::import_config(config_of("qwen2_moe")) ==
              std::string(R"({"arch_name":"qwen2_moe","hidden_size":64,"intermediate_size":96,"num_layers":4,"num_attention_heads":4,)"
                          R"("num_kv_heads":2,"head_dim":16,"vocab_size":128,"layer_types":["FullAttention","FullAttention","FullAttention","FullAttention"],)"
                          R"("rms_norm_eps":1e-6,"norm_style":"qwen","rope_theta":10000.0,"tie_word_embeddings":false,)"
                          R"("partial_rotary_factor":1.0,"moe":{"num_experts":8,"top_k":2,"moe_intermediate_size":48,"norm_topk_prob":false,)"
                          R"("shared_expert_intermediate_size":80},"max_position_embeddings":256,)") + kNoLinear + "}");
    }
    SUBCASE("qwen3_moe") {
        CHECK(qwen::import_config(config_of("qwen3_moe")) ==
              std::string(R"({"arch_name":"qwen3_moe","hidden_size":64,"intermediate_size":96,"num_layers":4,"num_attention_heads":4,)"
                          R"("num_kv_heads":2,"head_dim":16,"vocab_size":128,"layer_types":["FullAttention","FullAttention","FullAttention","FullAttention"],)"
                          R"("rms_norm_eps":1e-6,"norm_style":"qwen","rope_theta":10000.0,"tie_word_embeddings":false,)"
                          R"("partial_rotary_factor":1.0,"moe":{"num_experts":8,"top_k":2,"moe_intermediate_size":48,"norm_topk_prob":true},)"
                          R"("max_position_embeddings":256,)") + kNoLinear + "}");
    }
    SUBCASE("qwen3_next: the full arch block, in declaration order") {
        CHECK(qwen::import_config(config_of("qwen3_next")) ==
              R"({"arch_name":"qwen3_next","hidden_size":64,"intermediate_size":96,"num_layers":4,"num_attention_heads":4,)"
              R"("num_kv_heads":2,"head_dim":16,"vocab_size":128,"layer_types":["LinearAttention","FullAttention","LinearAttention","FullAttention"],)"
              R"("rms_norm_eps":1e-6,"norm_style":"gemma","rope_theta":10000.0,"tie_word_embeddings":false,"partial_rotary_factor":0.25,)"
              R"("moe":{"num_experts":8,"top_k":2,"moe_intermediate_size":48,"norm_topk_prob":true,"shared_expert_intermediate_size":80},)"
              R"("linear_core":{"kind":"gated_delta_net","num_heads":6,"value_head_dim":8},"max_position_embeddings":256,)"
              R"("linear_conv_kernel_dim":4,"linear_num_key_heads":2,"linear_num_value_heads":6,"linear_key_head_dim":16,"linear_value_head_dim":8})");
    }
    SUBCASE("qwen3_5 wrapper + MTP: text_config, rope_parameters, mtp block") {
        CHECK(qwen::import_config(config_of("qwen3_5")) ==
              R"({"arch_name":"qwen3_5","hidden_size":64,"intermediate_size":128,"num_layers":4,"num_attention_heads":4,)"
              R"("num_kv_heads":2,"head_dim":32,"vocab_size":128,"layer_types":["LinearAttention","LinearAttention","LinearAttention","FullAttention"],)"
              R"("rms_norm_eps":1e-6,"norm_style":"gemma","rope_theta":10000000.0,"tie_word_embeddings":false,"partial_rotary_factor":0.25,)"
              R"("mtp":{"num_layers":1,"share_lm_head":true,"share_embed":true},)"
              R"("linear_core":{"kind":"gated_delta_net","num_heads":6,"value_head_dim":16},"max_position_embeddings":256,)"
              R"("linear_conv_kernel_dim":4,"linear_num_key_heads":2,"linear_num_value_heads":6,"linear_key_head_dim":16,"linear_value_head_dim":16})");
    }
    SUBCASE("gemma: sqrt(96) multiplier as f32, gelu_tanh, tied by default") {
        CHECK(gemma::import_config(config_of("gemma")) ==
              std::string(R"({"arch_name":"gemma","hidden_size":96,"intermediate_size":192,"num_layers":2,"num_attention_heads":4,)"
                          R"("num_kv_heads":1,"head_dim":32,"vocab_size":128,"layer_types":["FullAttention","FullAttention"],)"
                          R"("rms_norm_eps":1e-6,"norm_style":"gemma","rope_theta":10000.0,"tie_word_embeddings":true,)"
                          R"("partial_rotary_factor":1.0,"hidden_act":"gelu_tanh","embed_multiplier":9.797959,"max_position_embeddings":256,)") +
                  kNoLinear + "}");
    }
    SUBCASE("gemma2: the Gemma extras") {
        CHECK(gemma::import_config(config_of("gemma2")) ==
              std::string(R"({"arch_name":"gemma2","hidden_size":64,"intermediate_size":128,"num_layers":4,"num_attention_heads":4,)"
                          R"("num_kv_heads":2,"head_dim":32,"vocab_size":128,"layer_types":["FullAttention","FullAttention","FullAttention","FullAttention"],)"
                          R"("rms_norm_eps":1e-6,"norm_style":"gemma","rope_theta":10000.0,"tie_word_embeddings":true,)"
                          R"("partial_rotary_factor":1.0,"hidden_act":"gelu_tanh","embed_multiplier":8.0,"query_pre_attn_scalar":24.0,)"
                          R"("sliding_window":4,"sliding_window_pattern":2,"final_logit_softcapping":2.0,"attn_logit_softcapping":1.0,)"
                          R"("max_position_embeddings":256,)") + kNoLinear + "}");
    }
    SUBCASE("gemma3 wrapper: text_config, sliding tags, local base, null softcaps omitted") {
        CHECK(gemma::import_config(config_of("gemma3")) ==
              std::string(R"({"arch_name":"gemma3","hidden_size":64,"intermediate_size":128,"num_layers":6,"num_attention_heads":4,)"
                          R"("num_kv_heads":2,"head_dim":32,"vocab_size":128,"layer_types":["SlidingAttention","SlidingAttention","FullAttention",)"
                          R"("SlidingAttention","SlidingAttention","FullAttention"],"rms_norm_eps":1e-6,"norm_style":"gemma","rope_theta":1000000.0,)"
                          R"("tie_word_embeddings":true,"partial_rotary_factor":1.0,"rope_scaling":{"rope_type":"linear","factor":8.0},)"
                          R"("hidden_act":"gelu_tanh","embed_multiplier":8.0,"query_pre_attn_scalar":32.0,"sliding_window":4,"sliding_window_pattern":3,"rope_local_base_freq":10000.0,)"
                          R"("max_position_embeddings":256,)") + kNoLinear + "}");
    }
}

TEST_CASE("hf import: config errors") {
    CHECK_THROWS_WITH_AS(qwen::import_config(R"({"model_type":"llama","hidden_size":8})"), doctest::Contains("not a Qwen model"), cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(gemma::import_config(R"({"model_type":"qwen3"})"), doctest::Contains("not a Gemma model"), cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(qwen::import_config("{nope"), doctest::Contains("not valid JSON"), cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(qwen::import_config(R"({"model_type":"qwen3","num_hidden_layers":2})"),
                         doctest::Contains("missing required key hidden_size"), cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(qwen::import_config(R"({"model_type":"qwen3","hidden_size":"64","num_hidden_layers":2})"),
                         doctest::Contains(R"(config.json: hidden_size = "64": must be a non-negative integer)"), cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(
        qwen::import_config(R"({"model_type":"qwen3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":8,)"
                            R"("intermediate_size":8,"max_position_embeddings":8,"layer_types":["full_attention"]})"),
        doctest::Contains("layer_types has 1 entries but num_hidden_layers is 2"), cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(
        qwen::import_config(R"({"model_type":"qwen3_next","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":8,)"
                            R"("intermediate_size":8,"max_position_embeddings":8,"layer_types":["linear_attention","full_attention"]})"),
        doctest::Contains("linear_attention layers but"), cmf::sdk::Error);
    // A corrupt layer count is refused before a per-layer list of that length is built.
    CHECK_THROWS_WITH_AS(
        qwen::import_config(R"({"model_type":"qwen3","hidden_size":64,"num_hidden_layers":1000000000000,"num_attention_heads":4,)"
                            R"("vocab_size":8,"intermediate_size":8,"max_position_embeddings":8})"),
        doctest::Contains("num_hidden_layers 1000000000000 is beyond 65536"), cmf::sdk::Error);
    // Without layer_types a hybrid's schedule comes from full_attention_interval (default 4).
    std::string a = qwen::import_config(
        R"({"model_type":"qwen3_next","hidden_size":64,"num_hidden_layers":4,"num_attention_heads":4,"vocab_size":8,"intermediate_size":8,)"
        R"("max_position_embeddings":8,"linear_conv_kernel_dim":4,"linear_num_key_heads":1,"linear_num_value_heads":2,"linear_key_head_dim":4,"linear_value_head_dim":4})");
    CHECK(a.find(R"("layer_types":["LinearAttention","LinearAttention","LinearAttention","FullAttention"])") != std::string::npos);
    // yarn rope parameters and rope_scaling's native window.
    std::string y = qwen::import_config(
        R"({"model_type":"qwen3","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,"vocab_size":8,"intermediate_size":8,)"
        R"("max_position_embeddings":131072,"rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768},)"
        R"("rope_parameters":{"rope_type":"yarn","rope_theta":1000000,"factor":4.0,"original_max_position_embeddings":32768}})");
    CHECK(y.find(R"("rope_theta":1000000.0)") != std::string::npos);
    CHECK(y.find(R"("yarn":{"factor":4.0,"original_max_position_embeddings":32768,"beta_fast":32.0,"beta_slow":1.0,"attention_factor":1.138629436111989})") != std::string::npos);
    CHECK(y.find(R"("max_position_embeddings":32768)") != std::string::npos);
}

TEST_CASE("hf import: tensor plans") {
    const std::string next = qwen::import_config(config_of("qwen3_next"));
    const std::string q35 = qwen::import_config(config_of("qwen3_5"));
    const std::string moe = qwen::import_config(config_of("qwen3_moe"));
    const std::string g3 = gemma::import_config(config_of("gemma3"));

    SUBCASE("plain tensors keep their name and shape") {
        CHECK(plan(moe, "model.layers.0.self_attn.q_proj.weight", {64, 64}) == R"([{"name":"model.layers.0.self_attn.q_proj.weight","shape":[64,64]}])");
        CHECK(plan(moe, "model.layers.0.mlp.experts.7.down_proj.weight", {64, 48}) ==
              R"([{"name":"model.layers.0.mlp.experts.7.down_proj.weight","shape":[64,48]}])");
    }
    SUBCASE("qwen3_next fused GDN projections split by key-head group") {
        // nk 2, nv 6 (rep 3), dk 16, dv 8: group width 2*16 + 2*3*8 = 80.
        CHECK(plan(next, "model.layers.0.linear_attn.in_proj_qkvz.weight", {160, 64}) ==
              R"([{"name":"model.layers.0.linear_attn.in_proj_qkv.weight","shape":[112,64],"rows":[[0,16],[80,16],[16,16],[96,16],[32,24],[112,24]]},)"
              R"({"name":"model.layers.0.linear_attn.in_proj_z.weight","shape":[48,64],"rows":[[56,24],[136,24]]}])");
        CHECK(plan(next, "model.layers.0.linear_attn.in_proj_ba.weight", {12, 64}) ==
              R"([{"name":"model.layers.0.linear_attn.in_proj_b.weight","shape":[6,64],"rows":[[0,3],[6,3]]},)"
              R"({"name":"model.layers.0.linear_attn.in_proj_a.weight","shape":[6,64],"rows":[[3,3],[9,3]]}])");
        CHECK_THROWS_WITH_AS(plan(next, "model.layers.0.linear_attn.in_proj_qkvz.weight", {161, 64}), doctest::Contains("[160, 64]"),
                             cmf::sdk::Error);
    }
    SUBCASE("fused expert banks become per-expert tensors, role-contiguous, transposed banks detected") {
        const std::string p = plan(moe, "model.layers.3.mlp.experts.gate_up_proj", {8, 96, 64});
        CHECK(p.rfind(R"([{"name":"model.layers.3.mlp.experts.0.gate_proj.weight","shape":[48,64],"index":0,"rows":[[0,48]]},)", 0) == 0);
        CHECK(p.find(R"({"name":"model.layers.3.mlp.experts.7.up_proj.weight","shape":[48,64],"index":7,"rows":[[48,48]]}])") != std::string::npos);
        CHECK(p.find("gate_proj") < p.find("up_proj"));
        CHECK(plan(moe, "model.layers.1.mlp.experts.gate_up_proj", {8, 64, 96}).find(
                  R"({"name":"model.layers.1.mlp.experts.2.up_proj.weight","shape":[48,64],"index":2,"transpose":true,"rows":[[48,48]]})") != std::string::npos);
        CHECK(plan(moe, "model.layers.3.mlp.experts.down_proj", {8, 64, 48}).find(
                  R"({"name":"model.layers.3.mlp.experts.5.down_proj.weight","shape":[64,48],"index":5})") != std::string::npos);
        CHECK_THROWS_WITH_AS(plan(moe, "model.layers.3.mlp.experts.gate_up_proj", {8, 90, 64}), doctest::Contains("[8, 96, 64] or [8, 64, 96]"),
                             cmf::sdk::Error);
    }
    SUBCASE("wrappers, MTP renames and drops") {
        CHECK(plan(q35, "model.language_model.layers.3.self_attn.q_proj.weight", {256, 64}) ==
              R"([{"name":"model.layers.3.self_attn.q_proj.weight","shape":[256,64]}])");
        CHECK(plan(q35, "mtp.fc.weight", {64, 128}) == R"([{"name":"model.mtp.eh_proj.weight","shape":[64,128]}])");
        CHECK(plan(q35, "mtp.pre_fc_norm_embedding.weight", {64}) == R"([{"name":"model.mtp.enorm.weight","shape":[64]}])");
        CHECK(plan(q35, "mtp.pre_fc_norm_hidden.weight", {64}) == R"([{"name":"model.mtp.hnorm.weight","shape":[64]}])");
        CHECK(plan(q35, "mtp.layers.0.mlp.up_proj.weight", {128, 64}) == R"([{"name":"model.mtp.layers.0.mlp.up_proj.weight","shape":[128,64]}])");
        CHECK(plan(q35, "mtp.norm.weight", {64}) == R"([{"name":"model.mtp.norm.weight","shape":[64]}])");
        CHECK(plan(q35, "model.visual.blocks.0.attn.qkv.weight", {48, 16}) == "[]");
        CHECK(plan(g3, "language_model.model.embed_tokens.weight", {128, 64}, true) == R"([{"name":"model.embed_tokens.weight","shape":[128,64]}])");
        CHECK(plan(g3, "vision_tower.vision_model.embeddings.patch_embedding.weight", {16, 3, 2, 2}, true) == "[]");
        CHECK(plan(g3, "multi_modal_projector.mm_input_projection_weight", {16, 64}, true) == "[]");
        CHECK(plan(moe, "model.layers.0.self_attn.rotary_emb.inv_freq", {8}) == "[]");
    }
    SUBCASE("shapes that contradict the config name the tensor") {
        CHECK_THROWS_WITH_AS(plan(moe, "model.embed_tokens.weight", {128, 32}), doctest::Contains("\"model.embed_tokens.weight\" has shape [128, 32]"),
                             cmf::sdk::Error);
        CHECK_THROWS_WITH_AS(plan(moe, "model.layers.0.self_attn.k_proj.weight", {64, 64}), doctest::Contains("[32, 64]"), cmf::sdk::Error);
        CHECK_THROWS_WITH_AS(plan(moe, "model.layers.4.input_layernorm.weight", {64}), doctest::Contains("layer 4 but the config has 4 layers"),
                             cmf::sdk::Error);
        CHECK_THROWS_WITH_AS(plan(moe, "model.layers.0.mlp.experts.8.up_proj.weight", {48, 64}), doctest::Contains("expert 8"), cmf::sdk::Error);
        CHECK_THROWS_WITH_AS(plan(moe, "model.layers.0.mlp.gate.weight", {7, 64}), doctest::Contains("[8, 64]"), cmf::sdk::Error);
        CHECK_THROWS_WITH_AS(plan(q35, "model.language_model.layers.0.linear_attn.conv1d.weight", {160, 1, 3}), doctest::Contains("[160, 1, 4]"),
                             cmf::sdk::Error);
        const std::string q3 = qwen::import_config(config_of("qwen3"));
        CHECK_THROWS_WITH_AS(plan(q3, "model.layers.0.mlp.gate.weight", {8, 64}), doctest::Contains("declares no experts"), cmf::sdk::Error);
    }
}

// ---- config keys that change the function: each honoured or refused --------

namespace {

// A small qwen3 (or other model_type) config with `extra` keys spliced in.
std::string cfg(const std::string &extra, const std::string &model_type = "qwen3") {
    return R"({"model_type":")" + model_type +
           R"(","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":8,)"
           R"("intermediate_size":8,"max_position_embeddings":64)" +
           (extra.empty() ? "" : "," + extra) + "}";
}
std::string import_any(const std::string &json) {
    const bool gemma = json.find(R"("model_type":"gemma)") != std::string::npos;
    return gemma ? gemma::import_config(json) : qwen::import_config(json);
}
bool has(const std::string &arch, const std::string &piece) { return arch.find(piece) != std::string::npos; }

}  // namespace

TEST_CASE("hf import: keys that change the function are honoured in the arch block") {
    CHECK(has(import_any(cfg(R"("head_dim":32)")), R"("head_dim":32,)"));
    CHECK(has(import_any(cfg("")), R"("head_dim":16,)"));  // hidden / heads
    CHECK(has(import_any(cfg(R"("partial_rotary_factor":0.5)")), R"("partial_rotary_factor":0.5)"));
    CHECK(has(import_any(cfg(R"("rope_theta":500000)")), R"("rope_theta":500000.0)"));
    CHECK(has(import_any(cfg(R"("tie_word_embeddings":true)")), R"("tie_word_embeddings":true)"));
    CHECK(has(import_any(cfg(R"("rms_norm_eps":1e-05)")), R"("rms_norm_eps":0.00001)"));
    CHECK(has(import_any(cfg("")), R"("num_kv_heads":2)"));
    CHECK_FALSE(has(import_any(cfg(R"("hidden_act":"silu")")), "hidden_act"));
    CHECK(has(import_any(cfg(R"("hidden_act":"gelu_pytorch_tanh")")), R"("hidden_act":"gelu_tanh")"));
    CHECK(has(import_any(cfg(R"("layer_types":["full_attention","full_attention"])")), R"(["FullAttention","FullAttention"])"));
    // Qwen's sliding window only with use_sliding_window, from max_window_layers on.
    CHECK_FALSE(has(import_any(cfg(R"("use_sliding_window":false,"sliding_window":4096,"max_window_layers":1)")), "Sliding"));
    CHECK_FALSE(has(import_any(cfg(R"("use_sliding_window":true,"sliding_window":4096,"max_window_layers":2)")), "Sliding"));
    // attention_bias: the o_proj bias is planned (shape-checked) and the qwen forward pass adds it.
    const std::string a = import_any(cfg(R"("attention_bias":true)"));
    CHECK(plan(a, "model.layers.1.self_attn.o_proj.bias", {64}) == R"([{"name":"model.layers.1.self_attn.o_proj.bias","shape":[64]}])");
    CHECK_THROWS_WITH_AS(plan(a, "model.layers.1.self_attn.o_proj.bias", {32}), doctest::Contains("[64]"), cmf::sdk::Error);
    // Gemma: hidden_activation (null: the tanh GELU, as HF), softcaps,
    // query_pre_attn_scalar, sliding window and its pattern.
    CHECK(has(import_any(cfg(R"("hidden_act":"gelu","hidden_activation":null)", "gemma")), R"("hidden_act":"gelu_tanh")"));
    const std::string g2 = import_any(cfg(R"("head_dim":16,"query_pre_attn_scalar":16,"sliding_window":32,"final_logit_softcapping":30.0,)"
                                          R"("attn_logit_softcapping":50.0,"hidden_activation":"gelu_pytorch_tanh")",
                                          "gemma2"));
    for (const char *k : {R"("query_pre_attn_scalar":16.0)", R"("sliding_window":32)", R"("sliding_window_pattern":2)",
                          R"("final_logit_softcapping":30.0)", R"("attn_logit_softcapping":50.0)"})
        CHECK_MESSAGE(has(g2, k), k);
}

TEST_CASE("hf import: RoPE scaling of every implemented type is recorded, both spellings") {
    CHECK(has(import_any(cfg(R"("rope_scaling":{"type":"linear","factor":2.0})")), R"("rope_scaling":{"rope_type":"linear","factor":2.0})"));
    CHECK(has(import_any(cfg(R"("rope_scaling":{"rope_type":"dynamic","factor":2.0})")),
              R"("rope_scaling":{"rope_type":"dynamic","factor":2.0,"max_position_embeddings":64})"));
    CHECK(has(import_any(cfg(R"("rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
                             R"("original_max_position_embeddings":16})")),
              R"("rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":16})"));
    // Qwen's recipe under rope_scaling: recorded for HF, and the original's
    // native-window max_position_embeddings kept.
    const std::string y = import_any(cfg(R"("rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32})"));
    CHECK(has(y, R"("rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32,"beta_fast":32.0,)"
                 R"("beta_slow":1.0,"truncate":true})"));
    CHECK(has(y, R"("max_position_embeddings":32,)"));
    CHECK_FALSE(has(y, R"("yarn":)"));
    // transformers v5: rope_parameters with rope_theta inside; the original's yarn block is written too.
    const std::string v5 = import_any(cfg(R"("rope_parameters":{"rope_type":"yarn","rope_theta":1000000.0,"factor":4.0,)"
                                          R"("original_max_position_embeddings":32,"mscale":1.0,"mscale_all_dim":0.5,"truncate":false})"));
    CHECK(has(v5, R"("rope_theta":1000000.0)"));
    CHECK(has(v5, R"("yarn":{"factor":4.0,"original_max_position_embeddings":32,)"));
    CHECK(has(v5, R"("rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32,"mscale":1.0,)"
                  R"("mscale_all_dim":0.5,"beta_fast":32.0,"beta_slow":1.0,"truncate":false})"));
    CHECK(has(v5, R"("max_position_embeddings":64,)"));
    // Default and mrope (text: the same rotation) record nothing.
    CHECK_FALSE(has(import_any(cfg(R"("rope_parameters":{"rope_type":"default","rope_theta":10000.0,"mrope_section":[2,3,3]})")),
                    "rope_scaling"));
    CHECK_FALSE(has(import_any(cfg(R"("rope_scaling":{"type":"mrope","mrope_section":[2,3,3]})")), "rope_scaling"));
    // Gemma 3, v5 per-layer-type form: full attention's base and scaling,
    // sliding attention's base as rope_local_base_freq.
    const std::string g3 = import_any(cfg(R"("rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":1000000.0},)"
                                          R"("sliding_attention":{"rope_type":"default","rope_theta":10000.0}},"sliding_window":16,)"
                                          R"("layer_types":["sliding_attention","full_attention"])",
                                          "gemma3_text"));
    CHECK(has(g3, R"("rope_theta":1000000.0)"));
    CHECK(has(g3, R"("rope_scaling":{"rope_type":"linear","factor":8.0})"));
    CHECK(has(g3, R"("rope_local_base_freq":10000.0)"));
    CHECK(has(g3, R"("layer_types":["SlidingAttention","FullAttention"])"));
}

TEST_CASE("hf import: what the runtime does not implement is refused at convert, naming key and value") {
    auto refused = [](const std::string &json, const std::string &why, int32_t code = CMF_ERR_UNSUPPORTED) {
        CAPTURE(json);
        try {
            import_any(json);
            FAIL("accepted");
        } catch (const cmf::sdk::Error &e) {
            CHECK_MESSAGE(std::string(e.what()).find(why) != std::string::npos, e.what());
            CHECK(e.code() == code);
        }
    };
    refused(cfg(R"("hidden_act":"relu")"), R"(config.json: hidden_act "relu": activation not supported)");
    refused(cfg(R"("hidden_activation":"gelu")", "gemma2"), R"(hidden_activation "gelu": activation not supported)");
    refused(cfg(R"("layer_types":["full_attention","chunked_attention"])"), R"(layer_types holds "chunked_attention")");
    refused(cfg(R"("use_sliding_window":true,"sliding_window":4096,"max_window_layers":1)", "qwen2"),
            "use_sliding_window is true (layers 1..1 attend a 4096-token window)");
    refused(cfg(R"("layer_types":["sliding_attention","full_attention"])"), "layer_types has sliding_attention layers");
    refused(cfg(R"("use_bidirectional_attention":true)", "gemma3_text"), "use_bidirectional_attention is true");
    for (const char *t : {"longrope", "su", "ntk-by-parts"})
        refused(cfg(std::string(R"("rope_scaling":{"rope_type":")") + t + R"(","factor":2.0})"),
                std::string("rope_scaling.rope_type \"") + t + "\": this RoPE scaling is not implemented");
    refused(cfg(R"("rope_parameters":{"full_attention":{"rope_type":"default"},"sliding_attention":{"rope_type":"linear","factor":2.0}})",
                "gemma3_text"),
            "rope_parameters.sliding_attention.rope_type linear: scaled RoPE on sliding layers is not implemented");
    refused(cfg(R"("rope_parameters":{"full_attention":{"rope_type":"default"},"chunked_attention":{"rope_type":"default"}})"),
            "rope_parameters.chunked_attention: RoPE parameters for layer type");
    refused(cfg(R"("partial_rotary_factor":0.0)"), "partial_rotary_factor 0.000000: must be in (0, 1]", CMF_ERR_PARSE);
    refused(cfg(R"("head_dim":6,"partial_rotary_factor":0.5)"), "3 rotary dims, an odd number");
    refused(cfg(R"("rope_scaling":{"rope_type":"linear","factor":0})"), "rope_scaling.factor = 0: must be a positive number", CMF_ERR_PARSE);
    refused(cfg(R"("rope_scaling":{"rope_type":"linear"})"), "missing required key rope_scaling.factor", CMF_ERR_PARSE);
    refused(cfg(R"("rope_scaling":{"rope_type":"linear","factor":NaN})"), "rope_scaling.factor = NaN: must be a finite number", CMF_ERR_PARSE);
    refused(cfg(R"("rope_scaling":{"rope_type":"llama3","factor":8.0,"high_freq_factor":4.0,"original_max_position_embeddings":16})"),
            "missing required key rope_scaling.low_freq_factor", CMF_ERR_PARSE);
    refused(cfg(R"("rope_theta":1.0,"rope_scaling":{"rope_type":"yarn","factor":4.0})"), "yarn RoPE scaling needs rope_theta > 1",
            CMF_ERR_PARSE);
    refused(cfg(R"("head_dim":2,"rope_scaling":{"rope_type":"dynamic","factor":2.0})"), "needs more than 2 rotated dimensions");
    // Values Python writes that no formula can use: named with their spelling.
    refused(cfg(R"("rope_theta":NaN)"), "config.json: rope_theta = NaN: must be a finite number", CMF_ERR_PARSE);
    refused(cfg(R"("rms_norm_eps":-Infinity)"), "rms_norm_eps = -Infinity: must be a finite number", CMF_ERR_PARSE);
    refused(R"({"model_type":"qwen3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":8,)"
            R"("intermediate_size":8,"max_position_embeddings":1000000000000000019884624838656})",
            "config.json: max_position_embeddings = 1e+30: must be a non-negative integer that fits 64 bits", CMF_ERR_PARSE);
}

TEST_CASE("hf import: a config as Python writes it (BOM, big integers elsewhere, NaN in unused keys) converts") {
    const std::string a = import_any("\xEF\xBB\xBF" +
                                     cfg(R"("initializer_range":NaN,"some_limit":1000000000000000019884624838656,"x":-Infinity)"));
    CHECK(has(a, R"("arch_name":"qwen3")"));
}
