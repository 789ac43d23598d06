package cmf

// Tests against a built libcmf and the project's default model
// (models/austen-tiny converted by the build). Environment: CMF_TEST_MODEL
// (the .cmf), CMF_TEST_EXPECTED (expected_greedy.json: the PyTorch
// reference's ids), CMF_PLUGIN_PATH (plugins of the build tree),
// PKG_CONFIG_PATH (a cmf.pc for building), LD_LIBRARY_PATH (to run).

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

type refCase struct {
	Name         string    `json:"name"`
	Prompt       string    `json:"prompt"`
	PromptIDs    []int32   `json:"prompt_ids"`
	GeneratedIDs []int32   `json:"generated_ids"`
	Text         string    `json:"text"`
	Messages     []Message `json:"messages"`
}

func env(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("set %s (see the comment at the top of cmf_test.go)", name)
	}
	return v
}

func refCases(t *testing.T) map[string]refCase {
	data, err := os.ReadFile(env(t, "CMF_TEST_EXPECTED"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []refCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]refCase{}
	for _, c := range doc.Cases {
		out[c.Name] = c
	}
	return out
}

func open(t *testing.T) (*Runtime, *Model) {
	rt, err := NewRuntime(&RuntimeOptions{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rt.Open(env(t, "CMF_TEST_MODEL"), nil)
	if err != nil {
		rt.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt, m
}

// must unwraps a (value, error) result; an error fails the test (as a panic
// with the error, which the testing package reports with its stack).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func cmfError(t *testing.T, err error, code int32) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want a *cmf.Error with code %d, got %v", code, err)
	}
	if e.Code != code {
		t.Fatalf("want code %d (%s), got %v", code, CodeName(code), e)
	}
	return e
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func f16(h uint16) float32 {
	sign := float32(1)
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, frac := int((h>>10)&0x1f), float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * float32(math.Ldexp(frac, -24))
	case 31:
		return float32(math.NaN())
	}
	return sign * float32(math.Ldexp(1+frac/1024, exp-15))
}

func TestRuntime(t *testing.T) {
	if ABIVersion() < 1 || strings.Count(Version(), ".") != 2 {
		t.Fatalf("ABI %d, version %q", ABIVersion(), Version())
	}
	rt, _ := open(t)
	if n := must(rt.Threads()); n != 2 {
		t.Fatalf("threads %d", n)
	}
	has := func(kind ComponentKind, name string) bool {
		for _, c := range must(rt.Components(kind)) {
			if c.Name == name && c.Kind == kind {
				return true
			}
		}
		return false
	}
	if !has(Codec, "f16") || !has(Backend, "cpu") || !has(Arch, "qwen") {
		t.Fatal("f16 codec, cpu backend or qwen arch missing")
	}
	loaded := false
	for _, p := range must(rt.Plugins()) {
		loaded = loaded || (p.Loaded && strings.HasSuffix(p.Path, ".so"))
	}
	if !loaded {
		t.Fatal("no plugin loaded")
	}
}

func TestErrors(t *testing.T) {
	rt, m := open(t)
	_, err := rt.Open("/nonexistent/model.cmf", nil)
	e := cmfError(t, err, ErrFileNotFound)
	if e.Name != "FileNotFound" || !strings.Contains(e.Message, "/nonexistent/model.cmf") ||
		!strings.HasPrefix(e.Error(), "FileNotFound: ") {
		t.Fatalf("%#v", e)
	}
	_, err = m.Tensor("no.such.tensor")
	cmfError(t, err, ErrMissingTensor)
}

func TestModelTensorsDequantize(t *testing.T) {
	_, m := open(t)
	info := must(m.Info())
	if info.ArchName != "qwen3" || info.Format != "cmf" || info.Version != 2 || info.ShardCount != 1 {
		t.Fatalf("%+v", info)
	}
	var arch map[string]interface{}
	if err := json.Unmarshal([]byte(info.ArchJSON), &arch); err != nil || arch["arch_name"] != "qwen3" {
		t.Fatalf("arch json %q: %v", info.ArchJSON, err)
	}
	tensors := must(m.Tensors())
	if uint64(len(tensors)) != info.TensorCount {
		t.Fatalf("%d tensors, info says %d", len(tensors), info.TensorCount)
	}
	for i, tt := range tensors {
		if tt.Index != i || must(m.TensorIndex(tt.Name)) != i {
			t.Fatalf("index of %s", tt.Name)
		}
	}
	paths := must(m.ShardPaths())
	if len(paths) != 1 || paths[0] != env(t, "CMF_TEST_MODEL") {
		t.Fatalf("shards %v", paths)
	}
	norm := must(m.Tensor("model.norm.weight"))
	if norm.Dtype != 1 || len(norm.Shape) != 1 || norm.Shape[0] != 192 || norm.NBytes != 384 {
		t.Fatalf("%+v", norm)
	}
	emb := must(m.Tensor("model.embed_tokens.weight"))
	payload := must(m.Payload(emb.Index))
	rows := must(m.DequantizeRows(emb.Index, 7, 10))
	if len(rows) != 3*192 {
		t.Fatalf("%d floats", len(rows))
	}
	whole := must(m.Dequantize(emb.Index))
	for i, v := range rows {
		want := f16(binary.LittleEndian.Uint16(payload[2*(7*192+i):]))
		if v != want || whole[7*192+i] != v {
			t.Fatalf("float %d: %v, payload says %v, whole tensor %v", i, v, want, whole[7*192+i])
		}
	}
	if _, err := m.DequantizeRows(norm.Index, 0, 2); err == nil {
		t.Fatal("rows past the end accepted")
	}
	cmfError(t, m.DequantizeInto(emb.Index, 0, 1, make([]float32, 10)), ErrInvalidArgument)
}

func TestVerifyWithTrustedKey(t *testing.T) {
	rt, m := open(t)
	if r := must(m.Verify(nil)); !r.OK() {
		t.Fatal(r.Problems)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "m.cmf")
	data := must(os.ReadFile(env(t, "CMF_TEST_MODEL")))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"me", "other"} {
		if err := SignKeygen(filepath.Join(dir, k+".key")); err != nil {
			t.Fatal(err)
		}
	}
	fp := must(SignFile(path, filepath.Join(dir, "me.key")))
	pub := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(dir, "me.key.pub")))))
	other := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(dir, "other.key.pub")))))
	signed := must(rt.Open(path, nil))
	defer signed.Close()
	var mu sync.Mutex
	var last [2]uint64
	r := must(signed.Verify(&VerifyOptions{TrustedKeys: []string{pub}, Progress: func(done, total uint64) {
		mu.Lock()
		last = [2]uint64{done, total}
		mu.Unlock()
	}}))
	if !r.OK() || len(r.Signatures) != 1 || r.Signatures[0].Fingerprint != fp || r.Signatures[0].PubkeyHex != pub ||
		!r.Signatures[0].Trusted {
		t.Fatalf("%+v", r)
	}
	if last[0] == 0 || last[0] != last[1] {
		t.Fatalf("progress %v", last)
	}
	if r := must(signed.Verify(&VerifyOptions{TrustedKeys: []string{other}})); r.OK() {
		t.Fatal("a signature by an untrusted key passed")
	}
}

