"""The raw layer: libcmf loaded with ctypes, cmf.h's structs and functions
declared as the header spells them. Nothing here is safe to use directly:
the classes in cmf/__init__.py own the handles.

Which libcmf: $CMF_LIBRARY (a path) if set, else libcmf.so.1 as the dynamic
loader finds it (LD_LIBRARY_PATH, the system's library dirs), else the one in
`pkg-config --variable=libdir cmf`.
"""
import ctypes
import os
import subprocess
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int32, c_int64,
                    c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)

ABI_VERSION = 1  # CMF_ABI_VERSION this binding was written against

# Error codes (cmf_types.h).
ERR_INVALID_ARGUMENT = 1
ERR_IO = 2
ERR_FILE_NOT_FOUND = 3
ERR_INVALID_MAGIC = 4
ERR_UNSUPPORTED_VERSION = 5
ERR_UNSUPPORTED_FEATURE = 6
ERR_UNKNOWN_DTYPE = 7
ERR_MISSING_TENSOR = 8
ERR_BOUNDS = 9
ERR_PARSE = 10
ERR_HASH_MISMATCH = 11
ERR_SIGNATURE = 12
ERR_PLUGIN = 13
ERR_UNSUPPORTED = 14
ERR_OUT_OF_MEMORY = 15
ERR_CANCELLED = 16
ERR_NOT_FOUND = 17
ERR_TEMPLATE = 18
ERR_INTERNAL = 19

COMPONENT_CODEC = 1
COMPONENT_ARCH = 2
COMPONENT_BACKEND = 3
PLUGIN_STATUS_LOADED = 1
PLUGIN_STATUS_REFUSED = 2
MAX_DIMS = 6
MAX_EOS_IDS = 16

RUNTIME_NO_DEFAULT_PLUGINS = 0x1
RUNTIME_IGNORE_ENV = 0x2
OPEN_NO_MMAP = 0x1
OPEN_NO_SHARD_MERGE = 0x2
VERIFY_SKIP_SIGNATURE = 0x1
ENCODE_ADD_SPECIAL = 0x1
DECODE_SKIP_SPECIAL = 0x1
LOGITS_NONE = 0
LOGITS_LAST = 1
LOGITS_ALL = 2

STOP_MAX_TOKENS = 1
STOP_EOS = 2
STOP_CALLBACK = 3
STOP_CANCELLED = 4
STOP_CONTEXT_FULL = 5

cmf_log_fn = CFUNCTYPE(None, c_void_p, c_int32, c_char_p)
cmf_progress_fn = CFUNCTYPE(None, c_void_p, c_uint64, c_uint64)
cmf_token_fn = CFUNCTYPE(c_int32, c_void_p, c_int32)


class RuntimeOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_threads", c_int32), ("flags", c_uint32), ("reserved0", c_uint32),
                ("plugin_path", c_char_p), ("log_fn", cmf_log_fn), ("log_user", c_void_p),
                ("log_level", c_int32), ("reserved1", c_uint32)]


class PluginInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("status", c_int32), ("path", c_char_p), ("name", c_char_p),
                ("version", c_char_p), ("abi_version", c_uint32), ("reserved0", c_uint32), ("message", c_char_p)]


class ComponentInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("kind", c_int32), ("name", c_char_p), ("version", c_char_p),
                ("dtype_id", c_int32), ("abi_version", c_uint32), ("detail", c_char_p), ("plugin_path", c_char_p)]


class OpenOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("flags", c_uint32)]


class TensorInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("dtype", c_int32), ("name", c_char_p), ("ndim", c_uint32),
                ("shard", c_uint32), ("shape", c_uint64 * MAX_DIMS), ("data", c_void_p), ("nbytes", c_uint64),
                ("hash", c_uint64), ("offset", c_uint64)]


class ModelInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint32), ("flags", c_uint32),
                ("required_features", c_uint32),
                ("header_off", c_uint64), ("header_len", c_uint64), ("dir_off", c_uint64), ("dir_len", c_uint64),
                ("data_off", c_uint64), ("data_len", c_uint64), ("masks_off", c_uint64), ("masks_len", c_uint64),
                ("vocab_off", c_uint64), ("vocab_len", c_uint64), ("index_off", c_uint64), ("index_len", c_uint64),
                ("header_hash", c_uint64), ("dir_hash", c_uint64), ("file_size", c_uint64),
                ("shard_count", c_uint32), ("mask_count", c_uint32), ("tensor_count", c_uint64),
                ("header_json", c_char_p), ("header_json_len", c_uint64), ("format", c_char_p),
                ("arch_name", c_char_p), ("quant_type", c_char_p), ("arch_json", c_char_p),
                ("tokenizer_config_json", c_char_p), ("skills_json", c_char_p), ("provenance_json", c_char_p),
                ("skill_count", c_uint64)]


class VerifyOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("flags", c_uint32), ("progress", cmf_progress_fn),
                ("progress_user", c_void_p), ("trusted_keys", POINTER(c_char_p)), ("n_trusted_keys", c_size_t)]


class SignatureInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("trusted", c_uint32), ("file", c_char_p), ("pubkey_hex", c_char_p),
                ("fingerprint", c_char_p)]


class ChatOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("flags", c_uint32), ("now_unix", c_int64)]


class SessionOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_threads", c_int32), ("n_ctx", c_uint64), ("n_batch", c_uint32),
                ("flags", c_uint32), ("backend", c_char_p), ("arch_options", c_char_p),
                ("task", c_char_p), ("skill", c_char_p), ("blend", c_char_p), ("moe_mask", c_char_p),
                ("moe_mask_cover", c_float), ("reserved1", c_uint32)]


class GenerateOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("max_tokens", c_uint32), ("temperature", c_float), ("top_k", c_int32),
                ("top_p", c_float), ("min_p", c_float), ("repetition_penalty", c_float),
                ("presence_penalty", c_float), ("seed", c_uint64), ("stop_ids", POINTER(c_int32)),
                ("n_stop_ids", c_size_t), ("on_token", cmf_token_fn), ("user", c_void_p),
                ("speculative", c_int32), ("reserved0", c_uint32)]


class GenerateStats(Structure):
    _fields_ = [("struct_size", c_uint32), ("stop_reason", c_int32), ("prompt_tokens", c_uint64),
                ("generated_tokens", c_uint64), ("n_past", c_uint64), ("prefill_seconds", c_double),
                ("decode_seconds", c_double), ("prefill_tok_s", c_double), ("decode_tok_s", c_double),
                ("draft_tokens", c_uint64), ("draft_accepted", c_uint64)]


class SpecialIds(Structure):
    _fields_ = [("struct_size", c_uint32), ("bos_id", c_int32), ("pad_id", c_int32), ("n_eos_ids", c_uint32),
                ("eos_ids", c_int32 * MAX_EOS_IDS), ("has_chat_template", c_uint32), ("reserved0", c_uint32)]


# Every struct the binding passes, by its C name (tests compare the layouts
# with the C compiler's).
STRUCTS = {
    "cmf_runtime_options": RuntimeOptions, "cmf_plugin_info": PluginInfo, "cmf_component_info": ComponentInfo,
    "cmf_open_options": OpenOptions, "cmf_tensor_info": TensorInfo, "cmf_model_info": ModelInfo,
    "cmf_verify_options": VerifyOptions, "cmf_signature_info": SignatureInfo, "cmf_chat_options": ChatOptions,
    "cmf_session_options": SessionOptions, "cmf_generate_options": GenerateOptions,
    "cmf_generate_stats": GenerateStats, "cmf_model_special_ids": SpecialIds,
}

_err = c_void_p  # cmf_error *, kept opaque

