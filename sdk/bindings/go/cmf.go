// Package cmf is the Go binding of the cmf host API (abi/cmf/cmf.h): CMF v2
// model files, their tensors, tokenizer and chat template, and generation.
//
//	rt, _ := cmf.NewRuntime(nil)
//	defer rt.Close()
//	model, _ := rt.Open("model.cmf", nil)
//	s, _ := model.NewSession(nil)
//	s.GenerateText(ctx, "It is a truth universally acknowledged, that", cmf.Greedy(40),
//		func(piece string) bool { fmt.Print(piece); return false })
//
// Errors are *Error values carrying the cmf error code and message. The
// header keeps no thread-local error state, so a goroutine moving between
// OS threads across calls is fine.
//
// Every handle is released exactly once: by Close (idempotent), or, as a
// safety net only, by a finalizer when it becomes unreachable. Closing a
// parent closes what was opened from it first (a runtime's models, a
// model's sessions, a tokenizer's detokenizers); a closed handle returns an
// *Error instead of touching freed memory, and Close waits for calls
// running on other goroutines (a session's Close cancels its generation).
//
// Thread-safety follows cmf.h: Runtime, Model and Tokenizer may be used by
// any number of goroutines at once; a Session or a Detokenizer serves one
// call at a time (a concurrent call returns an *Error with code
// ErrInvalidArgument), except Session.Cancel, which any goroutine may call.
//
// Building needs libcmf's development files: `pkg-config cmf` must find
// them (set PKG_CONFIG_PATH for a non-standard prefix).
package cmf

