/* Prints the C compiler's layout of the cmf.h structs the language bindings
 * declare by hand, as JSON: {"cmf_x": {"size": N, "fields": {"m": offset}}}.
 * The Python binding's tests compare its ctypes declarations with it. */
#include <cmf/cmf.h>

#include <stddef.h>
#include <stdio.h>

static int first_struct = 1, first_field = 1;

static void begin(const char *name, size_t size) {
    printf("%s\n  \"%s\": {\"size\": %zu, \"fields\": {", first_struct ? "{" : ",", name, size);
    first_struct = 0;
    first_field = 1;
}
static void field(const char *name, size_t offset) {
    printf("%s\"%s\": %zu", first_field ? "" : ", ", name, offset);
    first_field = 0;
}
static void end(void) { printf("}}"); }

#define S(T) begin(#T, sizeof(T))
#define F(T, m) field(#m, offsetof(T, m))

int main(void) {
    S(cmf_runtime_options); F(cmf_runtime_options, struct_size); F(cmf_runtime_options, n_threads);
    F(cmf_runtime_options, flags); F(cmf_runtime_options, reserved0); F(cmf_runtime_options, plugin_path);
    F(cmf_runtime_options, log_fn); F(cmf_runtime_options, log_user); F(cmf_runtime_options, log_level);
    F(cmf_runtime_options, reserved1); end();

    S(cmf_plugin_info); F(cmf_plugin_info, struct_size); F(cmf_plugin_info, status); F(cmf_plugin_info, path);
    F(cmf_plugin_info, name); F(cmf_plugin_info, version); F(cmf_plugin_info, abi_version);
    F(cmf_plugin_info, reserved0); F(cmf_plugin_info, message); end();

    S(cmf_component_info); F(cmf_component_info, struct_size); F(cmf_component_info, kind);
    F(cmf_component_info, name); F(cmf_component_info, version); F(cmf_component_info, dtype_id);
    F(cmf_component_info, abi_version); F(cmf_component_info, detail); F(cmf_component_info, plugin_path); end();

    S(cmf_open_options); F(cmf_open_options, struct_size); F(cmf_open_options, flags); end();

    S(cmf_tensor_info); F(cmf_tensor_info, struct_size); F(cmf_tensor_info, dtype); F(cmf_tensor_info, name);
    F(cmf_tensor_info, ndim); F(cmf_tensor_info, shard); F(cmf_tensor_info, shape); F(cmf_tensor_info, data);
    F(cmf_tensor_info, nbytes); F(cmf_tensor_info, hash); F(cmf_tensor_info, offset); end();

    S(cmf_model_info); F(cmf_model_info, struct_size); F(cmf_model_info, version); F(cmf_model_info, flags);
    F(cmf_model_info, required_features); F(cmf_model_info, header_off); F(cmf_model_info, header_len);
    F(cmf_model_info, dir_off); F(cmf_model_info, dir_len); F(cmf_model_info, data_off);
    F(cmf_model_info, data_len); F(cmf_model_info, masks_off); F(cmf_model_info, masks_len);
    F(cmf_model_info, vocab_off); F(cmf_model_info, vocab_len); F(cmf_model_info, index_off);
    F(cmf_model_info, index_len); F(cmf_model_info, header_hash); F(cmf_model_info, dir_hash);
    F(cmf_model_info, file_size); F(cmf_model_info, shard_count); F(cmf_model_info, mask_count);
    F(cmf_model_info, tensor_count); F(cmf_model_info, header_json); F(cmf_model_info, header_json_len);
    F(cmf_model_info, format); F(cmf_model_info, arch_name); F(cmf_model_info, quant_type);
    F(cmf_model_info, arch_json); F(cmf_model_info, tokenizer_config_json); F(cmf_model_info, skills_json);
    F(cmf_model_info, provenance_json); F(cmf_model_info, skill_count); end();

    S(cmf_verify_options); F(cmf_verify_options, struct_size); F(cmf_verify_options, flags);
    F(cmf_verify_options, progress); F(cmf_verify_options, progress_user); F(cmf_verify_options, trusted_keys);
    F(cmf_verify_options, n_trusted_keys); end();

    S(cmf_signature_info); F(cmf_signature_info, struct_size); F(cmf_signature_info, trusted);
    F(cmf_signature_info, file); F(cmf_signature_info, pubkey_hex); F(cmf_signature_info, fingerprint); end();

    S(cmf_chat_options); F(cmf_chat_options, struct_size); F(cmf_chat_options, flags);
    F(cmf_chat_options, now_unix); end();

    S(cmf_session_options); F(cmf_session_options, struct_size); F(cmf_session_options, n_threads);
    F(cmf_session_options, n_ctx); F(cmf_session_options, n_batch); F(cmf_session_options, flags);
    F(cmf_session_options, backend); F(cmf_session_options, arch_options); F(cmf_session_options, task);
    F(cmf_session_options, skill); F(cmf_session_options, blend); F(cmf_session_options, moe_mask);
    F(cmf_session_options, moe_mask_cover); F(cmf_session_options, reserved1); end();

    S(cmf_generate_options); F(cmf_generate_options, struct_size); F(cmf_generate_options, max_tokens);
    F(cmf_generate_options, temperature); F(cmf_generate_options, top_k); F(cmf_generate_options, top_p);
    F(cmf_generate_options, min_p); F(cmf_generate_options, repetition_penalty);
    F(cmf_generate_options, presence_penalty); F(cmf_generate_options, seed); F(cmf_generate_options, stop_ids);
    F(cmf_generate_options, n_stop_ids); F(cmf_generate_options, on_token); F(cmf_generate_options, user);
    F(cmf_generate_options, speculative); F(cmf_generate_options, reserved0); end();

    S(cmf_generate_stats); F(cmf_generate_stats, struct_size); F(cmf_generate_stats, stop_reason);
    F(cmf_generate_stats, prompt_tokens); F(cmf_generate_stats, generated_tokens); F(cmf_generate_stats, n_past);
    F(cmf_generate_stats, prefill_seconds); F(cmf_generate_stats, decode_seconds);
    F(cmf_generate_stats, prefill_tok_s); F(cmf_generate_stats, decode_tok_s);
    F(cmf_generate_stats, draft_tokens); F(cmf_generate_stats, draft_accepted); end();

    S(cmf_model_special_ids); F(cmf_model_special_ids, struct_size); F(cmf_model_special_ids, bos_id);
    F(cmf_model_special_ids, pad_id); F(cmf_model_special_ids, n_eos_ids); F(cmf_model_special_ids, eos_ids);
    F(cmf_model_special_ids, has_chat_template); F(cmf_model_special_ids, reserved0); end();

    printf("\n}\n");
    return 0;
}
