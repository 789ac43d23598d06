//! Rust binding of the cmf host API (`abi/cmf/cmf.h`).
//!
//! Two layers: [`sys`], the raw `extern "C"` declarations generated from the
//! header by bindgen (`gen-sys.sh`), and this safe layer on top.
//!
//! ```no_run
//! use std::ops::ControlFlow;
//! let rt = cmf::Runtime::new()?;
//! let model = rt.open("model.cmf")?;
//! let mut session = model.session(&cmf::SessionOptions::default())?;
//! session.generate_text("It is a truth universally acknowledged, that", &cmf::GenerateOptions::greedy(40),
//!                       |piece| { print!("{}", piece); ControlFlow::Continue(()) })?;
//! # Ok::<(), cmf::Error>(())
//! ```
//!
//! Ownership follows the header: a [`Model`] borrows its [`Runtime`], a
//! [`Session`] its [`Model`], a [`Detokenizer`] its [`Tokenizer`], so the
//! compiler closes children before parents. Every handle is freed exactly
//! once, by `Drop` (or an explicit `close()`, which consumes it).
//!
//! Thread-safety is the header's: `Runtime`, `Model` and `Tokenizer` are
//! `Send + Sync` (queries run concurrently); `Session` and `Detokenizer` are
//! `Send` but not `Sync` (one thread at a time), and a session's
//! [`Canceller`] is `Send + Sync` so another thread may stop a running
//! generation.

//! The compiler holds these rules (each block below must fail to compile):
//!
//! ```compile_fail
//! fn sync<T: Sync>() {}
//! sync::<cmf::Session<'static>>(); // one thread at a time
//! ```
//! ```compile_fail
//! fn sync<T: Sync>() {}
//! sync::<cmf::Detokenizer<'static>>();
//! ```
//! ```compile_fail
//! let model = { let rt = cmf::Runtime::new().unwrap(); rt.open("m.cmf").unwrap() }; // model outlives its runtime
//! ```
//! ```compile_fail
//! let rt = cmf::Runtime::new().unwrap();
//! let s = { let m = rt.open("m.cmf").unwrap(); m.session(&Default::default()).unwrap() }; // session outlives its model
//! ```
//! ```compile_fail
//! let rt = cmf::Runtime::new().unwrap();
//! let m = rt.open("m.cmf").unwrap();
//! let c = { let s = m.session(&Default::default()).unwrap(); s.canceller() };
//! drop(m);
//! c.cancel(); // a canceller cannot outlive the model either
//! ```

#![allow(clippy::missing_safety_doc)]

#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, deref_nullptr)]
#[allow(clippy::all)]
pub mod sys;

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{ControlFlow, Range};
use std::os::raw::{c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::Arc;

// ---- errors ----------------------------------------------------------------

/// A cmf error: the code (`sys::CMF_ERR_*`) and the library's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    code: i32,
    message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A binding-side error (closed handle, bad argument) with a cmf code.
    pub fn new(code: i32, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }
    /// `sys::CMF_ERR_*`.
    pub fn code(&self) -> i32 {
        self.code
    }
    /// The code's stable spelling, e.g. "MissingTensor".
    pub fn code_name(&self) -> &'static str {
        code_name(self.code)
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code_name(), self.message)
    }
}

impl std::error::Error for Error {}

/// The stable name of an error code, e.g. 8 -> "MissingTensor".
pub fn code_name(code: i32) -> &'static str {
    // Static storage in libcmf.
    unsafe { static_str(sys::cmf_error_code_name(code)) }
}

unsafe fn static_str(p: *const c_char) -> &'static str {
    if p.is_null() {
        ""
    } else {
        CStr::from_ptr(p).to_str().unwrap_or("")
    }
}

/// Turns a returned `cmf_error *` into `Err` (and frees it).
fn check(e: *mut sys::cmf_error) -> Result<()> {
    if e.is_null() {
        return Ok(());
    }
    unsafe {
        let err = Error { code: sys::cmf_error_code(e), message: lossy(sys::cmf_error_message(e)) };
        sys::cmf_error_free(e);
        Err(err)
    }
}

unsafe fn lossy(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(sys::CMF_ERR_INVALID_ARGUMENT, format!("{:?} contains a NUL byte", s)))
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::new(sys::CMF_ERR_INVALID_ARGUMENT, format!("{} contains a NUL byte", p.display())))
}

/// A library-allocated string: copied, then freed with cmf_string_free.
unsafe fn take_string(p: *mut c_char, len: usize) -> Result<String> {
    if p.is_null() {
        return Ok(String::new());
    }
    let bytes = std::slice::from_raw_parts(p as *const u8, len).to_vec();
    sys::cmf_string_free(p);
    String::from_utf8(bytes).map_err(|e| Error::new(sys::CMF_ERR_INTERNAL, format!("library string is not UTF-8: {}", e)))
}

/// Host ABI version of the linked libcmf.
pub fn abi_version() -> u32 {
    unsafe { sys::cmf_abi_version() }
}

/// libcmf's version, e.g. "0.1.0".
pub fn version() -> &'static str {
    unsafe { static_str(sys::cmf_version_string()) }
}

fn check_abi() -> Result<()> {
    let have = abi_version();
    if have < sys::CMF_ABI_VERSION as u32 {
        return Err(Error::new(
            sys::CMF_ERR_UNSUPPORTED,
            format!("libcmf speaks host ABI {}, this binding needs >= {}", have, sys::CMF_ABI_VERSION),
        ));
    }
    Ok(())
}