func TestTokenizerAndChat(t *testing.T) {
	cases := refCases(t)
	raw, chat := cases["raw"], cases["chat"]
	_, m := open(t)
	tok := must(m.Tokenizer())
	defer tok.Close()
	if ids := must(tok.Encode(raw.Prompt, false)); !equalIDs(ids, raw.PromptIDs) {
		t.Fatalf("encode: %v", ids)
	}
	if s := must(tok.Decode(raw.GeneratedIDs, false)); s != raw.Text {
		t.Fatalf("decode: %q", s)
	}
	d := must(tok.NewDetokenizer(false))
	var sb strings.Builder
	for _, id := range raw.GeneratedIDs {
		sb.WriteString(must(d.Push(id)))
	}
	sb.WriteString(must(d.Finish()))
	if sb.String() != raw.Text {
		t.Fatalf("detokenizer: %q", sb.String())
	}
	imEnd := must(tok.TokenToID("<|im_end|>"))
	if !must(tok.IsSpecial(imEnd)) || must(tok.IDToToken(imEnd)) != "<|im_end|>" {
		t.Fatal("<|im_end|> lookups")
	}
	_, err := tok.Decode([]int32{1000000}, false)
	cmfError(t, err, ErrBounds)

	if s := must(m.RenderChat(chat.Messages, true)); s != chat.Prompt {
		t.Fatalf("render: %q", s)
	}
	if !must(m.SpecialIDs()).HasChatTemplate {
		t.Fatal("no chat template")
	}
	out := must(ChatRender("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
		`{"messages":[{"role":"user","content":"hi"}]}`, nil))
	if out != "[user] hi\n" {
		t.Fatalf("%q", out)
	}
	_, err = ChatRender("{{ raise_exception('no thanks') }}", "{}", nil)
	if e := cmfError(t, err, ErrTemplate); !strings.Contains(e.Message, "no thanks") {
		t.Fatal(e)
	}
}