/*
#cgo pkg-config: cmf
#include <cmf/cmf.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Error codes (cmf_types.h CMF_ERR_*).
const (
	ErrInvalidArgument    = int32(C.CMF_ERR_INVALID_ARGUMENT)
	ErrIO                 = int32(C.CMF_ERR_IO)
	ErrFileNotFound       = int32(C.CMF_ERR_FILE_NOT_FOUND)
	ErrInvalidMagic       = int32(C.CMF_ERR_INVALID_MAGIC)
	ErrUnsupportedVersion = int32(C.CMF_ERR_UNSUPPORTED_VERSION)
	ErrUnsupportedFeature = int32(C.CMF_ERR_UNSUPPORTED_FEATURE)
	ErrUnknownDtype       = int32(C.CMF_ERR_UNKNOWN_DTYPE)
	ErrMissingTensor      = int32(C.CMF_ERR_MISSING_TENSOR)
	ErrBounds             = int32(C.CMF_ERR_BOUNDS)
	ErrParse              = int32(C.CMF_ERR_PARSE)
	ErrHashMismatch       = int32(C.CMF_ERR_HASH_MISMATCH)
	ErrSignature          = int32(C.CMF_ERR_SIGNATURE)
	ErrPlugin             = int32(C.CMF_ERR_PLUGIN)
	ErrUnsupported        = int32(C.CMF_ERR_UNSUPPORTED)
	ErrOutOfMemory        = int32(C.CMF_ERR_OUT_OF_MEMORY)
	ErrCancelled          = int32(C.CMF_ERR_CANCELLED)
	ErrNotFound           = int32(C.CMF_ERR_NOT_FOUND)
	ErrTemplate           = int32(C.CMF_ERR_TEMPLATE)
	ErrInternal           = int32(C.CMF_ERR_INTERNAL)
)

// Error is a cmf error: Code (Err*), Name (its stable spelling, e.g.
// "MissingTensor") and the library's Message.
type Error struct {
	Code    int32
	Name    string
	Message string
}

func (e *Error) Error() string { return e.Name + ": " + e.Message }

func newError(code int32, format string, args ...interface{}) *Error {
	return &Error{Code: code, Name: CodeName(code), Message: fmt.Sprintf(format, args...)}
}

// CodeName is the stable name of an error code, e.g. 8 -> "MissingTensor".
func CodeName(code int32) string { return C.GoString(C.cmf_error_code_name(C.int32_t(code))) }

// check turns a returned cmf_error * into *Error (and frees it).
func check(e *C.cmf_error) error {
	if e == nil {
		return nil
	}
	err := &Error{Code: int32(C.cmf_error_code(e)), Message: C.GoString(C.cmf_error_message(e))}
	err.Name = CodeName(err.Code)
	C.cmf_error_free(e)
	return err
}

// takeString copies a library-allocated string, then frees it.
func takeString(p *C.char, n C.size_t) string {
	if p == nil {
		return ""
	}
	s := C.GoStringN(p, C.int(n))
	C.cmf_string_free(p)
	return s
}

// ABIVersion is the host ABI version of the linked libcmf.
func ABIVersion() uint32 { return uint32(C.cmf_abi_version()) }

// Version is libcmf's version string, e.g. "0.1.0".
func Version() string { return C.GoString(C.cmf_version_string()) }

func checkABI() error {
	if have := ABIVersion(); have < C.CMF_ABI_VERSION {
		return newError(ErrUnsupported, "libcmf speaks host ABI %d, this binding needs >= %d", have, C.CMF_ABI_VERSION)
	}
	return nil
}

// ---- handles ----------------------------------------------------------------

// handle owns one C object. Calls hold mu shared (acquire/release); the
// free holds it exclusively, so it waits for running calls. Parents list
// their children to close them first; children do not point back at the
// parent's public value, so the garbage collector's ordered finalization
// (a child keeps its parent's public value alive) never meets a cycle.
type handle struct {
	kind      string
	exclusive bool // one call at a time (Session, Detokenizer)
	mu        sync.RWMutex
	busy      sync.Mutex // exclusive handles: held by the running call
	closed    atomic.Bool
	ptrMu     sync.Mutex // guards ptr for cancel, which runs outside mu
	ptr       unsafe.Pointer
	free      func(unsafe.Pointer)
	cancel    func(unsafe.Pointer)
	childMu   sync.Mutex
	children  map[*handle]struct{}
	parent    *handle
}

func newHandle(kind string, ptr unsafe.Pointer, free func(unsafe.Pointer), parent *handle) (*handle, error) {
	h := &handle{kind: kind, ptr: ptr, free: free, parent: parent}
	if parent != nil {
		parent.childMu.Lock()
		defer parent.childMu.Unlock()
		if parent.closed.Load() {
			free(ptr)
			return nil, newError(ErrInvalidArgument, "the %s is closed", parent.kind)
		}
		if parent.children == nil {
			parent.children = map[*handle]struct{}{}
		}
		parent.children[h] = struct{}{}
	}
	return h, nil
}

// acquire starts a call: the C pointer, valid until release.
func (h *handle) acquire() (unsafe.Pointer, error) {
	h.mu.RLock()
	if h.closed.Load() {
		h.mu.RUnlock()
		return nil, newError(ErrInvalidArgument, "the %s is closed", h.kind)
	}
	if h.exclusive && !h.busy.TryLock() {
		h.mu.RUnlock()
		return nil, newError(ErrInvalidArgument, "the %s is already in use (cmf.h: one call at a time)", h.kind)
	}
	return h.ptr, nil
}

func (h *handle) release() {
	if h.exclusive {
		h.busy.Unlock()
	}
	h.mu.RUnlock()
}

func (h *handle) cancelNow() {
	h.ptrMu.Lock()
	if h.ptr != nil && h.cancel != nil {
		h.cancel(h.ptr)
	}
	h.ptrMu.Unlock()
}

func (h *handle) close() {
	if !h.closed.CompareAndSwap(false, true) {
		return
	}
	h.childMu.Lock()
	kids := make([]*handle, 0, len(h.children))
	for k := range h.children {
		kids = append(kids, k)
	}
	h.childMu.Unlock()
	for _, k := range kids {
		k.close()
	}
	// Wait for running calls; a running generation is cancelled (again,
	// should it have started after the first cancel).
	for !h.mu.TryLock() {
		h.cancelNow()
		time.Sleep(time.Millisecond)
	}
	h.ptrMu.Lock()
	p := h.ptr
	h.ptr = nil
	h.ptrMu.Unlock()
	h.free(p)
	h.mu.Unlock()
	if h.parent != nil {
		h.parent.childMu.Lock()
		delete(h.parent.children, h)
		h.parent.childMu.Unlock()
	}
}

// ---- runtime ------------------------------------------------------------------

// RuntimeOptions configures NewRuntime; nil means the defaults.
type RuntimeOptions struct {
	PluginPath       string // extra ':'-separated plugin dirs or .so files, scanned first
	Threads          int    // pool threads; 0 = the machine's physical cores
	NoDefaultPlugins bool   // do not scan the plugin dir installed next to libcmf
	IgnoreEnv        bool   // ignore CMF_PLUGIN_PATH / CMF_THREADS
}

// Runtime holds the loaded plugins, their registry and the thread pool.
// Safe for concurrent use.
type Runtime struct{ h *handle }

// PluginInfo describes a plugin file the runtime saw, loaded or refused.
type PluginInfo struct {
	Loaded     bool
	Path       string
	Name       string
	Version    string
	ABIVersion uint32
	Message    string // why it was refused; "" when loaded
}

// ComponentKind is what a plugin registered.
type ComponentKind int32

const (
	Codec   ComponentKind = C.CMF_COMPONENT_CODEC
	Arch    ComponentKind = C.CMF_COMPONENT_ARCH
	Backend ComponentKind = C.CMF_COMPONENT_BACKEND
)

// ComponentInfo describes a registered codec, arch or backend.
type ComponentInfo struct {
	Kind       ComponentKind
	Name       string
	Version    string
	DtypeID    int32 // codecs: the CMF dtype id; others -1
	ABIVersion uint32
	Detail     string
	PluginPath string
}

// NewRuntime creates a runtime: plugins from opts.PluginPath, then
// CMF_PLUGIN_PATH, then the default plugin dir.
func NewRuntime(opts *RuntimeOptions) (*Runtime, error) {
	if err := checkABI(); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &RuntimeOptions{}
	}
	var o C.cmf_runtime_options
	C.cmf_runtime_options_init(&o)
	o.n_threads = C.int32_t(opts.Threads)
	if opts.PluginPath != "" {
		o.plugin_path = C.CString(opts.PluginPath)
		defer C.free(unsafe.Pointer(o.plugin_path))
	}
	if opts.NoDefaultPlugins {
		o.flags |= C.CMF_RUNTIME_NO_DEFAULT_PLUGINS
	}
	if opts.IgnoreEnv {
		o.flags |= C.CMF_RUNTIME_IGNORE_ENV
	}
	var out *C.cmf_runtime
	if err := check(C.cmf_runtime_create(&o, &out)); err != nil {
		return nil, err
	}
	h, _ := newHandle("runtime", unsafe.Pointer(out), func(p unsafe.Pointer) { C.cmf_runtime_free((*C.cmf_runtime)(p)) }, nil)
	r := &Runtime{h}
	runtime.SetFinalizer(r, (*Runtime).Close)
	return r, nil
}

// Close frees the runtime after closing every model opened on it. Idempotent.
func (r *Runtime) Close() error {
	r.h.close()
	runtime.SetFinalizer(r, nil)
	return nil
}

func (r *Runtime) ptr() (*C.cmf_runtime, error) {
	p, err := r.h.acquire()
	return (*C.cmf_runtime)(p), err
}

// Threads is the pool's worker count.
func (r *Runtime) Threads() (int, error) {
	p, err := r.ptr()
	if err != nil {
		return 0, err
	}
	defer r.h.release()
	return int(C.cmf_runtime_threads(p)), nil
}

// LoadPlugin loads one more plugin file.
func (r *Runtime) LoadPlugin(path string) error {
	p, err := r.ptr()
	if err != nil {
		return err
	}
	defer r.h.release()
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	return check(C.cmf_runtime_load_plugin(p, cs))
}

// Plugins lists the plugin files seen, loaded or refused.
func (r *Runtime) Plugins() ([]PluginInfo, error) {
	p, err := r.ptr()
	if err != nil {
		return nil, err
	}
	defer r.h.release()
	n := int(C.cmf_runtime_plugin_count(p))
	out := make([]PluginInfo, 0, n)
	for i := 0; i < n; i++ {
		var c C.cmf_plugin_info
		C.cmf_plugin_info_init(&c)
		if err := check(C.cmf_runtime_plugin_info(p, C.size_t(i), &c)); err != nil {
			return nil, err
		}
		out = append(out, PluginInfo{
			Loaded: c.status == C.CMF_PLUGIN_STATUS_LOADED, Path: C.GoString(c.path), Name: C.GoString(c.name),
			Version: C.GoString(c.version), ABIVersion: uint32(c.abi_version), Message: C.GoString(c.message),
		})
	}
	return out, nil
}

// Components lists the registered components of one kind.
func (r *Runtime) Components(kind ComponentKind) ([]ComponentInfo, error) {
	p, err := r.ptr()
	if err != nil {
		return nil, err
	}
	defer r.h.release()
	n := int(C.cmf_runtime_component_count(p, C.int32_t(kind)))
	out := make([]ComponentInfo, 0, n)
	for i := 0; i < n; i++ {
		var c C.cmf_component_info
		C.cmf_component_info_init(&c)
		if err := check(C.cmf_runtime_component_info(p, C.int32_t(kind), C.size_t(i), &c)); err != nil {
			return nil, err
		}
		out = append(out, ComponentInfo{
			Kind: kind, Name: C.GoString(c.name), Version: C.GoString(c.version), DtypeID: int32(c.dtype_id),
			ABIVersion: uint32(c.abi_version), Detail: C.GoString(c.detail), PluginPath: C.GoString(c.plugin_path),
		})
	}
	return out, nil
}