// ---- runtime ---------------------------------------------------------------

/// How to create a [`Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Extra ':'-separated plugin dirs or `.so` files, scanned first.
    pub plugin_path: Option<String>,
    /// Pool threads; 0 = the machine's physical cores.
    pub threads: i32,
    /// Scan the default plugin directory installed next to libcmf.
    pub default_plugins: bool,
    /// Read CMF_PLUGIN_PATH / CMF_THREADS.
    pub use_env: bool,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions { plugin_path: None, threads: 0, default_plugins: true, use_env: true }
    }
}

/// Plugins, their registry and the thread pool (`cmf_runtime`). Queries
/// may run from any thread; plugin loading is serialised by the library.
pub struct Runtime {
    raw: NonNull<sys::cmf_runtime>,
}

// cmf.h: create/free/load_plugin are serialised internally; queries may run
// concurrently from any thread.
unsafe impl Send for Runtime {}
unsafe impl Sync for Runtime {}

/// A plugin file the runtime saw, loaded or refused.
#[derive(Clone, Debug)]
pub struct PluginInfo {
    pub loaded: bool,
    pub path: String,
    pub name: String,
    pub version: String,
    pub abi_version: u32,
    /// Why it was refused; empty when loaded.
    pub message: String,
}

/// What kind of component a plugin registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComponentKind {
    Codec,
    Arch,
    Backend,
}

impl ComponentKind {
    fn raw(self) -> i32 {
        match self {
            ComponentKind::Codec => sys::CMF_COMPONENT_CODEC,
            ComponentKind::Arch => sys::CMF_COMPONENT_ARCH,
            ComponentKind::Backend => sys::CMF_COMPONENT_BACKEND,
        }
    }
}

/// A registered codec, arch or backend.
#[derive(Clone, Debug)]
pub struct ComponentInfo {
    pub kind: ComponentKind,
    pub name: String,
    pub version: String,
    /// Codecs: the CMF dtype id; others: -1.
    pub dtype_id: i32,
    pub abi_version: u32,
    pub detail: String,
    pub plugin_path: String,
}

impl Runtime {
    /// A runtime with the default options (default plugin dir, CMF_PLUGIN_PATH).
    pub fn new() -> Result<Runtime> {
        Runtime::with_options(&RuntimeOptions::default())
    }

    pub fn with_options(opts: &RuntimeOptions) -> Result<Runtime> {
        check_abi()?;
        let path = opts.plugin_path.as_deref().map(cstring).transpose()?;
        unsafe {
            let mut o: sys::cmf_runtime_options = std::mem::zeroed();
            sys::cmf_runtime_options_init(&mut o);
            o.n_threads = opts.threads;
            o.plugin_path = path.as_ref().map_or(ptr::null(), |p| p.as_ptr());
            if !opts.default_plugins {
                o.flags |= sys::CMF_RUNTIME_NO_DEFAULT_PLUGINS as u32;
            }
            if !opts.use_env {
                o.flags |= sys::CMF_RUNTIME_IGNORE_ENV as u32;
            }
            let mut out = ptr::null_mut();
            check(sys::cmf_runtime_create(&o, &mut out))?;
            Ok(Runtime { raw: NonNull::new(out).expect("cmf_runtime_create returned NULL") })
        }
    }

    /// Worker threads of the pool.
    pub fn threads(&self) -> i32 {
        unsafe { sys::cmf_runtime_threads(self.raw.as_ptr()) }
    }

    /// Loads one more plugin file.
    pub fn load_plugin(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = cpath(path.as_ref())?;
        check(unsafe { sys::cmf_runtime_load_plugin(self.raw.as_ptr(), p.as_ptr()) })
    }

    /// Plugin files seen, loaded or refused.
    pub fn plugins(&self) -> Result<Vec<PluginInfo>> {
        let rt = self.raw.as_ptr();
        let n = unsafe { sys::cmf_runtime_plugin_count(rt) };
        (0..n)
            .map(|i| unsafe {
                let mut c: sys::cmf_plugin_info = std::mem::zeroed();
                sys::cmf_plugin_info_init(&mut c);
                check(sys::cmf_runtime_plugin_info(rt, i, &mut c))?;
                Ok(PluginInfo {
                    loaded: c.status == sys::CMF_PLUGIN_STATUS_LOADED,
                    path: lossy(c.path),
                    name: lossy(c.name),
                    version: lossy(c.version),
                    abi_version: c.abi_version,
                    message: lossy(c.message),
                })
            })
            .collect()
    }

    /// Registered components of one kind.
    pub fn components(&self, kind: ComponentKind) -> Result<Vec<ComponentInfo>> {
        let rt = self.raw.as_ptr();
        let n = unsafe { sys::cmf_runtime_component_count(rt, kind.raw()) };
        (0..n)
            .map(|i| unsafe {
                let mut c: sys::cmf_component_info = std::mem::zeroed();
                sys::cmf_component_info_init(&mut c);
                check(sys::cmf_runtime_component_info(rt, kind.raw(), i, &mut c))?;
                Ok(ComponentInfo {
                    kind,
                    name: lossy(c.name),
                    version: lossy(c.version),
                    dtype_id: c.dtype_id,
                    abi_version: c.abi_version,
                    detail: lossy(c.detail),
                    plugin_path: lossy(c.plugin_path),
                })
            })
            .collect()
    }

