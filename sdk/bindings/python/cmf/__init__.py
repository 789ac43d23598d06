"""Python binding of the cmf host API (cmf.h), stdlib ctypes only.

    import cmf
    with cmf.Runtime() as rt, rt.open("model.cmf") as model, model.session() as s:
        for piece in s.generate_text("It is a truth universally acknowledged, that", max_tokens=40):
            print(piece, end="", flush=True)

Handles (Runtime, Model, Session, Tokenizer, Detokenizer) are released
exactly once: by close() / a `with` block, or when garbage-collected.
Closing a parent closes what was opened from it first (a model's sessions,
a runtime's models); a closed handle raises cmf.Error instead of touching
freed memory, and close() waits for calls running on other threads (a
session's close() cancels its generation first).

Thread-safety follows cmf.h: a Runtime, a Model and a Tokenizer may be used
from any number of threads at once; a Session or a Detokenizer by one call
at a time (a second concurrent call raises cmf.Error), except
Session.cancel(), which any thread may call. ctypes releases the GIL during
every C call, so generation on one thread does not block the others.

Tensors come back as NumPy float32 arrays when NumPy can be imported, else
as array('f') (set cmf.use_numpy = False to ask for array('f')).
"""
import array
import ctypes
import json
import os
import queue
import threading
import weakref
from ctypes import POINTER, byref, c_char_p, c_float, c_int32, c_size_t, c_void_p

from . import _native
from ._native import lib

try:
    import numpy as _np
except ImportError:  # NumPy is optional
    _np = None

use_numpy = _np is not None

__all__ = ["Error", "Runtime", "Model", "Session", "Tokenizer", "Detokenizer", "TensorInfo", "ModelInfo",
           "GenerateStats", "VerifyReport", "chat_render", "sign_keygen", "sign_file", "abi_version", "version"]


class Error(Exception):
    """A cmf error: `code` (cmf_types.h CMF_ERR_*), `name` (its stable
    spelling, e.g. "MissingTensor") and `message`."""

    def __init__(self, code, message):
        self.code = int(code)
        self.name = lib.cmf_error_code_name(self.code).decode()
        self.message = message
        super().__init__(f"{self.name}: {message}")


def _check(err):
    """Turns a returned cmf_error * into Error (and frees it)."""
    if err:
        code = lib.cmf_error_code(err)
        message = lib.cmf_error_message(err).decode("utf-8", "replace")
        lib.cmf_error_free(err)
        raise Error(code, message)


def _str(b):
    return b.decode("utf-8", "replace") if b is not None else None


def _take_string(ptr, n):
    """A library-allocated string: copied, then freed."""
    try:
        return ctypes.string_at(ptr, n.value).decode("utf-8") if ptr else ""
    finally:
        lib.cmf_string_free(ptr)


def _path(p):
    return os.fsencode(p)


def _copy_fields(obj, c, names):
    """Copies the named plain fields of a ctypes struct onto obj."""
    for name in names.split():
        setattr(obj, name, getattr(c, name))


def abi_version():
    """Host ABI version of the loaded libcmf (>= the one this binding needs)."""
    return lib.cmf_abi_version()


def version():
    """libcmf's version string, e.g. "0.1.0"."""
    return lib.cmf_version_string().decode()