func TestGreedyGenerationMatchesTheReference(t *testing.T) {
	raw := refCases(t)["raw"]
	_, m := open(t)
	s := must(m.NewSession(nil))
	var got []int32
	st := must(s.Generate(context.Background(), raw.PromptIDs, Greedy(uint32(len(raw.GeneratedIDs))),
		func(id int32) bool { got = append(got, id); return false }))
	if !equalIDs(got, raw.GeneratedIDs) || st.StopReason != StopMaxTokens {
		t.Fatalf("got %v (stop %d), want %v", got, st.StopReason, raw.GeneratedIDs)
	}
	if n := must(s.NPast()); n != uint64(len(raw.PromptIDs)+len(got)) {
		t.Fatalf("n_past %d", n)
	}
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	must(s.GenerateText(nil, raw.Prompt, Greedy(uint32(len(raw.GeneratedIDs))),
		func(piece string) bool { sb.WriteString(piece); return false }))
	if sb.String() != raw.Text {
		t.Fatalf("text %q", sb.String())
	}
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	logits := must(s.Eval(raw.PromptIDs, false))
	best := 0
	for i := range logits {
		if logits[i] > logits[best] {
			best = i
		}
	}
	if uint64(len(logits)) != must(s.VocabSize()) || int32(best) != raw.GeneratedIDs[0] {
		t.Fatalf("eval: %d logits, argmax %d", len(logits), best)
	}
	// The callback stops generation.
	n := 0
	st = must(s.Generate(nil, raw.PromptIDs, Greedy(20), func(int32) bool { n++; return n == 3 }))
	if st.StopReason != StopCallback || n != 3 {
		t.Fatalf("stop %d after %d", st.StopReason, n)
	}
}

func TestPanickingCallback(t *testing.T) {
	_, m := open(t)
	s := must(m.NewSession(nil))
	func() {
		defer func() {
			if r := recover(); r != "from the callback" {
				t.Fatalf("recovered %v", r)
			}
		}()
		s.Generate(nil, []int32{1413, 363}, Greedy(10), func(int32) bool { panic("from the callback") })
		t.Fatal("no panic")
	}()
	if st := must(s.Generate(nil, []int32{1413}, Greedy(2), nil)); st.StopReason != StopMaxTokens {
		t.Fatal("session unusable after a panic")
	}
}