    /// Opens a .cmf file (any shard of a sharded model).
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Model<'_>> {
        self.open_with(path, &OpenOptions::default())
    }

    pub fn open_with(&self, path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Model<'_>> {
        let p = cpath(path.as_ref())?;
        unsafe {
            let mut o: sys::cmf_open_options = std::mem::zeroed();
            sys::cmf_open_options_init(&mut o);
            if !opts.mmap {
                o.flags |= sys::CMF_OPEN_NO_MMAP as u32;
            }
            if !opts.merge_shards {
                o.flags |= sys::CMF_OPEN_NO_SHARD_MERGE as u32;
            }
            let mut out = ptr::null_mut();
            check(sys::cmf_open(self.raw.as_ptr(), p.as_ptr(), &o, &mut out))?;
            Ok(Model { raw: NonNull::new(out).expect("cmf_open returned NULL"), rt: self })
        }
    }

    /// Frees the runtime now (the same as dropping it).
    pub fn close(self) {}

    pub fn as_raw(&self) -> *mut sys::cmf_runtime {
        self.raw.as_ptr()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        unsafe { sys::cmf_runtime_free(self.raw.as_ptr()) }
    }
}

// ---- models ----------------------------------------------------------------

/// How to open a model.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Map the file (false: read it into memory).
    pub mmap: bool,
    /// Open a shard's siblings too (false: this shard alone).
    pub merge_shards: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { mmap: true, merge_shards: true }
    }
}

/// An opened CMF v2 container (`cmf_model`): immutable, shared freely
/// between threads, closed when dropped.
pub struct Model<'rt> {
    raw: NonNull<sys::cmf_model>,
    rt: &'rt Runtime,
}

// cmf.h: a model is immutable after cmf_open; every query on it is safe from
// any number of threads.
unsafe impl Send for Model<'_> {}
unsafe impl Sync for Model<'_> {}

/// A directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub index: usize,
    pub name: String,
    /// `sys::CMF_DTYPE_*`.
    pub dtype: i32,
    pub shape: Vec<u64>,
    pub shard: u32,
    pub nbytes: u64,
    pub hash: u64,
    /// Payload offset relative to its shard's data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Rows as cmf_tensor_dequantize counts them: shape[0] for 2-D and up, else 1.
    pub fn rows(&self) -> u64 {
        if self.shape.len() >= 2 {
            self.shape[0]
        } else {
            1
        }
    }
    /// Floats per row.
    pub fn row_len(&self) -> u64 {
        let dims = if self.shape.len() >= 2 { &self.shape[1..] } else { &self.shape[..] };
        dims.iter().product()
    }
}

/// Model-wide facts (`cmf_model_info`); JSON blocks as strings.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub version: u32,
    pub required_features: u32,
    pub file_size: u64,
    pub shard_count: u32,
    pub mask_count: u32,
    pub tensor_count: u64,
    pub skill_count: u64,
    pub header_hash: u64,
    pub dir_hash: u64,
    /// (offset, length) of shard 1's data section.
    pub data_section: (u64, u64),
    pub format: String,
    pub arch_name: String,
    pub quant_type: String,
    pub header_json: String,
    pub arch_json: String,
    pub tokenizer_config_json: String,
    pub skills_json: String,
    pub provenance_json: String,
}

/// Special token ids from the header's tokenizer config.
#[derive(Clone, Debug)]
pub struct SpecialIds {
    pub bos_id: Option<i32>,
    pub pad_id: Option<i32>,
    pub eos_ids: Vec<i32>,
    pub has_chat_template: bool,
}

/// What [`Model::verify`] checks.
#[derive(Default)]
pub struct VerifyOptions<'a> {
    /// 64-hex Ed25519 public keys or 16-hex fingerprints; with any, every
    /// file must carry a valid signature by one of them.
    pub trusted_keys: Vec<String>,
    /// Do not look for `<file>.sig`.
    pub skip_signature: bool,
    /// Hashed bytes (done, total); called from pool threads, never concurrently.
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
}

/// A valid detached signature found by verify.
#[derive(Clone, Debug)]
pub struct Signature {
    pub trusted: bool,
    pub file: String,
    pub pubkey_hex: String,
    pub fingerprint: String,
}

/// What verify found: no problems = every hash (and signature) checked out.
#[derive(Clone, Debug)]
pub struct VerifyReport {
    pub problems: Vec<String>,
    pub signatures: Vec<Signature>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

unsafe extern "C" fn progress_trampoline(user: *mut c_void, done: u64, total: u64) {
    let f = &*(user as *const &(dyn Fn(u64, u64) + Sync));
    // A panic must not unwind into C; the progress report is only advisory.
    let _ = catch_unwind(AssertUnwindSafe(|| f(done, total)));
}

impl<'rt> Model<'rt> {
    pub fn info(&self) -> Result<ModelInfo> {
        unsafe {
            let mut c: sys::cmf_model_info = std::mem::zeroed();
            sys::cmf_model_info_init(&mut c);
            check(sys::cmf_model_get_info(self.raw.as_ptr(), &mut c))?;
            let header = std::slice::from_raw_parts(c.header_json as *const u8, c.header_json_len as usize);
            Ok(ModelInfo {
                version: c.version,
                required_features: c.required_features,
                file_size: c.file_size,
                shard_count: c.shard_count,
                mask_count: c.mask_count,
                tensor_count: c.tensor_count,
                skill_count: c.skill_count,
                header_hash: c.header_hash,
                dir_hash: c.dir_hash,
                data_section: (c.data_off, c.data_len),
                format: lossy(c.format),
                arch_name: lossy(c.arch_name),
                quant_type: lossy(c.quant_type),
                header_json: String::from_utf8_lossy(header).into_owned(),
                arch_json: lossy(c.arch_json),
                tokenizer_config_json: lossy(c.tokenizer_config_json),
                skills_json: lossy(c.skills_json),
                provenance_json: lossy(c.provenance_json),
            })
        }
    }

