// The header `arch` block as the qwen family reads it (COMPAT 13.2, ARCHS 1.1).
#pragma once

#include "../common/rope_scaling.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cmf::qwen {

enum class LayerType { FullAttention, SlidingAttention, LinearAttention, Other };

struct Config {
    std::string arch_name;
    uint64_t hidden_size = 0;
    uint64_t intermediate_size = 0;  // nominal: a layer's width is its gate_proj rows
    uint64_t num_layers = 0;
    uint64_t num_attention_heads = 0;
    uint64_t num_kv_heads = 0;
    uint64_t head_dim = 0;
    uint64_t vocab_size = 0;
    std::vector<LayerType> layer_types;
    std::vector<std::string> layer_type_names;
    double rms_norm_eps = 0;
    bool gemma_norm = false;  // norm_style "gemma": x^*(1+w)
    double rope_theta = 10000.0;
    double partial_rotary_factor = 1.0;
    uint32_t rot_dim = 0;  // int(head_dim * partial_rotary_factor), even
    bool tie_word_embeddings = false;
    uint64_t max_position_embeddings = 0;
    bool gelu_tanh = false;  // hidden_act "gelu_tanh" (else silu)
    double embed_multiplier = 1.0;
    // HF's rope scaling, from arch.rope_scaling (or the original
    // converter's arch.yarn); type default when neither is there.
    archs::rope::Scaling rope_scaling;
    bool has_moe = false;
    bool has_linear_core = false;
};

// Parses the arch object; throws cmf::sdk::Error(CMF_ERR_PARSE) naming the
// key on a missing required key or a wrong type.
Config parse_config(const char *json, size_t len);

}  // namespace cmf::qwen
