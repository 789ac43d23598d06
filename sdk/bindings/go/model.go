package cmf

/*
#include <cmf/cmf.h>
#include <stdlib.h>

extern void cmfgoOnProgress(uintptr_t user, uint64_t done, uint64_t total);
static void cmfgo_progress(void *user, uint64_t done, uint64_t total) {
    cmfgoOnProgress((uintptr_t)user, done, total);
}
static void cmfgo_set_progress(cmf_verify_options *o, uintptr_t user) {
    o->progress = cmfgo_progress;
    o->progress_user = (void *)user;
}
*/
import "C"

import (
	"encoding/json"
	"runtime"
	"runtime/cgo"
	"unsafe"
)

// OpenOptions configures Runtime.Open; nil means the defaults.
type OpenOptions struct {
	NoMmap       bool // read the file into memory instead of mapping it
	NoShardMerge bool // open this shard alone
}

// Model is an opened CMF v2 container: immutable, safe for concurrent use.
type Model struct {
	h  *handle
	rt *Runtime // keeps the runtime alive (and finalized after the model)
}

// Open opens a .cmf file or any shard of a sharded model.
func (r *Runtime) Open(path string, opts *OpenOptions) (*Model, error) {
	rp, err := r.ptr()
	if err != nil {
		return nil, err
	}
	defer r.h.release()
	var o C.cmf_open_options
	C.cmf_open_options_init(&o)
	if opts != nil && opts.NoMmap {
		o.flags |= C.CMF_OPEN_NO_MMAP
	}
	if opts != nil && opts.NoShardMerge {
		o.flags |= C.CMF_OPEN_NO_SHARD_MERGE
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var out *C.cmf_model
	if err := check(C.cmf_open(rp, cs, &o, &out)); err != nil {
		return nil, err
	}
	h, err := newHandle("model", unsafe.Pointer(out), func(p unsafe.Pointer) { C.cmf_close((*C.cmf_model)(p)) }, r.h)
	if err != nil {
		return nil, err
	}
	m := &Model{h: h, rt: r}
	runtime.SetFinalizer(m, (*Model).Close)
	return m, nil
}

// Close closes the model after closing its sessions. Idempotent.
func (m *Model) Close() error {
	m.h.close()
	runtime.SetFinalizer(m, nil)
	return nil
}

func (m *Model) ptr() (*C.cmf_model, error) {
	p, err := m.h.acquire()
	return (*C.cmf_model)(p), err
}

// TensorInfo is a directory entry.
type TensorInfo struct {
	Index  int
	Name   string
	Dtype  int32 // CMF dtype id (cmf_types.h CMF_DTYPE_*)
	Shape  []uint64
	Shard  uint32
	NBytes uint64
	Hash   uint64
	Offset uint64 // payload offset relative to its shard's data section
}

// Rows is shape[0] for 2-D and up, else 1: the rows DequantizeRows counts.
func (t TensorInfo) Rows() uint64 {
	if len(t.Shape) >= 2 {
		return t.Shape[0]
	}
	return 1
}

// RowLen is the number of floats per row.
func (t TensorInfo) RowLen() uint64 {
	dims := t.Shape
	if len(dims) >= 2 {
		dims = dims[1:]
	}
	n := uint64(1)
	for _, d := range dims {
		n *= d
	}
	return n
}

// ModelInfo holds model-wide facts; JSON blocks as strings.
type ModelInfo struct {
	Version, RequiredFeatures, ShardCount, MaskCount uint32
	FileSize, TensorCount, SkillCount                uint64
	HeaderHash, DirHash                              uint64
	DataOffset, DataLength                           uint64 // shard 1's data section
	Format, ArchName, QuantType                      string
	HeaderJSON, ArchJSON, TokenizerConfigJSON        string
	SkillsJSON, ProvenanceJSON                       string
}

// Info returns the model-wide facts.
func (m *Model) Info() (ModelInfo, error) {
	p, err := m.ptr()
	if err != nil {
		return ModelInfo{}, err
	}
	defer m.h.release()
	var c C.cmf_model_info
	C.cmf_model_info_init(&c)
	if err := check(C.cmf_model_get_info(p, &c)); err != nil {
		return ModelInfo{}, err
	}
	return ModelInfo{
		Version: uint32(c.version), RequiredFeatures: uint32(c.required_features), ShardCount: uint32(c.shard_count),
		MaskCount: uint32(c.mask_count), FileSize: uint64(c.file_size), TensorCount: uint64(c.tensor_count),
		SkillCount: uint64(c.skill_count), HeaderHash: uint64(c.header_hash), DirHash: uint64(c.dir_hash),
		DataOffset: uint64(c.data_off), DataLength: uint64(c.data_len),
		Format: C.GoString(c.format), ArchName: C.GoString(c.arch_name), QuantType: C.GoString(c.quant_type),
		HeaderJSON: C.GoStringN(c.header_json, C.int(c.header_json_len)), ArchJSON: C.GoString(c.arch_json),
		TokenizerConfigJSON: C.GoString(c.tokenizer_config_json), SkillsJSON: C.GoString(c.skills_json),
		ProvenanceJSON: C.GoString(c.provenance_json),
	}, nil
}

// ShardPaths lists the shards' paths as opened.
func (m *Model) ShardPaths() ([]string, error) {
	p, err := m.ptr()
	if err != nil {
		return nil, err
	}
	defer m.h.release()
	var out []string
	for i := 0; ; i++ {
		s := C.cmf_model_shard_path(p, C.uint32_t(i))
		if s == nil {
			return out, nil
		}
		out = append(out, C.GoString(s))
	}
}

// TensorCount is the number of directory entries (merged over shards).
func (m *Model) TensorCount() (int, error) {
	p, err := m.ptr()
	if err != nil {
		return 0, err
	}
	defer m.h.release()
	return int(C.cmf_tensor_count(p)), nil
}

func tensorInfo(index int, c *C.cmf_tensor_info) TensorInfo {
	shape := make([]uint64, int(c.ndim))
	for i := range shape {
		shape[i] = uint64(c.shape[i])
	}
	return TensorInfo{Index: index, Name: C.GoString(c.name), Dtype: int32(c.dtype), Shape: shape,
		Shard: uint32(c.shard), NBytes: uint64(c.nbytes), Hash: uint64(c.hash), Offset: uint64(c.offset)}
}

// TensorAt returns the directory entry at index.
func (m *Model) TensorAt(index int) (TensorInfo, error) {
	p, err := m.ptr()
	if err != nil {
		return TensorInfo{}, err
	}
	defer m.h.release()
	var c C.cmf_tensor_info
	C.cmf_tensor_info_init(&c)
	if err := check(C.cmf_tensor_at(p, C.size_t(index), &c)); err != nil {
		return TensorInfo{}, err
	}
	return tensorInfo(index, &c), nil
}

// Tensors lists the directory in order.
func (m *Model) Tensors() ([]TensorInfo, error) {
	n, err := m.TensorCount()
	if err != nil {
		return nil, err
	}
	out := make([]TensorInfo, 0, n)
	for i := 0; i < n; i++ {
		t, err := m.TensorAt(i)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// TensorIndex is the directory index of a tensor by exact name.
func (m *Model) TensorIndex(name string) (int, error) {
	p, err := m.ptr()
	if err != nil {
		return 0, err
	}
	defer m.h.release()
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var index C.size_t
	if err := check(C.cmf_tensor_index(p, cs, &index)); err != nil {
		return 0, err
	}
	return int(index), nil
}

// Tensor returns a tensor by exact name (ErrMissingTensor if absent).
func (m *Model) Tensor(name string) (TensorInfo, error) {
	i, err := m.TensorIndex(name)
	if err != nil {
		return TensorInfo{}, err
	}
	return m.TensorAt(i)
}

// Payload returns a copy of a tensor's stored bytes.
func (m *Model) Payload(index int) ([]byte, error) {
	p, err := m.ptr()
	if err != nil {
		return nil, err
	}
	defer m.h.release()
	var c C.cmf_tensor_info
	C.cmf_tensor_info_init(&c)
	if err := check(C.cmf_tensor_at(p, C.size_t(index), &c)); err != nil {
		return nil, err
	}
	if c.nbytes == 0 {
		return []byte{}, nil
	}
	return C.GoBytes(c.data, C.int(c.nbytes)), nil
}

// Dequantize decodes a whole tensor to float32 through its codec.
func (m *Model) Dequantize(index int) ([]float32, error) {
	t, err := m.TensorAt(index)
	if err != nil {
		return nil, err
	}
	return m.DequantizeRows(index, 0, t.Rows())
}

// DequantizeRows decodes rows [begin, end) of shape[0] to float32 (row-major).
func (m *Model) DequantizeRows(index int, begin, end uint64) ([]float32, error) {
	t, err := m.TensorAt(index)
	if err != nil {
		return nil, err
	}
	if begin > end || end > t.Rows() {
		return nil, newError(ErrInvalidArgument, "%s: rows [%d, %d) outside [0, %d)", t.Name, begin, end, t.Rows())
	}
	out := make([]float32, (end-begin)*t.RowLen())
	return out, m.DequantizeInto(index, begin, end, out)
}

// DequantizeInto decodes rows [begin, end) into dst, which must hold them.
func (m *Model) DequantizeInto(index int, begin, end uint64, dst []float32) error {
	p, err := m.ptr()
	if err != nil {
		return err
	}
	defer m.h.release()
	var dp *C.float
	if len(dst) > 0 {
		dp = (*C.float)(unsafe.Pointer(&dst[0]))
	}
	return check(C.cmf_tensor_dequantize(p, C.size_t(index), C.uint64_t(begin), C.uint64_t(end), dp,
		C.uint64_t(len(dst))))
}

// VerifyOptions configures Model.Verify; nil means the defaults.
type VerifyOptions struct {
	// 64-hex Ed25519 public keys or 16-hex fingerprints; with any, every
	// file must carry a valid signature by one of them.
	TrustedKeys   []string
	SkipSignature bool // do not look for <file>.sig
	// Progress in hashed bytes; called from the pool's threads, never concurrently.
	Progress func(done, total uint64)
}

// Signature is a valid detached signature found by Verify.
type Signature struct {
	Trusted     bool
	File        string
	PubkeyHex   string
	Fingerprint string
}

// VerifyReport is what Verify found: no Problems = everything checked out.
type VerifyReport struct {
	Problems   []string
	Signatures []Signature
}

// OK is true when no problem was found.
func (r *VerifyReport) OK() bool { return len(r.Problems) == 0 }

// Verify checks every hash and, unless skipped, each file's signature.
func (m *Model) Verify(opts *VerifyOptions) (*VerifyReport, error) {
	if opts == nil {
		opts = &VerifyOptions{}
	}
	p, err := m.ptr()
	if err != nil {
		return nil, err
	}
	defer m.h.release()
	var o C.cmf_verify_options
	C.cmf_verify_options_init(&o)
	if opts.SkipSignature {
		o.flags |= C.CMF_VERIFY_SKIP_SIGNATURE
	}
	if n := len(opts.TrustedKeys); n > 0 {
		keys := (*[1 << 20]*C.char)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof((*C.char)(nil)))))[:n:n]
		defer func() {
			for _, k := range keys {
				C.free(unsafe.Pointer(k))
			}
			C.free(unsafe.Pointer(&keys[0]))
		}()
		for i, k := range opts.TrustedKeys {
			keys[i] = C.CString(k)
		}
		o.trusted_keys = &keys[0]
		o.n_trusted_keys = C.size_t(n)
	}
	if opts.Progress != nil {
		h := cgo.NewHandle(opts.Progress)
		defer h.Delete()
		C.cmfgo_set_progress(&o, C.uintptr_t(h))
	}
	var rep *C.cmf_verify_report
	if err := check(C.cmf_verify(p, &o, &rep)); err != nil {
		return nil, err
	}
	defer C.cmf_verify_report_free(rep)
	out := &VerifyReport{}
	for i := 0; i < int(C.cmf_verify_problem_count(rep)); i++ {
		out.Problems = append(out.Problems, C.GoString(C.cmf_verify_problem(rep, C.size_t(i))))
	}
	for i := 0; i < int(C.cmf_verify_signature_count(rep)); i++ {
		var c C.cmf_signature_info
		C.cmf_signature_info_init(&c)
		if err := check(C.cmf_verify_signature_at(rep, C.size_t(i), &c)); err != nil {
			return nil, err
		}
		out.Signatures = append(out.Signatures, Signature{Trusted: c.trusted != 0, File: C.GoString(c.file),
			PubkeyHex: C.GoString(c.pubkey_hex), Fingerprint: C.GoString(c.fingerprint)})
	}
	return out, nil
}

