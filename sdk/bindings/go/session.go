package cmf

/*
#include <cmf/cmf.h>
#include <stdlib.h>

extern int32_t cmfgoOnToken(uintptr_t user, int32_t token);
static int32_t cmfgo_token(void *user, int32_t token) { return cmfgoOnToken((uintptr_t)user, token); }
static void cmfgo_set_on_token(cmf_generate_options *o, uintptr_t user) {
    o->on_token = cmfgo_token;
    o->user = (void *)user;
}
*/
import "C"

import (
	"context"
	"runtime"
	"runtime/cgo"
	"unsafe"
)

// SessionOptions configures Model.NewSession; nil means the defaults.
type SessionOptions struct {
	NCtx        uint64 // context tokens; 0 = min(model maximum, 4096)
	NBatch      uint32 // prefill tokens per forward pass; 0 = the library default
	Backend     string // backend name; "" = the default backend
	ArchOptions string // arch-specific "key=value,..." (e.g. the qwen arch's "kv_cache=f16")
}

// GenerateOptions is sampling and stopping for one Generate call. Start
// from DefaultGenerateOptions (the library's defaults) or Greedy.
type GenerateOptions struct {
	MaxTokens         uint32 // 0 = until a stop id or the context is full
	Temperature       float32
	TopK              int32
	TopP              float32
	MinP              float32
	RepetitionPenalty float32
	PresencePenalty   float32
	Seed              uint64
	// Stop ids: nil = the model's eos ids, an empty non-nil slice = none.
	StopIDs []int32
}

// DefaultGenerateOptions returns the library's defaults (cmf_generate_options_init).
func DefaultGenerateOptions() GenerateOptions {
	var c C.cmf_generate_options
	C.cmf_generate_options_init(&c)
	return GenerateOptions{MaxTokens: uint32(c.max_tokens), Temperature: float32(c.temperature), TopK: int32(c.top_k),
		TopP: float32(c.top_p), MinP: float32(c.min_p), RepetitionPenalty: float32(c.repetition_penalty),
		PresencePenalty: float32(c.presence_penalty), Seed: uint64(c.seed)}
}

// Greedy is greedy decoding without penalties, up to maxTokens.
func Greedy(maxTokens uint32) *GenerateOptions {
	o := DefaultGenerateOptions()
	o.MaxTokens, o.Temperature, o.RepetitionPenalty = maxTokens, 0, 1
	return &o
}

// Why generation stopped.
const (
	StopMaxTokens   = int32(C.CMF_STOP_MAX_TOKENS)
	StopEOS         = int32(C.CMF_STOP_EOS)
	StopCallback    = int32(C.CMF_STOP_CALLBACK)
	StopCancelled   = int32(C.CMF_STOP_CANCELLED)
	StopContextFull = int32(C.CMF_STOP_CONTEXT_FULL)
)

// GenerateStats reports one Generate call.
type GenerateStats struct {
	StopReason                    int32 // Stop*
	PromptTokens, GeneratedTokens uint64
	NPast                         uint64
	PrefillSeconds, DecodeSeconds float64
	PrefillTokPerS, DecodeTokPerS float64
}

// Session binds a model with its arch on a backend and owns one context
// (KV cache). One call at a time; Cancel from any goroutine.
type Session struct {
	h     *handle
	model *Model // keeps the model alive (and finalized after the session)
	eos   []int32
}