func TestCancelFromAnotherGoroutine(t *testing.T) {
	_, m := open(t)
	s := must(m.NewSession(nil))
	first, cancelled := make(chan struct{}), make(chan struct{})
	go func() {
		<-first
		s.Cancel()
		close(cancelled)
	}()
	var got []int32
	st := must(s.Generate(nil, []int32{1413, 363, 258}, Greedy(40), func(id int32) bool {
		got = append(got, id)
		if len(got) == 1 {
			close(first)
			<-cancelled // parked until the other goroutine has cancelled
		}
		return false
	}))
	if st.StopReason != StopCancelled || len(got) != 1 {
		t.Fatalf("stop %d after %d tokens", st.StopReason, len(got))
	}

	// A done context cancels too.
	ctx, cancel := context.WithCancel(context.Background())
	got = nil
	st = must(s.Generate(ctx, []int32{1413}, Greedy(0), func(id int32) bool {
		got = append(got, id)
		if len(got) == 2 {
			cancel()
		}
		return false
	}))
	if st.StopReason != StopCancelled {
		t.Fatalf("context: stop %d after %d tokens", st.StopReason, len(got))
	}
}

func TestOneCallAtATime(t *testing.T) {
	_, m := open(t)
	s := must(m.NewSession(nil))
	var inner error
	s.Generate(nil, []int32{1413}, Greedy(3), func(int32) bool {
		_, inner = s.NPast()
		return true
	})
	if e := cmfError(t, inner, ErrInvalidArgument); !strings.Contains(e.Message, "in use") {
		t.Fatal(e)
	}
}

func TestLifetimes(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := must(rt.Open(env(t, "CMF_TEST_MODEL"), nil))
	s := must(m.NewSession(nil))
	tok := must(m.Tokenizer())
	d := must(tok.NewDetokenizer(false))
	rt.Close() // closes the model, which closes its session
	for _, err := range []error{func() error { _, err := m.Info(); return err }(),
		func() error { _, err := s.NPast(); return err }(), func() error { _, err := rt.Threads(); return err }()} {
		if e := cmfError(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "closed") {
			t.Fatal(e)
		}
	}
	if _, err := tok.VocabSize(); err != nil { // a model's tokenizer does not borrow it
		t.Fatal(err)
	}
	rt.Close()
	m.Close()
	s.Close()
	tok.Close()
	if _, err := d.Push(1); err == nil {
		t.Fatal("detokenizer usable after its tokenizer closed")
	}
	if _, err := rt.Open(env(t, "CMF_TEST_MODEL"), nil); err == nil {
		t.Fatal("open on a closed runtime")
	}
}

func TestCloseWhileGenerating(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := must(rt.Open(env(t, "CMF_TEST_MODEL"), nil))
	s := must(m.NewSession(nil))
	started := make(chan struct{})
	var once sync.Once
	done := make(chan GenerateStats)
	go func() {
		st, _ := s.Generate(nil, []int32{1413}, Greedy(0), func(int32) bool { once.Do(func() { close(started) }); return false })
		done <- st
	}()
	<-started
	rt.Close() // cancels the running generation, waits for it, frees everything
	if st := <-done; st.StopReason != StopCancelled {
		t.Fatalf("stop %d", st.StopReason)
	}
}

func TestFinalizersFreeUnreachableHandles(t *testing.T) {
	freed := make(chan string, 3)
	func() {
		rt, err := NewRuntime(&RuntimeOptions{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		m := must(rt.Open(env(t, "CMF_TEST_MODEL"), nil))
		s := must(m.NewSession(nil))
		for _, h := range []*handle{rt.h, m.h, s.h} {
			h, free := h, h.free
			h.free = func(p unsafe.Pointer) { free(p); freed <- h.kind }
		}
	}()
	var order []string
	deadline := time.Now().Add(20 * time.Second)
	for len(order) < 3 && time.Now().Before(deadline) {
		runtime.GC()
		select {
		case k := <-freed:
			order = append(order, k)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if strings.Join(order, ",") != "session,model,runtime" {
		t.Fatalf("finalizers freed %v", order)
	}
}
