#include "container/json_emit.hpp"

#include <cmf/json_writer.hpp>

#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <vector>

namespace cmf::container::json {

namespace bj = boost::json;

// One spelling for the whole project: the SDK's header-only writer, which
// the converter and arch plugins use too.
std::string format_f64(double v) { return cmf::json::spell_float(v, false); }
std::string format_f32(float v) { return cmf::json::spell_float(v, true); }
void append_string(std::string &out, std::string_view s) { cmf::json::append_string(out, s); }

namespace {

enum class Num { Any, F32, F64 };
// Always: written (default if absent); Opt: omitted when absent or null;
// Null: written as null when absent; OmitDefault: omitted when equal to the default.
enum class Pres { Always, Opt, Null, OmitDefault, OmitEmpty };

struct Schema;
struct Field {
    const char *key;
    Pres pres = Pres::Opt;
    Num num = Num::Any;
    const Schema *schema = nullptr;  // for objects, or for the elements of an array
    bj::value def = nullptr;         // default for Always / OmitDefault
};
struct Schema {
    std::vector<Field> fields;
};

void emit(std::string &out, const bj::value &v, const Schema *schema, Num num);

void emit_number(std::string &out, const bj::value &v, Num num) {
    if (num == Num::Any) {
        if (v.is_int64()) out += std::to_string(v.get_int64());
        else if (v.is_uint64()) out += std::to_string(v.get_uint64());
        else out += format_f64(v.get_double());
        return;
    }
    double d = v.is_int64() ? double(v.get_int64()) : v.is_uint64() ? double(v.get_uint64()) : v.get_double();
    out += num == Num::F32 ? format_f32(float(d)) : format_f64(d);
}

bool json_equal_num(const bj::value &a, const bj::value &b) {
    auto as_d = [](const bj::value &v) {
        return v.is_int64() ? double(v.get_int64()) : v.is_uint64() ? double(v.get_uint64()) : v.get_double();
    };
    if (a.is_number() && b.is_number()) return as_d(a) == as_d(b);
    return a == b;
}

void emit_free_object(std::string &out, const bj::object &o) {
    std::vector<const bj::key_value_pair *> kv;
    for (const auto &p : o) kv.push_back(&p);
    std::stable_sort(kv.begin(), kv.end(), [](auto *a, auto *b) { return a->key() < b->key(); });
    out += '{';
    bool first = true;
    for (auto *p : kv) {
        if (!first) out += ',';
        first = false;
        append_string(out, p->key());
        out += ':';
        emit(out, p->value(), nullptr, Num::Any);
    }
    out += '}';
}

void emit_typed_object(std::string &out, const bj::object &o, const Schema &s) {
    out += '{';
    bool first = true;
    auto put = [&](std::string_view key, const bj::value &v, const Field *f) {
        if (!first) out += ',';
        first = false;
        append_string(out, key);
        out += ':';
        emit(out, v, f ? f->schema : nullptr, f ? f->num : Num::Any);
    };
    std::vector<std::string_view> known;
    for (const Field &f : s.fields) {
        known.push_back(f.key);
        const bj::value *v = o.if_contains(f.key);
        bool absent = v == nullptr || v->is_null();
        switch (f.pres) {
        case Pres::Always:
            if (!absent) put(f.key, *v, &f);
            else put(f.key, f.def, &f);
            break;
        case Pres::Opt:
            if (!absent) put(f.key, *v, &f);
            break;
        case Pres::Null:
            if (!absent) put(f.key, *v, &f);
            else put(f.key, bj::value(nullptr), &f);
            break;
        case Pres::OmitDefault:
            if (!absent && !json_equal_num(*v, f.def)) put(f.key, *v, &f);
            break;
        case Pres::OmitEmpty:
            if (!absent && !(v->is_array() && v->get_array().empty())) put(f.key, *v, &f);
            break;
        }
    }
    std::vector<const bj::key_value_pair *> extra;
    for (const auto &p : o)
        if (std::find(known.begin(), known.end(), p.key()) == known.end()) extra.push_back(&p);
    std::stable_sort(extra.begin(), extra.end(), [](auto *a, auto *b) { return a->key() < b->key(); });
    for (auto *p : extra) put(p->key(), p->value(), nullptr);
    out += '}';
}

void emit(std::string &out, const bj::value &v, const Schema *schema, Num num) {
    switch (v.kind()) {
    case bj::kind::null: out += "null"; break;
    case bj::kind::bool_: out += v.get_bool() ? "true" : "false"; break;
    case bj::kind::int64:
    case bj::kind::uint64:
    case bj::kind::double_: emit_number(out, v, num); break;
    case bj::kind::string: append_string(out, v.get_string()); break;
    case bj::kind::array: {
        out += '[';
        bool first = true;
        for (const auto &e : v.get_array()) {
            if (!first) out += ',';
            first = false;
            emit(out, e, schema, num);
        }
        out += ']';
        break;
    }
    case bj::kind::object:
        if (schema) emit_typed_object(out, v.get_object(), *schema);
        else emit_free_object(out, v.get_object());
        break;
    }
}

// The typed structs of the original's header, keys in declaration order.
const Schema &header_schema() {
    static const Schema yarn{{{"factor", Pres::Always, Num::F64},
                              {"original_max_position_embeddings", Pres::Always},
                              {"beta_fast", Pres::Always, Num::F64, nullptr, 32.0},
                              {"beta_slow", Pres::Always, Num::F64, nullptr, 1.0},
                              {"attention_factor", Pres::Always, Num::F64, nullptr, 1.0},
                              {"mscale_all_dim", Pres::Opt, Num::F64}}};
    static const Schema mla{{{"kv_lora_rank", Pres::Always}, {"qk_rope_head_dim", Pres::Always},
                             {"qk_nope_head_dim", Pres::Always}, {"v_head_dim", Pres::Always},
                             {"q_lora_rank", Pres::Opt}, {"nope", Pres::OmitDefault, Num::Any, nullptr, false}}};
    static const Schema mtp{{{"num_layers", Pres::Always},
                             {"share_lm_head", Pres::Always, Num::Any, nullptr, true},
                             {"share_embed", Pres::Always, Num::Any, nullptr, true}}};
    static const Schema moe{{{"num_experts", Pres::Always}, {"top_k", Pres::Always},
                             {"moe_intermediate_size", Pres::Always},
                             {"norm_topk_prob", Pres::Always, Num::Any, nullptr, false},
                             {"shared_expert_intermediate_size", Pres::Opt},
                             {"router_sigmoid", Pres::OmitDefault, Num::Any, nullptr, false},
                             {"routed_scaling_factor", Pres::Opt, Num::F64},
                             {"router_resonance", Pres::OmitDefault, Num::Any, nullptr, false}}};
    static const Schema linear_core{{{"kind", Pres::Always}, {"num_heads", Pres::Always}, {"nphase", Pres::Opt},
                                     {"value_head_dim", Pres::Always}}};
    static const Schema g3n{{{"altup_num_inputs", Pres::Always}, {"laurel_rank", Pres::Always}, {"ple_dim", Pres::Always},
                             {"ple_vocab", Pres::Always}, {"num_kv_shared_layers", Pres::Always},
                             {"activation_sparsity", Pres::Always, Num::F32}}};
    static const Schema arch{{
        {"arch_name", Pres::Always}, {"hidden_size", Pres::Always}, {"intermediate_size", Pres::Always},
        {"num_layers", Pres::Always}, {"num_attention_heads", Pres::Always}, {"num_kv_heads", Pres::Always},
        {"head_dim", Pres::Always}, {"vocab_size", Pres::Always}, {"layer_types", Pres::Always},
        {"rms_norm_eps", Pres::Always, Num::F64},
        {"norm_style", Pres::Always, Num::Any, nullptr, "qwen"},
        {"rope_theta", Pres::Always, Num::F64, nullptr, 10000.0},
        {"tie_word_embeddings", Pres::Always, Num::Any, nullptr, false},
        {"partial_rotary_factor", Pres::Always, Num::F32, nullptr, 1.0},
        {"yarn", Pres::Opt, Num::Any, &yarn},
        {"attention_heads_per_layer", Pres::Opt},
        {"hidden_act", Pres::OmitDefault, Num::Any, nullptr, "silu"},
        {"embed_multiplier", Pres::OmitDefault, Num::F32, nullptr, 1.0},
        {"query_pre_attn_scalar", Pres::Opt, Num::F32}, {"sliding_window", Pres::Opt},
        {"sliding_window_pattern", Pres::Opt}, {"rope_local_base_freq", Pres::Opt, Num::F64},
        {"local_partial_rotary_factor", Pres::Opt, Num::F32}, {"global_head_dim", Pres::Opt},
        {"num_global_kv_heads", Pres::Opt}, {"global_partial_rotary_factor", Pres::Opt, Num::F32},
        {"final_logit_softcapping", Pres::Opt, Num::F32},
        {"mla", Pres::Opt, Num::Any, &mla},
        {"activation_situ_beta", Pres::Opt, Num::F64}, {"activation_situ_linear_beta", Pres::Opt, Num::F64},
        {"attn_logit_softcapping", Pres::Opt, Num::F64},
        {"attn_v_norm", Pres::OmitDefault, Num::Any, nullptr, false},
        {"mtp", Pres::Opt, Num::Any, &mtp}, {"moe", Pres::Opt, Num::Any, &moe},
        {"linear_core", Pres::Opt, Num::Any, &linear_core}, {"head_clusters", Pres::Opt},
        {"max_position_embeddings", Pres::Always},
        {"linear_conv_kernel_dim", Pres::Null}, {"linear_num_key_heads", Pres::Null},
        {"linear_num_value_heads", Pres::Null},
        {"linear_key_head_dim", Pres::Opt}, {"linear_value_head_dim", Pres::Opt},
        {"rope_freq_factors", Pres::Opt, Num::F32}, {"logit_multiplier", Pres::Opt, Num::F32},
        {"g3n", Pres::Opt, Num::Any, &g3n}, {"kda_gate_lower_bound", Pres::Opt, Num::F64},
        {"num_loops", Pres::OmitDefault, Num::Any, nullptr, 1},
        {"loop_final_norm", Pres::OmitDefault, Num::Any, nullptr, false},
    }};
    static const Schema tokenizer_config{{{"chat_template", Pres::Opt},
                                          {"eos_token_ids", Pres::Always, Num::Any, nullptr, bj::array{}},
                                          {"bos_token_id", Pres::Opt}, {"pad_token_id", Pres::Opt}}};
    static const Schema section_hashes{{{"masks", Pres::Opt}, {"vocab", Pres::Opt}, {"index", Pres::Opt}}};
    static const Schema selection{{{"metric", Pres::Always}, {"phi_layer", Pres::Always}, {"mean", Pres::Always},
                                   {"basis", Pres::Always}, {"rank", Pres::Always},
                                   {"err_mean", Pres::Opt, Num::F32}, {"err_std", Pres::Opt, Num::F32},
                                   {"holdout", Pres::Opt}, {"holdout_n", Pres::Opt}}};
    static const Schema skill{{{"id", Pres::Always}, {"name", Pres::Opt},
                               {"layers", Pres::Always, Num::Any, nullptr, bj::array{}},
                               {"selection", Pres::Opt, Num::Any, &selection}, {"input_mask_task", Pres::Opt},
                               {"quality", Pres::Opt}, {"base_dir_hash", Pres::Opt}, {"base_arch", Pres::Opt},
                               {"task", Pres::Opt}, {"provenance", Pres::Opt}}};
    static const Schema shard{{{"no", Pres::Always}, {"count", Pres::Always}}};
    static const Schema calibration{{{"temperature", Pres::Always, Num::F32}, {"ece_before", Pres::Opt, Num::F32},
                                     {"ece_after", Pres::Opt, Num::F32}}};
    static const Schema routing{{{"temperature", Pres::Always, Num::F32}, {"novelty_theta", Pres::Always, Num::F32},
                                 {"samples", Pres::Always}, {"target_fpr", Pres::Always, Num::F32}}};
    static const Schema top{{
        {"format", Pres::Always, Num::Any, nullptr, "cmf"}, {"version", Pres::Always},
        {"arch", Pres::Always, Num::Any, &arch}, {"quant_type", Pres::Always}, {"provenance", Pres::Opt},
        {"tokenizer_config", Pres::Opt, Num::Any, &tokenizer_config},
        {"section_hashes", Pres::Opt, Num::Any, &section_hashes},
        {"skills", Pres::OmitEmpty, Num::Any, &skill}, {"shard", Pres::Opt, Num::Any, &shard},
        {"calibration", Pres::Opt, Num::Any, &calibration}, {"routing", Pres::Opt, Num::Any, &routing},
    }};
    return top;
}

}  // namespace

std::string emit_header(const bj::value &header) {
    std::string out;
    emit(out, header, &header_schema(), Num::Any);
    return out;
}

}  // namespace cmf::container::json

namespace cmf::container::json {
std::string emit_mask_quality(const bj::value &q) {
    static const Schema quality{{{"metric", Pres::Always}, {"value", Pres::Always, Num::F32},
                                 {"baseline_dense", Pres::Opt, Num::F32}, {"n_samples", Pres::Opt},
                                 {"dataset_sha256", Pres::Opt}}};
    std::string out;
    emit(out, q, &quality, Num::Any);
    return out;
}
}  // namespace cmf::container::json
