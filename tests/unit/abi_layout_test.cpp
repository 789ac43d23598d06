// The public structs' layout, pinned for x86-64 / LP64. An accidental change
// (a member inserted, reordered or resized) fails here; an intended change
// only ever appends members and adds lines below, never edits one.
#include <doctest/doctest.h>

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <cstddef>

#define CHECK_OFFSET(T, m, off) static_assert(offsetof(T, m) == (off), #T "." #m " moved")
#define CHECK_SIZE(T, size) static_assert(sizeof(T) == (size), "sizeof(" #T ") changed")

#if defined(__x86_64__) || defined(__aarch64__)
namespace {
[[maybe_unused]] void pinned_layouts() {
    CHECK_OFFSET(cmf_runtime_options, struct_size, 0);
    CHECK_SIZE(cmf_tensor_view, 80);
    CHECK_OFFSET(cmf_tensor_view, struct_size, 0);
    CHECK_OFFSET(cmf_tensor_view, dtype, 4);
    CHECK_OFFSET(cmf_tensor_view, ndim, 8);
    CHECK_OFFSET(cmf_tensor_view, shape, 16);
    CHECK_OFFSET(cmf_tensor_view, data, 64);
    CHECK_OFFSET(cmf_tensor_view, nbytes, 72);
    CHECK_SIZE(cmf_byte_sink, 24);
    CHECK_OFFSET(cmf_byte_sink, user, 8);
    CHECK_OFFSET(cmf_byte_sink, append, 16);
    CHECK_SIZE(cmf_runtime_options, 48);
    CHECK_OFFSET(cmf_runtime_options, n_threads, 4);
    CHECK_OFFSET(cmf_runtime_options, flags, 8);
    CHECK_OFFSET(cmf_runtime_options, plugin_path, 16);
    CHECK_OFFSET(cmf_runtime_options, log_fn, 24);
    CHECK_OFFSET(cmf_runtime_options, log_user, 32);
    CHECK_OFFSET(cmf_runtime_options, log_level, 40);
    CHECK_SIZE(cmf_plugin_info, 48);
    CHECK_OFFSET(cmf_plugin_info, status, 4);
    CHECK_OFFSET(cmf_plugin_info, path, 8);
    CHECK_OFFSET(cmf_plugin_info, name, 16);
    CHECK_OFFSET(cmf_plugin_info, version, 24);
    CHECK_OFFSET(cmf_plugin_info, abi_version, 32);
    CHECK_OFFSET(cmf_plugin_info, message, 40);
    CHECK_SIZE(cmf_component_info, 48);
    CHECK_OFFSET(cmf_component_info, kind, 4);
    CHECK_OFFSET(cmf_component_info, name, 8);
    CHECK_OFFSET(cmf_component_info, version, 16);
    CHECK_OFFSET(cmf_component_info, dtype_id, 24);
    CHECK_OFFSET(cmf_component_info, abi_version, 28);
    CHECK_OFFSET(cmf_component_info, detail, 32);
    CHECK_OFFSET(cmf_component_info, plugin_path, 40);
    CHECK_SIZE(cmf_open_options, 8);
    CHECK_OFFSET(cmf_open_options, flags, 4);
    CHECK_SIZE(cmf_tensor_info, 104);
    CHECK_OFFSET(cmf_tensor_info, dtype, 4);
    CHECK_OFFSET(cmf_tensor_info, name, 8);
    CHECK_OFFSET(cmf_tensor_info, ndim, 16);
    CHECK_OFFSET(cmf_tensor_info, shard, 20);
    CHECK_OFFSET(cmf_tensor_info, shape, 24);
    CHECK_OFFSET(cmf_tensor_info, data, 72);
    CHECK_OFFSET(cmf_tensor_info, nbytes, 80);
    CHECK_OFFSET(cmf_tensor_info, hash, 88);
    CHECK_OFFSET(cmf_tensor_info, offset, 96);
    CHECK_SIZE(cmf_quantize_params, 32);
    CHECK_OFFSET(cmf_quantize_params, options, 8);
    CHECK_OFFSET(cmf_quantize_params, act_rms, 16);
    CHECK_OFFSET(cmf_quantize_params, act_rms_len, 24);
    CHECK_SIZE(cmf_codec_vt, 80);
    CHECK_OFFSET(cmf_codec_vt, abi_version, 4);
    CHECK_OFFSET(cmf_codec_vt, name, 8);
    CHECK_OFFSET(cmf_codec_vt, version, 16);
    CHECK_OFFSET(cmf_codec_vt, dtype_id, 24);
    CHECK_OFFSET(cmf_codec_vt, flags, 28);
    CHECK_OFFSET(cmf_codec_vt, required_features, 32);
    CHECK_OFFSET(cmf_codec_vt, expected_size, 40);
    CHECK_OFFSET(cmf_codec_vt, validate, 48);
    CHECK_OFFSET(cmf_codec_vt, dequantize_rows, 56);
    CHECK_OFFSET(cmf_codec_vt, quantize, 64);
    CHECK_OFFSET(cmf_codec_vt, matmul_rows, 72);
    CHECK_SIZE(cmf_backend_vt, 152);
    CHECK_OFFSET(cmf_backend_vt, abi_version, 4);
    CHECK_OFFSET(cmf_backend_vt, name, 8);
    CHECK_OFFSET(cmf_backend_vt, version, 16);
    CHECK_OFFSET(cmf_backend_vt, description, 24);
    CHECK_OFFSET(cmf_backend_vt, weight_bind, 32);
    CHECK_OFFSET(cmf_backend_vt, weight_free, 40);
    CHECK_OFFSET(cmf_backend_vt, matmul, 48);
    CHECK_OFFSET(cmf_backend_vt, buffer_alloc, 56);
    CHECK_OFFSET(cmf_backend_vt, buffer_free, 64);
    CHECK_OFFSET(cmf_backend_vt, buffer_write, 72);
    CHECK_OFFSET(cmf_backend_vt, buffer_read, 80);
    CHECK_OFFSET(cmf_backend_vt, copy, 88);
    CHECK_OFFSET(cmf_backend_vt, rms_norm, 96);
    CHECK_OFFSET(cmf_backend_vt, rope, 104);
    CHECK_OFFSET(cmf_backend_vt, attention, 112);
    CHECK_OFFSET(cmf_backend_vt, gated_act, 120);
    CHECK_OFFSET(cmf_backend_vt, add, 128);
    CHECK_OFFSET(cmf_backend_vt, add_bias, 136);
    CHECK_OFFSET(cmf_backend_vt, embed, 144);
    CHECK_OFFSET(cmf_arch_vt, abi_version, 4);
    CHECK_OFFSET(cmf_arch_vt, name, 8);
    CHECK_OFFSET(cmf_arch_vt, version, 16);
    CHECK_OFFSET(cmf_arch_vt, arch_names, 24);
    CHECK_OFFSET(cmf_arch_vt, hf_model_types, 32);
    CHECK_SIZE(cmf_host_api, 104);
    CHECK_OFFSET(cmf_host_api, abi_version, 4);
    CHECK_OFFSET(cmf_host_api, host_ctx, 8);
    CHECK_OFFSET(cmf_host_api, error_create, 16);
    CHECK_OFFSET(cmf_host_api, error_free, 24);
    CHECK_OFFSET(cmf_host_api, log, 32);
    CHECK_OFFSET(cmf_host_api, alloc_aligned, 40);
    CHECK_OFFSET(cmf_host_api, free_aligned, 48);
    CHECK_OFFSET(cmf_host_api, parallel_for, 56);
    CHECK_OFFSET(cmf_host_api, num_threads, 64);
    CHECK_OFFSET(cmf_host_api, register_codec, 72);
    CHECK_OFFSET(cmf_host_api, register_backend, 80);
    CHECK_OFFSET(cmf_host_api, register_arch, 88);
    CHECK_OFFSET(cmf_host_api, find_codec, 96);
    CHECK_OFFSET(cmf_arch_vt, import_config, 40);
    CHECK_OFFSET(cmf_arch_vt, import_tensor, 48);
    CHECK_OFFSET(cmf_arch_vt, model_create, 56);
    CHECK_OFFSET(cmf_arch_vt, model_free, 64);
    CHECK_OFFSET(cmf_arch_vt, model_info, 72);
    CHECK_OFFSET(cmf_arch_vt, state_create, 80);
    CHECK_OFFSET(cmf_arch_vt, state_free, 88);
    CHECK_OFFSET(cmf_arch_vt, state_truncate, 96);
    CHECK_OFFSET(cmf_arch_vt, forward, 104);
    CHECK_SIZE(cmf_model_source, 72);
    CHECK_OFFSET(cmf_model_source, user, 8);
    CHECK_OFFSET(cmf_model_source, arch_json, 16);
    CHECK_OFFSET(cmf_model_source, arch_json_len, 24);
    CHECK_OFFSET(cmf_model_source, header_json, 32);
    CHECK_OFFSET(cmf_model_source, header_json_len, 40);
    CHECK_OFFSET(cmf_model_source, tensor_count, 48);
    CHECK_OFFSET(cmf_model_source, tensor, 56);
    CHECK_OFFSET(cmf_model_source, tensor_at, 64);
    CHECK_SIZE(cmf_arch_model_params, 16);
    CHECK_OFFSET(cmf_arch_model_params, options, 8);
    CHECK_SIZE(cmf_arch_model_info, 24);
    CHECK_OFFSET(cmf_arch_model_info, vocab_size, 8);
    CHECK_OFFSET(cmf_arch_model_info, max_context, 16);
    CHECK_SIZE(cmf_forward_args, 40);
    CHECK_OFFSET(cmf_forward_args, n_tokens, 4);
    CHECK_OFFSET(cmf_forward_args, tokens, 8);
    CHECK_OFFSET(cmf_forward_args, pos, 16);
    CHECK_OFFSET(cmf_forward_args, logits_mode, 24);
    CHECK_OFFSET(cmf_forward_args, logits, 32);
    // container (issue 3)
    CHECK_SIZE(cmf_model_info, 232);
    CHECK_OFFSET(cmf_model_info, required_features, 12);
    CHECK_OFFSET(cmf_model_info, header_off, 16);
    CHECK_OFFSET(cmf_model_info, index_len, 104);
    CHECK_OFFSET(cmf_model_info, header_hash, 112);
    CHECK_OFFSET(cmf_model_info, dir_hash, 120);
    CHECK_OFFSET(cmf_model_info, file_size, 128);
    CHECK_OFFSET(cmf_model_info, shard_count, 136);
    CHECK_OFFSET(cmf_model_info, mask_count, 140);
    CHECK_OFFSET(cmf_model_info, tensor_count, 144);
    CHECK_OFFSET(cmf_model_info, header_json, 152);
    CHECK_OFFSET(cmf_model_info, header_json_len, 160);
    CHECK_OFFSET(cmf_model_info, format, 168);
    CHECK_OFFSET(cmf_model_info, arch_name, 176);
    CHECK_OFFSET(cmf_model_info, quant_type, 184);
    CHECK_OFFSET(cmf_model_info, arch_json, 192);
    CHECK_OFFSET(cmf_model_info, tokenizer_config_json, 200);
    CHECK_OFFSET(cmf_model_info, skills_json, 208);
    CHECK_OFFSET(cmf_model_info, provenance_json, 216);
    CHECK_OFFSET(cmf_model_info, skill_count, 224);
    CHECK_SIZE(cmf_mask_info, 128);
    CHECK_OFFSET(cmf_mask_info, task_id, 4);
    CHECK_OFFSET(cmf_mask_info, name, 8);
    CHECK_OFFSET(cmf_mask_info, description, 16);
    CHECK_OFFSET(cmf_mask_info, parent, 24);
    CHECK_OFFSET(cmf_mask_info, priority, 32);
    CHECK_OFFSET(cmf_mask_info, quality_json, 40);
    CHECK_OFFSET(cmf_mask_info, sparsity, 48);
    CHECK_OFFSET(cmf_mask_info, has_hot_pack, 52);
    CHECK_OFFSET(cmf_mask_info, has_expert_fields, 56);
    CHECK_OFFSET(cmf_mask_info, blob, 64);
    CHECK_OFFSET(cmf_mask_info, blob_len, 72);
    CHECK_OFFSET(cmf_mask_info, ffn_rows, 80);
    CHECK_OFFSET(cmf_mask_info, ffn_row_bytes, 88);
    CHECK_OFFSET(cmf_mask_info, head_row_bytes, 96);
    CHECK_OFFSET(cmf_mask_info, gate_bytes, 104);
    CHECK_OFFSET(cmf_mask_info, expert_row_bytes, 112);
    CHECK_OFFSET(cmf_mask_info, layers, 120);
    CHECK_SIZE(cmf_index_entry, 40);
    CHECK_OFFSET(cmf_index_entry, task_id, 4);
    CHECK_OFFSET(cmf_index_entry, layer, 8);
    CHECK_OFFSET(cmf_index_entry, n_groups, 12);
    CHECK_OFFSET(cmf_index_entry, n_heads, 16);
    CHECK_OFFSET(cmf_index_entry, groups, 24);
    CHECK_OFFSET(cmf_index_entry, heads, 32);
    CHECK_SIZE(cmf_verify_options, 40);
    CHECK_OFFSET(cmf_verify_options, flags, 4);
    CHECK_OFFSET(cmf_verify_options, progress, 8);
    CHECK_OFFSET(cmf_verify_options, progress_user, 16);
    CHECK_OFFSET(cmf_verify_options, trusted_keys, 24);
    CHECK_OFFSET(cmf_verify_options, n_trusted_keys, 32);
    CHECK_SIZE(cmf_signature_info, 32);
    CHECK_OFFSET(cmf_signature_info, trusted, 4);
    CHECK_OFFSET(cmf_signature_info, file, 8);
    CHECK_OFFSET(cmf_signature_info, pubkey_hex, 16);
    CHECK_OFFSET(cmf_signature_info, fingerprint, 24);
    CHECK_SIZE(cmf_writer_options, 24);
    CHECK_OFFSET(cmf_writer_options, flags, 4);
    CHECK_OFFSET(cmf_writer_options, shard_max_bytes, 8);
    CHECK_OFFSET(cmf_writer_options, default_task, 16);
    CHECK_SIZE(cmf_mask_spec, 80);
    CHECK_OFFSET(cmf_mask_spec, task_id, 4);
    CHECK_OFFSET(cmf_mask_spec, name, 8);
    CHECK_OFFSET(cmf_mask_spec, description, 16);
    CHECK_OFFSET(cmf_mask_spec, sparsity, 24);
    CHECK_OFFSET(cmf_mask_spec, has_hot_pack, 28);
    CHECK_OFFSET(cmf_mask_spec, quality_json, 32);
    CHECK_OFFSET(cmf_mask_spec, parent, 40);
    CHECK_OFFSET(cmf_mask_spec, priority, 48);
    CHECK_OFFSET(cmf_mask_spec, has_expert_fields, 56);
    CHECK_OFFSET(cmf_mask_spec, blob, 64);
    CHECK_OFFSET(cmf_mask_spec, blob_len, 72);

    // session (issue 7)
    CHECK_SIZE(cmf_session_options, 40);
    CHECK_OFFSET(cmf_session_options, n_threads, 4);
    CHECK_OFFSET(cmf_session_options, n_ctx, 8);
    CHECK_OFFSET(cmf_session_options, n_batch, 16);
    CHECK_OFFSET(cmf_session_options, backend, 24);
    CHECK_OFFSET(cmf_session_options, arch_options, 32);
    CHECK_SIZE(cmf_generate_options, 72);
    CHECK_OFFSET(cmf_generate_options, max_tokens, 4);
    CHECK_OFFSET(cmf_generate_options, temperature, 8);
    CHECK_OFFSET(cmf_generate_options, top_k, 12);
    CHECK_OFFSET(cmf_generate_options, top_p, 16);
    CHECK_OFFSET(cmf_generate_options, min_p, 20);
    CHECK_OFFSET(cmf_generate_options, repetition_penalty, 24);
    CHECK_OFFSET(cmf_generate_options, presence_penalty, 28);
    CHECK_OFFSET(cmf_generate_options, seed, 32);
    CHECK_OFFSET(cmf_generate_options, stop_ids, 40);
    CHECK_OFFSET(cmf_generate_options, n_stop_ids, 48);
    CHECK_OFFSET(cmf_generate_options, on_token, 56);
    CHECK_OFFSET(cmf_generate_options, user, 64);
    CHECK_SIZE(cmf_generate_stats, 64);
    CHECK_OFFSET(cmf_generate_stats, stop_reason, 4);
    CHECK_OFFSET(cmf_generate_stats, prompt_tokens, 8);
    CHECK_OFFSET(cmf_generate_stats, generated_tokens, 16);
    CHECK_OFFSET(cmf_generate_stats, n_past, 24);
    CHECK_OFFSET(cmf_generate_stats, prefill_seconds, 32);
    CHECK_OFFSET(cmf_generate_stats, decode_seconds, 40);
    CHECK_OFFSET(cmf_generate_stats, prefill_tok_s, 48);
    CHECK_OFFSET(cmf_generate_stats, decode_tok_s, 56);
    // running an opened model (issue 7, CLI end)
    CHECK_SIZE(cmf_model_special_ids, 88);
    CHECK_OFFSET(cmf_model_special_ids, bos_id, 4);
    CHECK_OFFSET(cmf_model_special_ids, pad_id, 8);
    CHECK_OFFSET(cmf_model_special_ids, n_eos_ids, 12);
    CHECK_OFFSET(cmf_model_special_ids, eos_ids, 16);
    CHECK_OFFSET(cmf_model_special_ids, has_chat_template, 80);
}
}  // namespace
#endif

TEST_CASE("abi_layout: versions and constants") {
    CHECK(CMF_ABI_VERSION == 1);
    CHECK(CMF_PLUGIN_ABI_VERSION == 1);
    CHECK(CMF_PLUGIN_ABI_MIN == 1);
    CHECK(cmf_abi_version() == CMF_ABI_VERSION);
    CHECK(cmf_plugin_abi_version() == CMF_PLUGIN_ABI_VERSION);
    // Error codes and dtype ids are part of the ABI: values never change.
    CHECK(CMF_ERR_BOUNDS == 9);
    CHECK(CMF_ERR_PARSE == 10);
    CHECK(CMF_ERR_INTERNAL == 19);
    CHECK(CMF_DTYPE_Q4TP == 15);
    CHECK(CMF_DTYPE_Q2TP == 16);
    CHECK(CMF_FEATURES_SUPPORTED == 0x67u);
    CHECK(CMF_STOP_MAX_TOKENS == 1);
    CHECK(CMF_STOP_CONTEXT_FULL == 5);
    CHECK(CMF_NORM_GEMMA == 1);
    CHECK(CMF_ACT_GELU_TANH == 1);
}
