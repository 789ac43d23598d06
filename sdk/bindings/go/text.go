package cmf

/*
#include <cmf/cmf.h>
#include <stdlib.h>
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Tokenizer is a Hugging Face tokenizer.json: immutable, safe for
// concurrent use.
type Tokenizer struct{ h *handle }

// NewTokenizer parses tokenizer.json bytes.
func NewTokenizer(tokenizerJSON []byte) (*Tokenizer, error) {
	if err := checkABI(); err != nil {
		return nil, err
	}
	data := C.CBytes(tokenizerJSON)
	defer C.free(data)
	var out *C.cmf_tokenizer
	if err := check(C.cmf_tokenizer_create((*C.char)(data), C.size_t(len(tokenizerJSON)), &out)); err != nil {
		return nil, err
	}
	return ownTokenizer(out), nil
}

func ownTokenizer(p *C.cmf_tokenizer) *Tokenizer {
	h, _ := newHandle("tokenizer", unsafe.Pointer(p), func(p unsafe.Pointer) { C.cmf_tokenizer_free((*C.cmf_tokenizer)(p)) }, nil)
	t := &Tokenizer{h}
	runtime.SetFinalizer(t, (*Tokenizer).Close)
	return t
}

// Close frees the tokenizer after closing its detokenizers. Idempotent.
func (t *Tokenizer) Close() error {
	t.h.close()
	runtime.SetFinalizer(t, nil)
	return nil
}

func (t *Tokenizer) ptr() (*C.cmf_tokenizer, error) {
	p, err := t.h.acquire()
	return (*C.cmf_tokenizer)(p), err
}

// cText hands Go text to C without a NUL terminator (the API takes lengths).
func cText(s string) (*C.char, func()) {
	if len(s) == 0 {
		return nil, func() {}
	}
	p := C.CString(s)
	return p, func() { C.free(unsafe.Pointer(p)) }
}

func ids32(ids []int32) *C.int32_t {
	if len(ids) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&ids[0]))
}

// Encode turns UTF-8 text into token ids; addSpecial runs the
// post-processor (HF add_special_tokens=True).
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	p, err := t.ptr()
	if err != nil {
		return nil, err
	}
	defer t.h.release()
	cs, free := cText(text)
	defer free()
	var flags C.uint32_t
	if addSpecial {
		flags = C.CMF_ENCODE_ADD_SPECIAL
	}
	var ids *C.int32_t
	var n C.size_t
	if err := check(C.cmf_tokenizer_encode(p, cs, C.size_t(len(text)), flags, &ids, &n)); err != nil {
		return nil, err
	}
	defer C.cmf_ids_free(ids)
	out := make([]int32, int(n))
	if n > 0 {
		copy(out, (*[1 << 28]int32)(unsafe.Pointer(ids))[:n:n])
	}
	return out, nil
}

// Decode turns ids into UTF-8 text; an id outside the vocabulary is ErrBounds.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) (string, error) {
	p, err := t.ptr()
	if err != nil {
		return "", err
	}
	defer t.h.release()
	var flags C.uint32_t
	if skipSpecial {
		flags = C.CMF_DECODE_SKIP_SPECIAL
	}
	var out *C.char
	var n C.size_t
	if err := check(C.cmf_tokenizer_decode(p, ids32(ids), C.size_t(len(ids)), flags, &out, &n)); err != nil {
		return "", err
	}
	return takeString(out, n), nil
}

// VocabSize is one past the largest token id.
func (t *Tokenizer) VocabSize() (int, error) {
	p, err := t.ptr()
	if err != nil {
		return 0, err
	}
	defer t.h.release()
	return int(C.cmf_tokenizer_vocab_size(p)), nil
}

// TokenToID looks up an exact token string (ErrNotFound if absent).
func (t *Tokenizer) TokenToID(token string) (int32, error) {
	p, err := t.ptr()
	if err != nil {
		return 0, err
	}
	defer t.h.release()
	cs, free := cText(token)
	defer free()
	var id C.int32_t
	if err := check(C.cmf_tokenizer_token_to_id(p, cs, C.size_t(len(token)), &id)); err != nil {
		return 0, err
	}
	return int32(id), nil
}

// IDToToken is the token string (piece) of an id.
func (t *Tokenizer) IDToToken(id int32) (string, error) {
	p, err := t.ptr()
	if err != nil {
		return "", err
	}
	defer t.h.release()
	var out *C.char
	var n C.size_t
	if err := check(C.cmf_tokenizer_id_to_token(p, C.int32_t(id), &out, &n)); err != nil {
		return "", err
	}
	return takeString(out, n), nil
}

// IsSpecial tells whether id is a special added token.
func (t *Tokenizer) IsSpecial(id int32) (bool, error) {
	p, err := t.ptr()
	if err != nil {
		return false, err
	}
	defer t.h.release()
	return C.cmf_tokenizer_is_special(p, C.int32_t(id)) != 0, nil
}

// Detokenizer streams ids into text without ever splitting a UTF-8
// character. One call at a time.
type Detokenizer struct {
	h   *handle
	tok *Tokenizer // keeps the tokenizer alive (and finalized after)
}

// NewDetokenizer creates a streaming detokenizer borrowing t.
func (t *Tokenizer) NewDetokenizer(skipSpecial bool) (*Detokenizer, error) {
	p, err := t.ptr()
	if err != nil {
		return nil, err
	}
	defer t.h.release()
	var flags C.uint32_t
	if skipSpecial {
		flags = C.CMF_DECODE_SKIP_SPECIAL
	}
	var out *C.cmf_detokenizer
	if err := check(C.cmf_detokenizer_create(p, flags, &out)); err != nil {
		return nil, err
	}
	h, err := newHandle("detokenizer", unsafe.Pointer(out),
		func(p unsafe.Pointer) { C.cmf_detokenizer_free((*C.cmf_detokenizer)(p)) }, t.h)
	if err != nil {
		return nil, err
	}
	h.exclusive = true
	d := &Detokenizer{h: h, tok: t}
	runtime.SetFinalizer(d, (*Detokenizer).Close)
	return d, nil
}

// Close frees the detokenizer. Idempotent.
func (d *Detokenizer) Close() error {
	d.h.close()
	runtime.SetFinalizer(d, nil)
	return nil
}

// Push returns the text id completes ("" while a character is unfinished).
func (d *Detokenizer) Push(id int32) (string, error) {
	p, err := d.h.acquire()
	if err != nil {
		return "", err
	}
	defer d.h.release()
	var out *C.char
	var n C.size_t
	if err := check(C.cmf_detokenizer_push((*C.cmf_detokenizer)(p), C.int32_t(id), &out, &n)); err != nil {
		return "", err
	}
	return takeString(out, n), nil
}

// Finish returns everything still held and resets the stream.
func (d *Detokenizer) Finish() (string, error) {
	p, err := d.h.acquire()
	if err != nil {
		return "", err
	}
	defer d.h.release()
	var out *C.char
	var n C.size_t
	if err := check(C.cmf_detokenizer_finish((*C.cmf_detokenizer)(p), &out, &n)); err != nil {
		return "", err
	}
	return takeString(out, n), nil
}

// ChatRender renders a Hugging Face chat template (Jinja) over a JSON
// object of template variables. template "" selects ChatML; nowUnix is the
// time strftime_now formats (nil = now).
func ChatRender(template, contextJSON string, nowUnix *int64) (string, error) {
	if err := checkABI(); err != nil {
		return "", err
	}
	tp, freeT := cText(template)
	defer freeT()
	cp, freeC := cText(contextJSON)
	defer freeC()
	var o C.cmf_chat_options
	C.cmf_chat_options_init(&o)
	if nowUnix != nil {
		o.now_unix = C.int64_t(*nowUnix)
	}
	var out *C.char
	var n C.size_t
	if err := check(C.cmf_chat_render(tp, C.size_t(len(template)), cp, C.size_t(len(contextJSON)), &o, &out, &n)); err != nil {
		return "", err
	}
	return takeString(out, n), nil
}

// SignKeygen writes a new Ed25519 key (keyPath) and its public half (keyPath.pub).
func SignKeygen(keyPath string) error {
	cs := C.CString(keyPath)
	defer C.free(unsafe.Pointer(cs))
	return check(C.cmf_sign_keygen(cs))
}

// SignFile writes file.sig and returns the signer's 16-hex fingerprint.
func SignFile(file, keyPath string) (string, error) {
	f := C.CString(file)
	defer C.free(unsafe.Pointer(f))
	k := C.CString(keyPath)
	defer C.free(unsafe.Pointer(k))
	fp := (*C.char)(C.calloc(17, 1))
	defer C.free(unsafe.Pointer(fp))
	if err := check(C.cmf_sign_file(f, k, fp)); err != nil {
		return "", err
	}
	return C.GoString(fp), nil
}