# name: (restype, argtypes)
_FUNCTIONS = {
    "cmf_abi_version": (c_uint32, []),
    "cmf_plugin_abi_version": (c_uint32, []),
    "cmf_plugin_abi_min_version": (c_uint32, []),
    "cmf_version_string": (c_char_p, []),
    "cmf_error_code": (c_int32, [_err]),
    "cmf_error_message": (c_char_p, [_err]),
    "cmf_error_free": (None, [_err]),
    "cmf_error_code_name": (c_char_p, [c_int32]),
    "cmf_runtime_options_init": (None, [POINTER(RuntimeOptions)]),
    "cmf_runtime_create": (_err, [POINTER(RuntimeOptions), POINTER(c_void_p)]),
    "cmf_runtime_free": (None, [c_void_p]),
    "cmf_runtime_load_plugin": (_err, [c_void_p, c_char_p]),
    "cmf_runtime_threads": (c_int32, [c_void_p]),
    "cmf_plugin_info_init": (None, [POINTER(PluginInfo)]),
    "cmf_runtime_plugin_count": (c_size_t, [c_void_p]),
    "cmf_runtime_plugin_info": (_err, [c_void_p, c_size_t, POINTER(PluginInfo)]),
    "cmf_component_info_init": (None, [POINTER(ComponentInfo)]),
    "cmf_runtime_component_count": (c_size_t, [c_void_p, c_int32]),
    "cmf_runtime_component_info": (_err, [c_void_p, c_int32, c_size_t, POINTER(ComponentInfo)]),
    "cmf_open_options_init": (None, [POINTER(OpenOptions)]),
    "cmf_open": (_err, [c_void_p, c_char_p, POINTER(OpenOptions), POINTER(c_void_p)]),
    "cmf_close": (None, [c_void_p]),
    "cmf_tensor_info_init": (None, [POINTER(TensorInfo)]),
    "cmf_tensor_count": (c_size_t, [c_void_p]),
    "cmf_tensor_at": (_err, [c_void_p, c_size_t, POINTER(TensorInfo)]),
    "cmf_tensor": (_err, [c_void_p, c_char_p, POINTER(TensorInfo)]),
    "cmf_tensor_index": (_err, [c_void_p, c_char_p, POINTER(c_size_t)]),
    "cmf_model_info_init": (None, [POINTER(ModelInfo)]),
    "cmf_model_get_info": (_err, [c_void_p, POINTER(ModelInfo)]),
    "cmf_model_shard_path": (c_char_p, [c_void_p, c_uint32]),
    "cmf_tensor_dequantize": (_err, [c_void_p, c_size_t, c_uint64, c_uint64, POINTER(c_float), c_uint64]),
    "cmf_verify_options_init": (None, [POINTER(VerifyOptions)]),
    "cmf_verify": (_err, [c_void_p, POINTER(VerifyOptions), POINTER(c_void_p)]),
    "cmf_verify_problem_count": (c_size_t, [c_void_p]),
    "cmf_verify_problem": (c_char_p, [c_void_p, c_size_t]),
    "cmf_signature_info_init": (None, [POINTER(SignatureInfo)]),
    "cmf_verify_signature_count": (c_size_t, [c_void_p]),
    "cmf_verify_signature_at": (_err, [c_void_p, c_size_t, POINTER(SignatureInfo)]),
    "cmf_verify_report_free": (None, [c_void_p]),
    "cmf_sign_keygen": (_err, [c_char_p]),
    "cmf_sign_file": (_err, [c_char_p, c_char_p, POINTER(c_char)]),
    "cmf_tokenizer_create": (_err, [c_char_p, c_size_t, POINTER(c_void_p)]),
    "cmf_tokenizer_free": (None, [c_void_p]),
    "cmf_tokenizer_encode": (_err, [c_void_p, c_char_p, c_size_t, c_uint32, POINTER(POINTER(c_int32)),
                                    POINTER(c_size_t)]),
    "cmf_ids_free": (None, [POINTER(c_int32)]),
    "cmf_tokenizer_decode": (_err, [c_void_p, POINTER(c_int32), c_size_t, c_uint32, POINTER(c_void_p),
                                    POINTER(c_size_t)]),
    "cmf_string_free": (None, [c_void_p]),
    "cmf_tokenizer_vocab_size": (c_size_t, [c_void_p]),
    "cmf_tokenizer_token_to_id": (_err, [c_void_p, c_char_p, c_size_t, POINTER(c_int32)]),
    "cmf_tokenizer_id_to_token": (_err, [c_void_p, c_int32, POINTER(c_void_p), POINTER(c_size_t)]),
    "cmf_tokenizer_is_special": (c_int32, [c_void_p, c_int32]),
    "cmf_detokenizer_create": (_err, [c_void_p, c_uint32, POINTER(c_void_p)]),
    "cmf_detokenizer_push": (_err, [c_void_p, c_int32, POINTER(c_void_p), POINTER(c_size_t)]),
    "cmf_detokenizer_finish": (_err, [c_void_p, POINTER(c_void_p), POINTER(c_size_t)]),
    "cmf_detokenizer_free": (None, [c_void_p]),
    "cmf_chat_options_init": (None, [POINTER(ChatOptions)]),
    "cmf_chat_render": (_err, [c_char_p, c_size_t, c_char_p, c_size_t, POINTER(ChatOptions), POINTER(c_void_p),
                               POINTER(c_size_t)]),
    "cmf_session_options_init": (None, [POINTER(SessionOptions)]),
    "cmf_generate_options_init": (None, [POINTER(GenerateOptions)]),
    "cmf_generate_stats_init": (None, [POINTER(GenerateStats)]),
    "cmf_session_free": (None, [c_void_p]),
    "cmf_session_generate": (_err, [c_void_p, POINTER(c_int32), c_size_t, POINTER(GenerateOptions),
                                    POINTER(GenerateStats)]),
    "cmf_session_cancel": (None, [c_void_p]),
    "cmf_session_reset": (_err, [c_void_p]),
    "cmf_session_truncate": (_err, [c_void_p, c_uint64]),
    "cmf_session_eval": (_err, [c_void_p, POINTER(c_int32), c_size_t, c_int32, POINTER(c_float), c_size_t]),
    "cmf_session_vocab_size": (c_uint64, [c_void_p]),
    "cmf_session_n_ctx": (c_uint64, [c_void_p]),
    "cmf_session_n_past": (c_uint64, [c_void_p]),
    "cmf_session_create_for_model": (_err, [c_void_p, c_void_p, POINTER(SessionOptions), POINTER(c_void_p)]),
    "cmf_model_tokenizer": (_err, [c_void_p, POINTER(c_void_p)]),
    "cmf_model_special_ids_init": (None, [POINTER(SpecialIds)]),
    "cmf_model_get_special_ids": (_err, [c_void_p, POINTER(SpecialIds)]),
    "cmf_model_render_chat": (_err, [c_void_p, c_char_p, c_size_t, POINTER(c_void_p), POINTER(c_size_t)]),
}


def _candidates():
    env = os.environ.get("CMF_LIBRARY")
    if env:
        return [env]
    found = ["libcmf.so.1"]
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "cmf"], capture_output=True, text=True,
                                check=True).stdout.strip()
        if libdir:
            found.append(os.path.join(libdir, "libcmf.so.1"))
    except (OSError, subprocess.CalledProcessError):
        pass
    return found


def _load():
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append(f"{path}: {e}")
    else:
        raise OSError("cannot load libcmf (set CMF_LIBRARY to its path): " + "; ".join(tried))
    for name, (restype, argtypes) in _FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    if lib.cmf_abi_version() < ABI_VERSION:
        raise OSError(f"libcmf at {lib._name} speaks host ABI {lib.cmf_abi_version()}, this binding needs "
                      f">= {ABI_VERSION}")
    return lib


lib = _load()