class _Handle:
    """One C handle: freed exactly once, never while a call is using it.

    Calls run inside `with self._use() as ptr`; close() refuses new calls,
    closes the handle's children, waits for running calls, then frees.
    A child keeps a strong reference to its parent, so the garbage
    collector never frees a parent before its children."""

    _exclusive = False  # one call at a time (cmf.h: Session, Detokenizer)
    _kind = "handle"

    def __init__(self, ptr, free, parent=None):
        self._ptr = ptr
        self._free = free
        self._parent = parent
        self._children = weakref.WeakSet()
        self._cv = threading.Condition()
        self._busy = 0
        self._closed = False
        if parent is not None:
            with parent._cv:
                if parent._closed:
                    free(ptr)
                    raise Error(_native.ERR_INVALID_ARGUMENT, f"the {parent._kind} is closed")
                parent._children.add(self)

    def _use(self):
        return _Use(self)

    def _closing(self):
        """Hook run once close() has refused new calls (sessions cancel)."""

    def close(self):
        """Releases the handle (and everything opened from it). Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
        for child in list(self._children):
            child.close()
        self._closing()
        with self._cv:
            while self._busy:
                self._cv.wait()
            ptr, self._ptr = self._ptr, None
        if ptr:
            self._free(ptr)

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to report to
            pass


class _Use:
    def __init__(self, handle):
        self.h = handle

    def __enter__(self):
        h = self.h
        with h._cv:
            if h._closed:
                raise Error(_native.ERR_INVALID_ARGUMENT, f"the {h._kind} is closed")
            if h._exclusive and h._busy:
                raise Error(_native.ERR_INVALID_ARGUMENT,
                            f"the {h._kind} is already in use (cmf.h: one call at a time)")
            h._busy += 1
        return h._ptr

    def __exit__(self, *exc):
        h = self.h
        with h._cv:
            h._busy -= 1
            if h._busy == 0:
                h._cv.notify_all()


# ---- runtime ---------------------------------------------------------------

class PluginInfo:
    def __init__(self, c):
        self.loaded = c.status == _native.PLUGIN_STATUS_LOADED
        self.path = _str(c.path)
        self.name = _str(c.name)
        self.version = _str(c.version)
        self.abi_version = c.abi_version
        self.message = _str(c.message)

    def __repr__(self):
        return f"PluginInfo({self.name!r}, loaded={self.loaded}, path={self.path!r})"


class ComponentInfo:
    KINDS = {_native.COMPONENT_CODEC: "codec", _native.COMPONENT_ARCH: "arch",
             _native.COMPONENT_BACKEND: "backend"}

    def __init__(self, c):
        self.kind = self.KINDS.get(c.kind, str(c.kind))
        self.name = _str(c.name)
        self.version = _str(c.version)
        self.dtype_id = c.dtype_id
        self.abi_version = c.abi_version
        self.detail = _str(c.detail)
        self.plugin_path = _str(c.plugin_path)

    def __repr__(self):
        return f"ComponentInfo({self.kind} {self.name!r})"


class Runtime(_Handle):
    """Plugins, their registry and the thread pool (cmf_runtime).

    plugin_path: extra ':'-separated dirs or .so files, scanned first;
    threads: pool size (0 = the machine's physical cores)."""

    _kind = "runtime"

    def __init__(self, plugin_path=None, threads=0, default_plugins=True, use_env=True):
        o = _native.RuntimeOptions()
        lib.cmf_runtime_options_init(byref(o))
        o.n_threads = threads
        o.plugin_path = _path(plugin_path) if plugin_path else None
        if not default_plugins:
            o.flags |= _native.RUNTIME_NO_DEFAULT_PLUGINS
        if not use_env:
            o.flags |= _native.RUNTIME_IGNORE_ENV
        ptr = c_void_p()
        _check(lib.cmf_runtime_create(byref(o), byref(ptr)))
        super().__init__(ptr.value, lib.cmf_runtime_free)

    @property
    def threads(self):
        with self._use() as p:
            return lib.cmf_runtime_threads(p)

    def load_plugin(self, path):
        with self._use() as p:
            _check(lib.cmf_runtime_load_plugin(p, _path(path)))

    def plugins(self):
        """Plugin files seen, loaded or refused."""
        out = []
        with self._use() as p:
            for i in range(lib.cmf_runtime_plugin_count(p)):
                c = _native.PluginInfo()
                lib.cmf_plugin_info_init(byref(c))
                _check(lib.cmf_runtime_plugin_info(p, i, byref(c)))
                out.append(PluginInfo(c))
        return out

    def components(self, kind=None):
        """Registered codecs, archs and backends; kind "codec"/"arch"/"backend" or None for all."""
        out = []
        with self._use() as p:
            for k, name in ComponentInfo.KINDS.items():
                if kind not in (None, name):
                    continue
                for i in range(lib.cmf_runtime_component_count(p, k)):
                    c = _native.ComponentInfo()
                    lib.cmf_component_info_init(byref(c))
                    _check(lib.cmf_runtime_component_info(p, k, i, byref(c)))
                    out.append(ComponentInfo(c))
        return out

    def open(self, path, mmap=True, merge_shards=True):
        """Opens a .cmf file or any shard of a sharded model."""
        return Model(self, path, mmap, merge_shards)


# ---- models ----------------------------------------------------------------

class TensorInfo:
    """A directory entry: index, name, dtype id, shape, payload size and hash."""

    def __init__(self, index, c):
        self.index = index
        self.name = _str(c.name)
        self.dtype = c.dtype
        self.shape = tuple(c.shape[i] for i in range(c.ndim))
        self.shard = c.shard
        self.nbytes = c.nbytes
        self.hash = c.hash
        self.offset = c.offset

    @property
    def rows(self):
        return self.shape[0] if len(self.shape) >= 2 else 1

    @property
    def row_len(self):
        n = 1
        for d in (self.shape[1:] if len(self.shape) >= 2 else self.shape):
            n *= d
        return n

    def __repr__(self):
        return f"TensorInfo({self.name!r}, dtype={self.dtype}, shape={list(self.shape)})"


class ModelInfo:
    """Model-wide facts (cmf_model_info); JSON blocks as strings."""

    def __init__(self, c):
        _copy_fields(self, c, "version required_features file_size shard_count mask_count tensor_count skill_count "
                              "header_hash dir_hash")
        # Sections of shard 1 as (offset, length); length 0 = absent.
        self.sections = {name: (getattr(c, name + "_off"), getattr(c, name + "_len"))
                         for name in ("header", "dir", "data", "masks", "vocab", "index")}
        self.format = _str(c.format)
        self.arch_name = _str(c.arch_name)
        self.quant_type = _str(c.quant_type)
        self.header_json = ctypes.string_at(c.header_json, c.header_json_len).decode()
        self.arch_json = _str(c.arch_json)
        self.tokenizer_config_json = _str(c.tokenizer_config_json)
        self.skills_json = _str(c.skills_json)
        self.provenance_json = _str(c.provenance_json)


class Signature:
    def __init__(self, c):
        self.trusted = bool(c.trusted)
        self.file = _str(c.file)
        self.pubkey_hex = _str(c.pubkey_hex)
        self.fingerprint = _str(c.fingerprint)


class VerifyReport:
    """What cmf_verify found: `problems` (strings; empty = every hash and
    signature checked out) and valid `signatures`."""

    def __init__(self, problems, signatures):
        self.problems = problems
        self.signatures = signatures

    @property
    def ok(self):
        return not self.problems


class SpecialIds:
    def __init__(self, c):
        self.bos_id = c.bos_id if c.bos_id >= 0 else None
        self.pad_id = c.pad_id if c.pad_id >= 0 else None
        self.eos_ids = [c.eos_ids[i] for i in range(c.n_eos_ids)]
        self.has_chat_template = bool(c.has_chat_template)


def _float_buffer(n):
    if use_numpy and _np is not None:
        arr = _np.empty(n, dtype=_np.float32)
        return arr, arr.ctypes.data_as(POINTER(c_float))
    arr = array.array("f", bytes(4 * n))
    addr, _ = arr.buffer_info()
    return arr, ctypes.cast(addr, POINTER(c_float))


class Model(_Handle):
    """An opened CMF v2 container (cmf_model): immutable, usable from any thread."""

    _kind = "model"

    def __init__(self, runtime, path, mmap=True, merge_shards=True):
        o = _native.OpenOptions()
        lib.cmf_open_options_init(byref(o))
        if not mmap:
            o.flags |= _native.OPEN_NO_MMAP
        if not merge_shards:
            o.flags |= _native.OPEN_NO_SHARD_MERGE
        ptr = c_void_p()
        with runtime._use() as rt:  # registered as the runtime's child before the runtime can close
            _check(lib.cmf_open(rt, _path(path), byref(o), byref(ptr)))
            super().__init__(ptr.value, lib.cmf_close, runtime)
        self.runtime = runtime

    def info(self):
        c = _native.ModelInfo()
        lib.cmf_model_info_init(byref(c))
        with self._use() as p:
            _check(lib.cmf_model_get_info(p, byref(c)))
            return ModelInfo(c)

    def shard_paths(self):
        out = []
        with self._use() as p:
            while True:
                s = lib.cmf_model_shard_path(p, len(out))
                if s is None:
                    return out
                out.append(os.fsdecode(s))

    def __len__(self):
        with self._use() as p:
            return lib.cmf_tensor_count(p)

    def tensors(self):
        """Iterates the directory (merged over shards) as TensorInfo."""
        for i in range(len(self)):
            yield self.tensor_at(i)

    def tensor_at(self, index):
        c = _native.TensorInfo()
        lib.cmf_tensor_info_init(byref(c))
        with self._use() as p:
            _check(lib.cmf_tensor_at(p, index, byref(c)))
            return TensorInfo(index, c)

    def tensor(self, name):
        """TensorInfo by exact name (Error MissingTensor if absent)."""
        return self.tensor_at(self.tensor_index(name))

    def tensor_index(self, name):
        i = c_size_t()
        with self._use() as p:
            _check(lib.cmf_tensor_index(p, name.encode(), byref(i)))
        return i.value

    def payload(self, tensor):
        """The stored payload bytes of a tensor (a copy)."""
        t = self._resolve(tensor)
        c = _native.TensorInfo()
        lib.cmf_tensor_info_init(byref(c))
        with self._use() as p:
            _check(lib.cmf_tensor_at(p, t.index, byref(c)))
            return ctypes.string_at(c.data, c.nbytes) if c.nbytes else b""

    def _resolve(self, tensor):
        if isinstance(tensor, TensorInfo):
            return tensor
        if isinstance(tensor, int):
            return self.tensor_at(tensor)
        return self.tensor(tensor)

    def dequantize(self, tensor, rows=None):
        """A tensor (name, index or TensorInfo) decoded to float32 through its
        codec: the whole tensor, or rows (begin, end) of shape[0]. NumPy:
        shaped like the tensor (rows sliced); array('f'): flat."""
        t = self._resolve(tensor)
        begin, end = (0, t.rows) if rows is None else rows
        if not (0 <= begin <= end <= t.rows):
            raise Error(_native.ERR_INVALID_ARGUMENT,
                        f"{t.name}: rows [{begin}, {end}) outside [0, {t.rows})")
        n = (end - begin) * t.row_len
        out, ptr = _float_buffer(n)
        with self._use() as p:
            _check(lib.cmf_tensor_dequantize(p, t.index, begin, end, ptr, n))
        if _np is not None and isinstance(out, _np.ndarray):
            shape = ((end - begin),) + t.shape[1:] if len(t.shape) >= 2 else t.shape
            return out.reshape(shape)
        return out

    def verify(self, trusted_keys=(), check_signature=True, progress=None):
        """Checks every hash (and <file>.sig). trusted_keys: 64-hex public keys
        or 16-hex fingerprints; with any, every file must carry a valid
        signature by one of them. progress(done, total) is called from pool
        threads, never concurrently."""
        o = _native.VerifyOptions()
        lib.cmf_verify_options_init(byref(o))
        if not check_signature:
            o.flags |= _native.VERIFY_SKIP_SIGNATURE
        keys = (c_char_p * max(1, len(trusted_keys)))(*[k.encode() for k in trusted_keys])
        if trusted_keys:
            o.trusted_keys = ctypes.cast(keys, POINTER(c_char_p))
            o.n_trusted_keys = len(trusted_keys)
        if progress is not None:
            cb = _native.cmf_progress_fn(lambda user, done, total: progress(done, total))
            o.progress = cb
        report = c_void_p()
        with self._use() as p:
            _check(lib.cmf_verify(p, byref(o), byref(report)))
        try:
            r = report.value
            problems = [_str(lib.cmf_verify_problem(r, i)) for i in range(lib.cmf_verify_problem_count(r))]
            sigs = []
            for i in range(lib.cmf_verify_signature_count(r)):
                c = _native.SignatureInfo()
                lib.cmf_signature_info_init(byref(c))
                _check(lib.cmf_verify_signature_at(r, i, byref(c)))
                sigs.append(Signature(c))
            return VerifyReport(problems, sigs)
        finally:
            lib.cmf_verify_report_free(report)

    def tokenizer(self):
        """The file's own tokenizer (Error NotFound without a vocab section)."""
        ptr = c_void_p()
        with self._use() as p:
            _check(lib.cmf_model_tokenizer(p, byref(ptr)))
        return Tokenizer._own(ptr.value)

    def special_ids(self):
        c = _native.SpecialIds()
        lib.cmf_model_special_ids_init(byref(c))
        with self._use() as p:
            _check(lib.cmf_model_get_special_ids(p, byref(c)))
        return SpecialIds(c)

    def render_chat(self, messages, add_generation_prompt=True, **variables):
        """The file's chat template over [{"role": ..., "content": ...}, ...]."""
        ctx = dict(variables, messages=messages, add_generation_prompt=add_generation_prompt)
        data = json.dumps(ctx).encode()
        out, n = c_void_p(), c_size_t()
        with self._use() as p:
            _check(lib.cmf_model_render_chat(p, data, len(data), byref(out), byref(n)))
        return _take_string(out.value, n)

    def session(self, n_ctx=0, n_batch=0, backend=None, arch_options=None):
        """A generation session over this model (closed before the model)."""
        return Session(self, n_ctx, n_batch, backend, arch_options)


# ---- text ------------------------------------------------------------------

def _ids_array(ids):
    ids = list(ids)
    return (c_int32 * max(1, len(ids)))(*ids), len(ids)


class Tokenizer(_Handle):
    """A Hugging Face tokenizer.json (cmf_tokenizer): usable from any thread."""

    _kind = "tokenizer"

    def __init__(self, tokenizer_json):
        data = tokenizer_json.encode() if isinstance(tokenizer_json, str) else bytes(tokenizer_json)
        ptr = c_void_p()
        _check(lib.cmf_tokenizer_create(data, len(data), byref(ptr)))
        super().__init__(ptr.value, lib.cmf_tokenizer_free)

    @classmethod
    def _own(cls, ptr):
        t = cls.__new__(cls)
        _Handle.__init__(t, ptr, lib.cmf_tokenizer_free)
        return t

    def encode(self, text, add_special=False):
        data = text.encode("utf-8")
        ids, n = POINTER(c_int32)(), c_size_t()
        with self._use() as p:
            _check(lib.cmf_tokenizer_encode(p, data, len(data), _native.ENCODE_ADD_SPECIAL if add_special else 0,
                                            byref(ids), byref(n)))
        try:
            return ids[:n.value] if n.value else []
        finally:
            lib.cmf_ids_free(ids)

    def decode(self, ids, skip_special=False):
        arr, n = _ids_array(ids)
        out, out_n = c_void_p(), c_size_t()
        with self._use() as p:
            _check(lib.cmf_tokenizer_decode(p, arr, n, _native.DECODE_SKIP_SPECIAL if skip_special else 0,
                                            byref(out), byref(out_n)))
        return _take_string(out.value, out_n)

    @property
    def vocab_size(self):
        with self._use() as p:
            return lib.cmf_tokenizer_vocab_size(p)

    def token_to_id(self, token):
        data = token.encode()
        i = c_int32()
        with self._use() as p:
            _check(lib.cmf_tokenizer_token_to_id(p, data, len(data), byref(i)))
        return i.value

    def id_to_token(self, token_id):
        out, n = c_void_p(), c_size_t()
        with self._use() as p:
            _check(lib.cmf_tokenizer_id_to_token(p, token_id, byref(out), byref(n)))
        return _take_string(out.value, n)

    def is_special(self, token_id):
        with self._use() as p:
            return bool(lib.cmf_tokenizer_is_special(p, token_id))

    def detokenizer(self, skip_special=False):
        return Detokenizer(self, skip_special)


class Detokenizer(_Handle):
    """Streaming ids -> text that never splits a UTF-8 character; one call at a time."""

    _kind = "detokenizer"
    _exclusive = True

    def __init__(self, tokenizer, skip_special=False):
        ptr = c_void_p()
        with tokenizer._use() as t:
            _check(lib.cmf_detokenizer_create(t, _native.DECODE_SKIP_SPECIAL if skip_special else 0, byref(ptr)))
            super().__init__(ptr.value, lib.cmf_detokenizer_free, tokenizer)

    def push(self, token_id):
        out, n = c_void_p(), c_size_t()
        with self._use() as p:
            _check(lib.cmf_detokenizer_push(p, token_id, byref(out), byref(n)))
        return _take_string(out.value, n)

    def finish(self):
        out, n = c_void_p(), c_size_t()
        with self._use() as p:
            _check(lib.cmf_detokenizer_finish(p, byref(out), byref(n)))
        return _take_string(out.value, n)


def chat_render(template, context, now_unix=None):
    """Renders a Hugging Face chat template (Jinja) with `context` (a dict, or
    a JSON object string) as its variables; template None = ChatML."""
    ctx = (context if isinstance(context, str) else json.dumps(context)).encode()
    tmpl = template.encode() if template else None
    o = _native.ChatOptions()
    lib.cmf_chat_options_init(byref(o))
    if now_unix is not None:
        o.now_unix = now_unix
    out, n = c_void_p(), c_size_t()
    _check(lib.cmf_chat_render(tmpl, len(tmpl) if tmpl else 0, ctx, len(ctx), byref(o), byref(out), byref(n)))
    return _take_string(out.value, n)


def sign_keygen(key_path):
    """Writes a new Ed25519 key (key_path) and its public half (key_path + ".pub")."""
    _check(lib.cmf_sign_keygen(_path(key_path)))


def sign_file(file, key_path):
    """Writes file + ".sig"; returns the signer's 16-hex fingerprint."""
    fp = ctypes.create_string_buffer(17)
    _check(lib.cmf_sign_file(_path(file), _path(key_path), fp))
    return fp.value.decode()


# ---- sessions --------------------------------------------------------------

STOP_REASONS = {_native.STOP_MAX_TOKENS: "max_tokens", _native.STOP_EOS: "eos", _native.STOP_CALLBACK: "callback",
                _native.STOP_CANCELLED: "cancelled", _native.STOP_CONTEXT_FULL: "context_full"}


class GenerateStats:
    def __init__(self, c):
        self.stop_reason = STOP_REASONS.get(c.stop_reason, str(c.stop_reason))
        _copy_fields(self, c, "prompt_tokens generated_tokens n_past prefill_seconds decode_seconds prefill_tok_s "
                              "decode_tok_s draft_tokens draft_accepted")


class Session(_Handle):
    """A model bound to its arch on a backend, with one context (KV cache).

    One call at a time; cancel() from any thread. Generated tokens stay in
    the context, so the next generate() continues."""

    _kind = "session"
    _exclusive = True

    def __init__(self, model, n_ctx=0, n_batch=0, backend=None, arch_options=None):
        o = _native.SessionOptions()
        lib.cmf_session_options_init(byref(o))
        o.n_ctx = n_ctx
        if n_batch:
            o.n_batch = n_batch
        o.backend = backend.encode() if backend else None
        o.arch_options = arch_options.encode() if arch_options else None
        ptr = c_void_p()
        with model._use() as m, model.runtime._use() as rt:
            _check(lib.cmf_session_create_for_model(rt, m, byref(o), byref(ptr)))
            super().__init__(ptr.value, lib.cmf_session_free, model)
        self.model = model
        self._eos = None

    def _closing(self):
        self.cancel()

    def cancel(self):
        """Makes a running generate() return at its next token; any thread.
        A cancel when nothing runs is dropped (the next generate starts clean)."""
        with self._cv:
            ptr = self._ptr
            if ptr:
                lib.cmf_session_cancel(ptr)

    def generate(self, prompt, max_tokens=256, temperature=0.7, top_k=40, top_p=0.9, min_p=0.05,
                 repetition_penalty=1.1, presence_penalty=0.0, seed=0, stop_ids=None, on_token=None):
        """Appends `prompt` (token ids) and samples up to max_tokens. stop_ids:
        None = the model's eos ids, [] = none. on_token(id) -> truthy stops
        after that token. Returns GenerateStats; an exception raised by
        on_token stops generation and is re-raised here."""
        if stop_ids is None:
            if self._eos is None:
                self._eos = self.model.special_ids().eos_ids
            stop_ids = self._eos
        arr, n = _ids_array(prompt)
        stops, n_stops = _ids_array(stop_ids)
        o = _native.GenerateOptions()
        lib.cmf_generate_options_init(byref(o))
        o.max_tokens = max_tokens
        o.temperature = temperature
        o.top_k = top_k
        o.top_p = top_p
        o.min_p = min_p
        o.repetition_penalty = repetition_penalty
        o.presence_penalty = presence_penalty
        o.seed = seed
        o.stop_ids = stops
        o.n_stop_ids = n_stops
        raised = []
        if on_token is not None:
            def cb(user, token):
                try:
                    return 1 if on_token(token) else 0
                except BaseException as e:  # carried across the C frames, re-raised below
                    raised.append(e)
                    return 1
            callback = _native.cmf_token_fn(cb)
            o.on_token = callback
        st = _native.GenerateStats()
        lib.cmf_generate_stats_init(byref(st))
        with self._use() as p:
            _check(lib.cmf_session_generate(p, arr, n, byref(o), byref(st)))
        if raised:
            raise raised[0]
        return GenerateStats(st)

    def stream(self, prompt, **options):
        """Yields generated token ids as they come (generation runs on a
        worker thread). Leaving the loop early stops generation."""
        q = queue.Queue(maxsize=64)
        stop = threading.Event()
        done = object()

        def on_token(token):
            q.put(token)
            return stop.is_set()

        def run():
            try:
                q.put((done, self.generate(prompt, on_token=on_token, **options)))
            except BaseException as e:
                q.put((done, e))

        worker = threading.Thread(target=run, name="cmf-generate", daemon=True)
        worker.start()
        try:
            while True:
                item = q.get()
                if isinstance(item, tuple) and item[0] is done:
                    if isinstance(item[1], BaseException):
                        raise item[1]
                    self.last_stats = item[1]
                    return
                yield item
        finally:
            stop.set()
            while worker.is_alive():  # unblock a producer waiting on a full queue
                try:
                    q.get(timeout=0.05)
                except queue.Empty:
                    pass
            worker.join()

    def generate_text(self, text, **options):
        """Encodes `text` with the model's tokenizer, then yields the generated
        text piece by piece (never a split UTF-8 character)."""
        tok = self.model.tokenizer()
        try:
            detok = tok.detokenizer()
            try:
                for token in self.stream(tok.encode(text), **options):
                    piece = detok.push(token)
                    if piece:
                        yield piece
                tail = detok.finish()
                if tail:
                    yield tail
            finally:
                detok.close()
        finally:
            tok.close()

    def reset(self):
        with self._use() as p:
            _check(lib.cmf_session_reset(p))

    def truncate(self, n_keep):
        with self._use() as p:
            _check(lib.cmf_session_truncate(p, n_keep))

    def eval(self, tokens, all_logits=False):
        """Appends tokens and returns logits: the last position's (vocab
        floats) or every position's (len(tokens) x vocab)."""
        arr, n = _ids_array(tokens)
        vocab = self.vocab_size
        count = vocab * (n if all_logits else 1)
        out, ptr = _float_buffer(count)
        with self._use() as p:
            _check(lib.cmf_session_eval(p, arr, n, _native.LOGITS_ALL if all_logits else _native.LOGITS_LAST, ptr,
                                        count))
        if all_logits and _np is not None and isinstance(out, _np.ndarray):
            return out.reshape(n, vocab)
        return out

    @property
    def vocab_size(self):
        with self._use() as p:
            return lib.cmf_session_vocab_size(p)

    @property
    def n_ctx(self):
        with self._use() as p:
            return lib.cmf_session_n_ctx(p)

    @property
    def n_past(self):
        with self._use() as p:
            return lib.cmf_session_n_past(p)