    /// Paths of the shards as opened.
    pub fn shard_paths(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        loop {
            let p = unsafe { sys::cmf_model_shard_path(self.raw.as_ptr(), out.len() as u32) };
            if p.is_null() {
                return out;
            }
            let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
            out.push(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)));
        }
    }

    pub fn tensor_count(&self) -> usize {
        unsafe { sys::cmf_tensor_count(self.raw.as_ptr()) }
    }

    /// The directory in order (merged over shards).
    pub fn tensors(&self) -> impl Iterator<Item = Result<TensorInfo>> + '_ {
        (0..self.tensor_count()).map(move |i| self.tensor_at(i))
    }

    pub fn tensor_at(&self, index: usize) -> Result<TensorInfo> {
        unsafe {
            let mut c: sys::cmf_tensor_info = std::mem::zeroed();
            sys::cmf_tensor_info_init(&mut c);
            check(sys::cmf_tensor_at(self.raw.as_ptr(), index, &mut c))?;
            Ok(TensorInfo {
                index,
                name: lossy(c.name),
                dtype: c.dtype,
                shape: c.shape[..c.ndim as usize].to_vec(),
                shard: c.shard,
                nbytes: c.nbytes,
                hash: c.hash,
                offset: c.offset,
            })
        }
    }

    /// Directory index of a tensor by exact name.
    pub fn tensor_index(&self, name: &str) -> Result<usize> {
        let n = cstring(name)?;
        let mut index = 0usize;
        check(unsafe { sys::cmf_tensor_index(self.raw.as_ptr(), n.as_ptr(), &mut index) })?;
        Ok(index)
    }

    /// A tensor by exact name (`MissingTensor` if absent).
    pub fn tensor(&self, name: &str) -> Result<TensorInfo> {
        self.tensor_at(self.tensor_index(name)?)
    }

    /// The stored payload, borrowed from the mapping for as long as the model.
    pub fn payload(&self, index: usize) -> Result<&[u8]> {
        unsafe {
            let mut c: sys::cmf_tensor_info = std::mem::zeroed();
            sys::cmf_tensor_info_init(&mut c);
            check(sys::cmf_tensor_at(self.raw.as_ptr(), index, &mut c))?;
            if c.nbytes == 0 {
                return Ok(&[]);
            }
            Ok(std::slice::from_raw_parts(c.data as *const u8, c.nbytes as usize))
        }
    }

    /// The whole tensor decoded to f32 through its codec.
    pub fn dequantize(&self, index: usize) -> Result<Vec<f32>> {
        let t = self.tensor_at(index)?;
        self.dequantize_rows(index, 0..t.rows())
    }

    /// Rows [begin, end) of shape[0] decoded to f32 (row-major).
    pub fn dequantize_rows(&self, index: usize, rows: Range<u64>) -> Result<Vec<f32>> {
        let t = self.tensor_at(index)?;
        if rows.start > rows.end || rows.end > t.rows() {
            return Err(Error::new(
                sys::CMF_ERR_INVALID_ARGUMENT,
                format!("{}: rows [{}, {}) outside [0, {})", t.name, rows.start, rows.end, t.rows()),
            ));
        }
        let n = ((rows.end - rows.start) * t.row_len()) as usize;
        let mut out = vec![0f32; n];
        self.dequantize_into(index, rows, &mut out)?;
        Ok(out)
    }

    /// Rows [begin, end) into `dst` (which must hold them).
    pub fn dequantize_into(&self, index: usize, rows: Range<u64>, dst: &mut [f32]) -> Result<()> {
        check(unsafe {
            sys::cmf_tensor_dequantize(
                self.raw.as_ptr(),
                index,
                rows.start,
                rows.end,
                dst.as_mut_ptr(),
                dst.len() as u64,
            )
        })
    }

    /// Checks every hash and, unless skipped, `<file>.sig`.
    pub fn verify(&self, opts: &VerifyOptions<'_>) -> Result<VerifyReport> {
        let keys: Vec<CString> = opts.trusted_keys.iter().map(|k| cstring(k)).collect::<Result<_>>()?;
        let key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let progress = opts.progress;
        unsafe {
            let mut o: sys::cmf_verify_options = std::mem::zeroed();
            sys::cmf_verify_options_init(&mut o);
            if opts.skip_signature {
                o.flags |= sys::CMF_VERIFY_SKIP_SIGNATURE as u32;
            }
            if !key_ptrs.is_empty() {
                o.trusted_keys = key_ptrs.as_ptr();
                o.n_trusted_keys = key_ptrs.len();
            }
            if let Some(f) = progress.as_ref() {
                o.progress = Some(progress_trampoline);
                o.progress_user = f as *const &(dyn Fn(u64, u64) + Sync) as *mut c_void;
            }
            let mut report = ptr::null_mut();
            check(sys::cmf_verify(self.raw.as_ptr(), &o, &mut report))?;
            let result = (|| {
                let problems = (0..sys::cmf_verify_problem_count(report))
                    .map(|i| lossy(sys::cmf_verify_problem(report, i)))
                    .collect();
                let mut signatures = Vec::new();
                for i in 0..sys::cmf_verify_signature_count(report) {
                    let mut c: sys::cmf_signature_info = std::mem::zeroed();
                    sys::cmf_signature_info_init(&mut c);
                    check(sys::cmf_verify_signature_at(report, i, &mut c))?;
                    signatures.push(Signature {
                        trusted: c.trusted != 0,
                        file: lossy(c.file),
                        pubkey_hex: lossy(c.pubkey_hex),
                        fingerprint: lossy(c.fingerprint),
                    });
                }
                Ok(VerifyReport { problems, signatures })
            })();
            sys::cmf_verify_report_free(report);
            result
        }
    }

    /// The file's own tokenizer (`NotFound` without a vocab section); it
    /// does not borrow the model.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let mut out = ptr::null_mut();
        check(unsafe { sys::cmf_model_tokenizer(self.raw.as_ptr(), &mut out) })?;
        Ok(Tokenizer { raw: NonNull::new(out).expect("cmf_model_tokenizer returned NULL") })
    }

    pub fn special_ids(&self) -> Result<SpecialIds> {
        unsafe {
            let mut c: sys::cmf_model_special_ids = std::mem::zeroed();
            sys::cmf_model_special_ids_init(&mut c);
            check(sys::cmf_model_get_special_ids(self.raw.as_ptr(), &mut c))?;
            Ok(SpecialIds {
                bos_id: if c.bos_id >= 0 { Some(c.bos_id) } else { None },
                pad_id: if c.pad_id >= 0 { Some(c.pad_id) } else { None },
                eos_ids: c.eos_ids[..c.n_eos_ids as usize].to_vec(),
                has_chat_template: c.has_chat_template != 0,
            })
        }
    }

    /// The file's chat template over (role, content) messages.
    pub fn render_chat(&self, messages: &[(&str, &str)], add_generation_prompt: bool) -> Result<String> {
        let mut ctx = String::from("{\"messages\":[");
        for (i, (role, content)) in messages.iter().enumerate() {
            if i > 0 {
                ctx.push(',');
            }
            ctx.push_str("{\"role\":");
            json_string(&mut ctx, role);
            ctx.push_str(",\"content\":");
            json_string(&mut ctx, content);
            ctx.push('}');
        }
        ctx.push_str("],\"add_generation_prompt\":");
        ctx.push_str(if add_generation_prompt { "true}" } else { "false}" });
        self.render_chat_json(&ctx)
    }

    /// The file's chat template with a JSON context ({"messages": [...], ...}).
    pub fn render_chat_json(&self, context_json: &str) -> Result<String> {
        let mut out = ptr::null_mut();
        let mut len = 0usize;
        unsafe {
            check(sys::cmf_model_render_chat(
                self.raw.as_ptr(),
                context_json.as_ptr() as *const c_char,
                context_json.len(),
                &mut out,
                &mut len,
            ))?;
            take_string(out, len)
        }
    }

    /// A generation session over this model.
    pub fn session(&self, opts: &SessionOptions) -> Result<Session<'_>> {
        Session::new(self, opts)
    }

    /// Closes the model now (the same as dropping it).
    pub fn close(self) {}

    pub fn as_raw(&self) -> *mut sys::cmf_model {
        self.raw.as_ptr()
    }
}