// Tokenizer returns the file's own tokenizer (ErrNotFound without a vocab
// section). It does not borrow the model.
func (m *Model) Tokenizer() (*Tokenizer, error) {
	p, err := m.ptr()
	if err != nil {
		return nil, err
	}
	defer m.h.release()
	var out *C.cmf_tokenizer
	if err := check(C.cmf_model_tokenizer(p, &out)); err != nil {
		return nil, err
	}
	return ownTokenizer(out), nil
}

// SpecialIDs are the special token ids of the header's tokenizer config.
type SpecialIDs struct {
	BosID, PadID    int32 // -1 = none
	EosIDs          []int32
	HasChatTemplate bool
}

// SpecialIDs returns the model's special token ids.
func (m *Model) SpecialIDs() (SpecialIDs, error) {
	p, err := m.ptr()
	if err != nil {
		return SpecialIDs{}, err
	}
	defer m.h.release()
	var c C.cmf_model_special_ids
	C.cmf_model_special_ids_init(&c)
	if err := check(C.cmf_model_get_special_ids(p, &c)); err != nil {
		return SpecialIDs{}, err
	}
	eos := make([]int32, int(c.n_eos_ids))
	for i := range eos {
		eos[i] = int32(c.eos_ids[i])
	}
	return SpecialIDs{BosID: int32(c.bos_id), PadID: int32(c.pad_id), EosIDs: eos, HasChatTemplate: c.has_chat_template != 0}, nil
}

// Message is one chat turn.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// RenderChat renders messages through the file's chat template.
func (m *Model) RenderChat(messages []Message, addGenerationPrompt bool) (string, error) {
	ctx, err := json.Marshal(map[string]interface{}{"messages": messages, "add_generation_prompt": addGenerationPrompt})
	if err != nil {
		return "", newError(ErrInvalidArgument, "%v", err)
	}
	return m.RenderChatJSON(string(ctx))
}

// RenderChatJSON renders the file's chat template with a JSON context
// ({"messages": [...], "add_generation_prompt": true, ...}).
func (m *Model) RenderChatJSON(contextJSON string) (string, error) {
	p, err := m.ptr()
	if err != nil {
		return "", err
	}
	defer m.h.release()
	cs := C.CString(contextJSON)
	defer C.free(unsafe.Pointer(cs))
	var out *C.char
	var n C.size_t
	if err := check(C.cmf_model_render_chat(p, cs, C.size_t(len(contextJSON)), &out, &n)); err != nil {
		return "", err
	}
	return takeString(out, n), nil
}