// NewSession creates a generation session over the model.
func (m *Model) NewSession(opts *SessionOptions) (*Session, error) {
	if opts == nil {
		opts = &SessionOptions{}
	}
	mp, err := m.ptr()
	if err != nil {
		return nil, err
	}
	defer m.h.release()
	rp, err := m.rt.ptr()
	if err != nil {
		return nil, err
	}
	defer m.rt.h.release()
	var o C.cmf_session_options
	C.cmf_session_options_init(&o)
	o.n_ctx = C.uint64_t(opts.NCtx)
	if opts.NBatch != 0 {
		o.n_batch = C.uint32_t(opts.NBatch)
	}
	if opts.Backend != "" {
		o.backend = C.CString(opts.Backend)
		defer C.free(unsafe.Pointer(o.backend))
	}
	if opts.ArchOptions != "" {
		o.arch_options = C.CString(opts.ArchOptions)
		defer C.free(unsafe.Pointer(o.arch_options))
	}
	var out *C.cmf_session
	if err := check(C.cmf_session_create_for_model(rp, mp, &o, &out)); err != nil {
		return nil, err
	}
	h, err := newHandle("session", unsafe.Pointer(out), func(p unsafe.Pointer) { C.cmf_session_free((*C.cmf_session)(p)) }, m.h)
	if err != nil {
		return nil, err
	}
	h.exclusive = true
	h.cancel = func(p unsafe.Pointer) { C.cmf_session_cancel((*C.cmf_session)(p)) }
	s := &Session{h: h, model: m}
	runtime.SetFinalizer(s, (*Session).Close)
	return s, nil
}

// Close cancels a running generation, waits for it and frees the session. Idempotent.
func (s *Session) Close() error {
	s.h.cancelNow()
	s.h.close()
	runtime.SetFinalizer(s, nil)
	return nil
}

// Cancel makes a running Generate return at its next token; any goroutine.
// A cancel when nothing runs is dropped (the next Generate starts clean).
func (s *Session) Cancel() { s.h.cancelNow() }

// Generate appends prompt to the context and samples until MaxTokens, a
// stop id, onToken returning true (stop), a cancel (Cancel, or ctx done),
// or a full context. Generated tokens stay in the context. onToken may be
// nil; it runs on the calling goroutine's thread. A panic in onToken stops
// generation and is re-raised after the C call returns.
func (s *Session) Generate(ctx context.Context, prompt []int32, opts *GenerateOptions, onToken func(token int32) (stop bool)) (GenerateStats, error) {
	if opts == nil {
		d := DefaultGenerateOptions()
		opts = &d
	}
	stops := opts.StopIDs
	if stops == nil {
		if s.eos == nil {
			sp, err := s.model.SpecialIDs()
			if err != nil {
				return GenerateStats{}, err
			}
			s.eos = sp.EosIDs
		}
		stops = s.eos
	}
	p, err := s.h.acquire()
	if err != nil {
		return GenerateStats{}, err
	}
	defer s.h.release()

	var o C.cmf_generate_options
	C.cmf_generate_options_init(&o)
	o.max_tokens = C.uint32_t(opts.MaxTokens)
	o.temperature = C.float(opts.Temperature)
	o.top_k = C.int32_t(opts.TopK)
	o.top_p = C.float(opts.TopP)
	o.min_p = C.float(opts.MinP)
	o.repetition_penalty = C.float(opts.RepetitionPenalty)
	o.presence_penalty = C.float(opts.PresencePenalty)
	o.seed = C.uint64_t(opts.Seed)
	// The options struct is Go memory handed to C, so what it points to
	// must not be Go memory: the stop ids go to C memory.
	if len(stops) > 0 {
		cs := (*[1 << 20]C.int32_t)(C.malloc(C.size_t(len(stops)) * 4))[:len(stops):len(stops)]
		defer C.free(unsafe.Pointer(&cs[0]))
		for i, id := range stops {
			cs[i] = C.int32_t(id)
		}
		o.stop_ids = &cs[0]
		o.n_stop_ids = C.size_t(len(stops))
	}
	sink := &tokenSink{onToken: onToken}
	if onToken != nil {
		h := cgo.NewHandle(sink)
		defer h.Delete()
		C.cmfgo_set_on_token(&o, C.uintptr_t(h))
	}
	if ctx != nil && ctx.Done() != nil {
		finished := make(chan struct{})
		defer close(finished)
		go func() {
			select {
			case <-ctx.Done():
				s.Cancel()
			case <-finished:
			}
		}()
	}
	var st C.cmf_generate_stats
	C.cmf_generate_stats_init(&st)
	e := C.cmf_session_generate((*C.cmf_session)(p), ids32(prompt), C.size_t(len(prompt)), &o, &st)
	if sink.panicked != nil {
		_ = check(e)
		panic(sink.panicked)
	}
	if err := check(e); err != nil {
		return GenerateStats{}, err
	}
	return GenerateStats{StopReason: int32(st.stop_reason), PromptTokens: uint64(st.prompt_tokens),
		GeneratedTokens: uint64(st.generated_tokens), NPast: uint64(st.n_past),
		PrefillSeconds: float64(st.prefill_seconds), DecodeSeconds: float64(st.decode_seconds),
		PrefillTokPerS: float64(st.prefill_tok_s), DecodeTokPerS: float64(st.decode_tok_s)}, nil
}