impl Drop for Model<'_> {
    fn drop(&mut self) {
        unsafe { sys::cmf_close(self.raw.as_ptr()) }
    }
}

/// Appends `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---- text ------------------------------------------------------------------

/// A Hugging Face tokenizer.json (`cmf_tokenizer`): immutable, shared freely.
pub struct Tokenizer {
    raw: NonNull<sys::cmf_tokenizer>,
}

// cmf.h: a cmf_tokenizer is immutable after creation; encode/decode/lookups
// may run concurrently from any number of threads.
unsafe impl Send for Tokenizer {}
unsafe impl Sync for Tokenizer {}

impl Tokenizer {
    /// Parses tokenizer.json bytes.
    pub fn from_json(json: &[u8]) -> Result<Tokenizer> {
        check_abi()?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::cmf_tokenizer_create(json.as_ptr() as *const c_char, json.len(), &mut out) })?;
        Ok(Tokenizer { raw: NonNull::new(out).expect("cmf_tokenizer_create returned NULL") })
    }

    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<i32>> {
        let flags = if add_special { sys::CMF_ENCODE_ADD_SPECIAL as u32 } else { 0 };
        let mut ids = ptr::null_mut();
        let mut n = 0usize;
        unsafe {
            check(sys::cmf_tokenizer_encode(
                self.raw.as_ptr(),
                text.as_ptr() as *const c_char,
                text.len(),
                flags,
                &mut ids,
                &mut n,
            ))?;
            let out = if n == 0 { Vec::new() } else { std::slice::from_raw_parts(ids, n).to_vec() };
            sys::cmf_ids_free(ids);
            Ok(out)
        }
    }

    pub fn decode(&self, ids: &[i32], skip_special: bool) -> Result<String> {
        let flags = if skip_special { sys::CMF_DECODE_SKIP_SPECIAL as u32 } else { 0 };
        let mut out = ptr::null_mut();
        let mut len = 0usize;
        unsafe {
            check(sys::cmf_tokenizer_decode(self.raw.as_ptr(), ids.as_ptr(), ids.len(), flags, &mut out, &mut len))?;
            take_string(out, len)
        }
    }

    /// One past the largest token id.
    pub fn vocab_size(&self) -> usize {
        unsafe { sys::cmf_tokenizer_vocab_size(self.raw.as_ptr()) }
    }

    pub fn token_to_id(&self, token: &str) -> Result<i32> {
        let mut id = 0i32;
        check(unsafe {
            sys::cmf_tokenizer_token_to_id(self.raw.as_ptr(), token.as_ptr() as *const c_char, token.len(), &mut id)
        })?;
        Ok(id)
    }

    pub fn id_to_token(&self, id: i32) -> Result<String> {
        let mut out = ptr::null_mut();
        let mut len = 0usize;
        unsafe {
            check(sys::cmf_tokenizer_id_to_token(self.raw.as_ptr(), id, &mut out, &mut len))?;
            take_string(out, len)
        }
    }

    pub fn is_special(&self, id: i32) -> bool {
        unsafe { sys::cmf_tokenizer_is_special(self.raw.as_ptr(), id) != 0 }
    }

    /// A streaming detokenizer borrowing this tokenizer.
    pub fn detokenizer(&self, skip_special: bool) -> Result<Detokenizer<'_>> {
        let flags = if skip_special { sys::CMF_DECODE_SKIP_SPECIAL as u32 } else { 0 };
        let mut out = ptr::null_mut();
        check(unsafe { sys::cmf_detokenizer_create(self.raw.as_ptr(), flags, &mut out) })?;
        Ok(Detokenizer {
            raw: NonNull::new(out).expect("cmf_detokenizer_create returned NULL"),
            _t: PhantomData,
            _not_sync: PhantomData,
        })
    }

    pub fn close(self) {}
}

