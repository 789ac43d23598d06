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
                          R"("tie_word_embeddings":true,"partial_rotary_factor":1.0,"hidden_act":"gelu_tanh","embed_multiplier":8.0,)"
                          R"("query_pre_attn_scalar":32.0,"sliding_window":4,"sliding_window_pattern":3,"rope_local_base_freq":10000.0,)"
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
                         doctest::Contains("hidden_size is not a non-negative integer"), cmf::sdk::Error);
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