// GenerateText encodes text with the model's tokenizer, generates, and
// streams the generated text to onText piece by piece (never a split UTF-8
// character); onText returning true stops.
func (s *Session) GenerateText(ctx context.Context, text string, opts *GenerateOptions, onText func(piece string) (stop bool)) (GenerateStats, error) {
	tok, err := s.model.Tokenizer()
	if err != nil {
		return GenerateStats{}, err
	}
	defer tok.Close()
	prompt, err := tok.Encode(text, false)
	if err != nil {
		return GenerateStats{}, err
	}
	d, err := tok.NewDetokenizer(false)
	if err != nil {
		return GenerateStats{}, err
	}
	defer d.Close()
	var failure error
	st, err := s.Generate(ctx, prompt, opts, func(id int32) bool {
		piece, err := d.Push(id)
		if err != nil {
			failure = err
			return true
		}
		return piece != "" && onText(piece)
	})
	if err == nil {
		err = failure
	}
	if err != nil {
		return st, err
	}
	tail, err := d.Finish()
	if err == nil && tail != "" {
		onText(tail)
	}
	return st, err
}

// Reset empties the context.
func (s *Session) Reset() error {
	p, err := s.h.acquire()
	if err != nil {
		return err
	}
	defer s.h.release()
	return check(C.cmf_session_reset((*C.cmf_session)(p)))
}

// Truncate keeps the first nKeep tokens of the context.
func (s *Session) Truncate(nKeep uint64) error {
	p, err := s.h.acquire()
	if err != nil {
		return err
	}
	defer s.h.release()
	return check(C.cmf_session_truncate((*C.cmf_session)(p), C.uint64_t(nKeep)))
}

// Eval appends tokens and returns the last position's logits (vocab
// floats) or, with all, every position's (len(tokens) x vocab).
func (s *Session) Eval(tokens []int32, all bool) ([]float32, error) {
	p, err := s.h.acquire()
	if err != nil {
		return nil, err
	}
	defer s.h.release()
	sp := (*C.cmf_session)(p)
	vocab := int(C.cmf_session_vocab_size(sp))
	n, mode := vocab, C.int32_t(C.CMF_LOGITS_LAST)
	if all {
		n, mode = vocab*len(tokens), C.CMF_LOGITS_ALL
	}
	out := make([]float32, n)
	var op *C.float
	if n > 0 {
		op = (*C.float)(unsafe.Pointer(&out[0]))
	}
	if err := check(C.cmf_session_eval(sp, ids32(tokens), C.size_t(len(tokens)), mode, op, C.size_t(n))); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Session) query(f func(*C.cmf_session) C.uint64_t) (uint64, error) {
	p, err := s.h.acquire()
	if err != nil {
		return 0, err
	}
	defer s.h.release()
	return uint64(f((*C.cmf_session)(p))), nil
}

// VocabSize is the number of logits per position.
func (s *Session) VocabSize() (uint64, error) {
	return s.query(func(p *C.cmf_session) C.uint64_t { return C.cmf_session_vocab_size(p) })
}

// NCtx is the context size in tokens.
func (s *Session) NCtx() (uint64, error) {
	return s.query(func(p *C.cmf_session) C.uint64_t { return C.cmf_session_n_ctx(p) })
}

// NPast is the number of tokens in the context.
func (s *Session) NPast() (uint64, error) {
	return s.query(func(p *C.cmf_session) C.uint64_t { return C.cmf_session_n_past(p) })
}