impl Drop for Tokenizer {
    fn drop(&mut self) {
        unsafe { sys::cmf_tokenizer_free(self.raw.as_ptr()) }
    }
}

/// Streaming ids -> text that never splits a UTF-8 character. One thread
/// at a time (`Send`, not `Sync`).
pub struct Detokenizer<'t> {
    raw: NonNull<sys::cmf_detokenizer>,
    _t: PhantomData<&'t Tokenizer>,
    _not_sync: PhantomData<Cell<()>>,
}

// cmf.h: a cmf_detokenizer is used by one thread at a time; moving it to
// another thread is fine.
unsafe impl Send for Detokenizer<'_> {}

impl Detokenizer<'_> {
    /// The text `id` completes (may be empty while a character is unfinished).
    pub fn push(&mut self, id: i32) -> Result<String> {
        let mut out = ptr::null_mut();
        let mut len = 0usize;
        unsafe {
            check(sys::cmf_detokenizer_push(self.raw.as_ptr(), id, &mut out, &mut len))?;
            take_string(out, len)
        }
    }

    /// Everything still held; resets the stream.
    pub fn finish(&mut self) -> Result<String> {
        let mut out = ptr::null_mut();
        let mut len = 0usize;
        unsafe {
            check(sys::cmf_detokenizer_finish(self.raw.as_ptr(), &mut out, &mut len))?;
            take_string(out, len)
        }
    }

    pub fn close(self) {}
}

impl Drop for Detokenizer<'_> {
    fn drop(&mut self) {
        unsafe { sys::cmf_detokenizer_free(self.raw.as_ptr()) }
    }
}

/// Renders a Hugging Face chat template (Jinja) over a JSON object of
/// template variables; `template` None = ChatML; `now_unix` the time
/// strftime_now formats (None = now).
pub fn chat_render(template: Option<&str>, context_json: &str, now_unix: Option<i64>) -> Result<String> {
    check_abi()?;
    let (tp, tl) = template.map_or((ptr::null(), 0), |t| (t.as_ptr() as *const c_char, t.len()));
    let mut out = ptr::null_mut();
    let mut len = 0usize;
    unsafe {
        let mut o: sys::cmf_chat_options = std::mem::zeroed();
        sys::cmf_chat_options_init(&mut o);
        if let Some(t) = now_unix {
            o.now_unix = t;
        }
        check(sys::cmf_chat_render(
            tp,
            tl,
            context_json.as_ptr() as *const c_char,
            context_json.len(),
            &o,
            &mut out,
            &mut len,
        ))?;
        take_string(out, len)
    }
}

/// Writes a new Ed25519 key (`key_path`) and its public half (`key_path`.pub).
pub fn sign_keygen(key_path: impl AsRef<Path>) -> Result<()> {
    let p = cpath(key_path.as_ref())?;
    check(unsafe { sys::cmf_sign_keygen(p.as_ptr()) })
}

/// Writes `file`.sig; returns the signer's 16-hex fingerprint.
pub fn sign_file(file: impl AsRef<Path>, key_path: impl AsRef<Path>) -> Result<String> {
    let f = cpath(file.as_ref())?;
    let k = cpath(key_path.as_ref())?;
    let mut fp = [0 as c_char; 17];
    check(unsafe { sys::cmf_sign_file(f.as_ptr(), k.as_ptr(), fp.as_mut_ptr()) })?;
    Ok(unsafe { lossy(fp.as_ptr()) })
}

// ---- sessions --------------------------------------------------------------

