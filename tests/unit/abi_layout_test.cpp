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
    CHECK_SIZE(cmf_sampler_params, 40);
    CHECK_OFFSET(cmf_sampler_params, temperature, 4);
    CHECK_OFFSET(cmf_sampler_params, top_k, 8);
    CHECK_OFFSET(cmf_sampler_params, top_p, 12);
    CHECK_OFFSET(cmf_sampler_params, min_p, 16);
    CHECK_OFFSET(cmf_sampler_params, repetition_penalty, 20);
    CHECK_OFFSET(cmf_sampler_params, presence_penalty, 24);
    CHECK_OFFSET(cmf_sampler_params, seed, 32);
    CHECK_SIZE(cmf_chat_options, 16);
    CHECK_OFFSET(cmf_chat_options, struct_size, 0);
    CHECK_OFFSET(cmf_chat_options, flags, 4);
    CHECK_OFFSET(cmf_chat_options, now_unix, 8);
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
    CHECK_SIZE(cmf_backend_vt, 56);
    CHECK_OFFSET(cmf_backend_vt, abi_version, 4);
    CHECK_OFFSET(cmf_backend_vt, name, 8);
    CHECK_OFFSET(cmf_backend_vt, version, 16);
    CHECK_OFFSET(cmf_backend_vt, description, 24);
    CHECK_OFFSET(cmf_backend_vt, weight_bind, 32);
    CHECK_OFFSET(cmf_backend_vt, weight_free, 40);
    CHECK_OFFSET(cmf_backend_vt, matmul, 48);
    CHECK_SIZE(cmf_arch_vt, 40);
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
}