/// How to create a [`Session`].
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// Context tokens; 0 = min(model maximum, 4096).
    pub n_ctx: u64,
    /// Prefill tokens per forward pass; 0 = the library default.
    pub n_batch: u32,
    /// Backend name; None = the default backend.
    pub backend: Option<String>,
    /// Arch-specific "key=value,..." (e.g. the qwen arch's "kv_cache=f16").
    pub arch_options: Option<String>,
}

/// Sampling and stopping for one [`Session::generate`] call; `Default` is
/// the library's defaults (cmf_generate_options_init).
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// 0 = until a stop id or the context is full.
    pub max_tokens: u32,
    /// < 1e-6 = greedy.
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub seed: u64,
    /// None = the model's eos ids; Some(vec![]) = no stop ids.
    pub stop_ids: Option<Vec<i32>>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        let mut c: sys::cmf_generate_options = unsafe { std::mem::zeroed() };
        unsafe { sys::cmf_generate_options_init(&mut c) };
        GenerateOptions {
            max_tokens: c.max_tokens,
            temperature: c.temperature,
            top_k: c.top_k,
            top_p: c.top_p,
            min_p: c.min_p,
            repetition_penalty: c.repetition_penalty,
            presence_penalty: c.presence_penalty,
            seed: c.seed,
            stop_ids: None,
        }
    }
}

impl GenerateOptions {
    /// Greedy decoding without penalties, up to `max_tokens`.
    pub fn greedy(max_tokens: u32) -> Self {
        GenerateOptions { max_tokens, temperature: 0.0, repetition_penalty: 1.0, ..Default::default() }
    }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    Eos,
    Callback,
    Cancelled,
    ContextFull,
    Other(i32),
}

impl StopReason {
    fn from_raw(r: i32) -> StopReason {
        match r {
            sys::CMF_STOP_MAX_TOKENS => StopReason::MaxTokens,
            sys::CMF_STOP_EOS => StopReason::Eos,
            sys::CMF_STOP_CALLBACK => StopReason::Callback,
            sys::CMF_STOP_CANCELLED => StopReason::Cancelled,
            sys::CMF_STOP_CONTEXT_FULL => StopReason::ContextFull,
            other => StopReason::Other(other),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GenerateStats {
    pub stop_reason: StopReason,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub n_past: u64,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

/// The C session, shared by a Session and its Cancellers; freed when the
/// last of them goes (all are bounded by the model's lifetime).
struct SessionHandle {
    raw: NonNull<sys::cmf_session>,
}

// cmf_session_cancel may be called from any thread; every other call goes
// through &mut Session (one thread at a time).
unsafe impl Send for SessionHandle {}
unsafe impl Sync for SessionHandle {}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        unsafe { sys::cmf_session_free(self.raw.as_ptr()) }
    }
}

/// A model bound to its arch on a backend, with one context (KV cache).
/// One thread at a time (`Send`, not `Sync`); [`Session::canceller`] hands
/// out a `Send + Sync` handle that stops a running generation.
pub struct Session<'m> {
    handle: Arc<SessionHandle>,
    model: &'m Model<'m>,
    eos: Option<Vec<i32>>,
    _not_sync: PhantomData<Cell<()>>,
}

/// Stops a running [`Session::generate`] at its next token, from any thread.
/// A cancel while nothing runs is dropped: the next generate starts clean.
#[derive(Clone)]
pub struct Canceller<'m> {
    handle: Arc<SessionHandle>,
    _model: PhantomData<&'m ()>,
}

impl Canceller<'_> {
    pub fn cancel(&self) {
        unsafe { sys::cmf_session_cancel(self.handle.raw.as_ptr()) }
    }
}

struct TokenSink<'f> {
    f: &'f mut dyn FnMut(i32) -> ControlFlow<()>,
    panic: Option<Box<dyn std::any::Any + Send>>,
}

unsafe extern "C" fn token_trampoline(user: *mut c_void, token: i32) -> i32 {
    let sink = &mut *(user as *mut TokenSink<'_>);
    match catch_unwind(AssertUnwindSafe(|| (sink.f)(token))) {
        Ok(ControlFlow::Continue(())) => 0,
        Ok(ControlFlow::Break(())) => 1,
        Err(payload) => {
            // Stop, and resume the panic on the Rust side of the C call.
            sink.panic = Some(payload);
            1
        }
    }
}

impl<'m> Session<'m> {
    fn new(model: &'m Model<'m>, opts: &SessionOptions) -> Result<Session<'m>> {
        let backend = opts.backend.as_deref().map(cstring).transpose()?;
        let arch = opts.arch_options.as_deref().map(cstring).transpose()?;
        unsafe {
            let mut o: sys::cmf_session_options = std::mem::zeroed();
            sys::cmf_session_options_init(&mut o);
            o.n_ctx = opts.n_ctx;
            if opts.n_batch != 0 {
                o.n_batch = opts.n_batch;
            }
            o.backend = backend.as_ref().map_or(ptr::null(), |b| b.as_ptr());
            o.arch_options = arch.as_ref().map_or(ptr::null(), |a| a.as_ptr());
            let rt = model.rt.raw.as_ptr();
            let mut out = ptr::null_mut();
            check(sys::cmf_session_create_for_model(rt, model.raw.as_ptr(), &o, &mut out))?;
            Ok(Session {
                handle: Arc::new(SessionHandle { raw: NonNull::new(out).expect("cmf_session_create returned NULL") }),
                model,
                eos: None,
                _not_sync: PhantomData,
            })
        }
    }

    fn raw(&self) -> *mut sys::cmf_session {
        self.handle.raw.as_ptr()
    }

    /// A handle that cancels this session's running generation from any thread.
    pub fn canceller(&self) -> Canceller<'m> {
        Canceller { handle: Arc::clone(&self.handle), _model: PhantomData }
    }

    /// Appends `prompt` and samples until max_tokens, a stop id, `on_token`
    /// returning Break, a cancel, or a full context. Generated tokens stay
    /// in the context. A panic in `on_token` stops generation and resumes
    /// after the C call returns.
    pub fn generate<F>(&mut self, prompt: &[i32], opts: &GenerateOptions, mut on_token: F) -> Result<GenerateStats>
    where
        F: FnMut(i32) -> ControlFlow<()>,
    {
        if opts.stop_ids.is_none() && self.eos.is_none() {
            self.eos = Some(self.model.special_ids()?.eos_ids);
        }
        let stops: &[i32] = match &opts.stop_ids {
            Some(s) => s,
            None => self.eos.as_deref().unwrap_or(&[]),
        };
        let mut sink = TokenSink { f: &mut on_token, panic: None };
        let mut st: sys::cmf_generate_stats = unsafe { std::mem::zeroed() };
        let r = unsafe {
            let mut o: sys::cmf_generate_options = std::mem::zeroed();
            sys::cmf_generate_options_init(&mut o);
            o.max_tokens = opts.max_tokens;
            o.temperature = opts.temperature;
            o.top_k = opts.top_k;
            o.top_p = opts.top_p;
            o.min_p = opts.min_p;
            o.repetition_penalty = opts.repetition_penalty;
            o.presence_penalty = opts.presence_penalty;
            o.seed = opts.seed;
            o.stop_ids = stops.as_ptr();
            o.n_stop_ids = stops.len();
            o.on_token = Some(token_trampoline);
            o.user = &mut sink as *mut TokenSink<'_> as *mut c_void;
            sys::cmf_generate_stats_init(&mut st);
            sys::cmf_session_generate(self.raw(), prompt.as_ptr(), prompt.len(), &o, &mut st)
        };
        if let Some(p) = sink.panic.take() {
            let _ = check(r);
            resume_unwind(p);
        }
        check(r)?;
        Ok(GenerateStats {
            stop_reason: StopReason::from_raw(st.stop_reason),
            prompt_tokens: st.prompt_tokens,
            generated_tokens: st.generated_tokens,
            n_past: st.n_past,
            prefill_seconds: st.prefill_seconds,
            decode_seconds: st.decode_seconds,
            prefill_tok_s: st.prefill_tok_s,
            decode_tok_s: st.decode_tok_s,
        })
    }

    /// Encodes `text` with the model's tokenizer, generates, and streams the
    /// text to `on_text` piece by piece (never a split UTF-8 character).
    pub fn generate_text<F>(&mut self, text: &str, opts: &GenerateOptions, mut on_text: F) -> Result<GenerateStats>
    where
        F: FnMut(&str) -> ControlFlow<()>,
    {
        let tok = self.model.tokenizer()?;
        let prompt = tok.encode(text, false)?;
        let mut detok = tok.detokenizer(false)?;
        let mut failure = None;
        let stats = self.generate(&prompt, opts, |id| match detok.push(id) {
            Ok(piece) if piece.is_empty() => ControlFlow::Continue(()),
            Ok(piece) => on_text(&piece),
            Err(e) => {
                failure = Some(e);
                ControlFlow::Break(())
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        let tail = detok.finish()?;
        if !tail.is_empty() {
            let _ = on_text(&tail);
        }
        Ok(stats)
    }

    /// Empties the context.
    pub fn reset(&mut self) -> Result<()> {
        check(unsafe { sys::cmf_session_reset(self.raw()) })
    }

    /// Keeps the first n_keep tokens of the context.
    pub fn truncate(&mut self, n_keep: u64) -> Result<()> {
        check(unsafe { sys::cmf_session_truncate(self.raw(), n_keep) })
    }

    /// Appends tokens; returns the last position's logits (vocab floats) or,
    /// with `all`, every position's (tokens.len() x vocab).
    pub fn eval(&mut self, tokens: &[i32], all: bool) -> Result<Vec<f32>> {
        let vocab = self.vocab_size() as usize;
        let n = if all { vocab * tokens.len() } else { vocab };
        let mut out = vec![0f32; n];
        let mode = if all { sys::CMF_LOGITS_ALL } else { sys::CMF_LOGITS_LAST };
        check(unsafe {
            sys::cmf_session_eval(self.raw(), tokens.as_ptr(), tokens.len(), mode, out.as_mut_ptr(), out.len())
        })?;
        Ok(out)
    }

    pub fn vocab_size(&self) -> u64 {
        unsafe { sys::cmf_session_vocab_size(self.raw()) }
    }

    pub fn n_ctx(&self) -> u64 {
        unsafe { sys::cmf_session_n_ctx(self.raw()) }
    }

    pub fn n_past(&self) -> u64 {
        unsafe { sys::cmf_session_n_past(self.raw()) }
    }

    /// The model this session runs.
    pub fn model(&self) -> &'m Model<'m> {
        self.model
    }

    /// Frees the session now (a Canceller still alive keeps it until dropped).
    pub fn close(self) {}
}
