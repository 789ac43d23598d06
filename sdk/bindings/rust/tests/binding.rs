// Tests of the Rust binding against a built libcmf and the project's default
// model (models/austen-tiny converted by the build). Environment:
// CMF_TEST_MODEL (the .cmf), CMF_TEST_EXPECTED (expected_greedy.json: the
// PyTorch reference's ids), CMF_PLUGIN_PATH (plugins of the build tree),
// CMF_LIB_DIR (where libcmf.so is, for linking; LD_LIBRARY_PATH to run).
mod common;

use std::ops::ControlFlow;
use std::sync::{Arc, Condvar, Mutex};

use cmf::{ComponentKind, GenerateOptions, Runtime, RuntimeOptions, SessionOptions, StopReason, VerifyOptions};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("set {} (see the comment at the top of tests/binding.rs)", name))
}

fn model_path() -> String {
    env("CMF_TEST_MODEL")
}

fn case(name: &str) -> common::Json {
    let text = std::fs::read_to_string(env("CMF_TEST_EXPECTED")).unwrap();
    let all = common::parse(&text);
    all.get("cases").arr().iter().find(|c| c.get("name").str() == name).expect("case").clone()
}

fn runtime() -> Runtime {
    Runtime::with_options(&RuntimeOptions { threads: 2, ..Default::default() }).expect("runtime")
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f32;
    match exp {
        0 => sign * frac * 2f32.powi(-24),
        31 => if frac == 0.0 { sign * f32::INFINITY } else { f32::NAN },
        e => sign * (1.0 + frac / 1024.0) * 2f32.powi(e - 15),
    }
}

#[test]
fn thread_safety_as_the_header_states() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<cmf::Runtime>();
    send_sync::<cmf::Model<'static>>();
    send_sync::<cmf::Tokenizer>();
    send_sync::<cmf::Canceller<'static>>();
    send::<cmf::Session<'static>>();
    send::<cmf::Detokenizer<'static>>();
    // (that Session and Detokenizer are not Sync: compile_fail doctests in src/lib.rs)
}

#[test]
fn versions_threads_and_plugins() {
    assert!(cmf::abi_version() >= 1);
    assert!(cmf::version().split('.').count() == 3);
    let rt = runtime();
    assert_eq!(rt.threads(), 2);
    let codecs = rt.components(ComponentKind::Codec).unwrap();
    assert!(codecs.iter().any(|c| c.name == "f16" && c.dtype_id == 1));
    assert!(rt.components(ComponentKind::Backend).unwrap().iter().any(|c| c.name == "cpu"));
    assert!(rt.components(ComponentKind::Arch).unwrap().iter().any(|c| c.name == "qwen"));
    assert!(rt.plugins().unwrap().iter().any(|p| p.loaded && p.path.ends_with(".so")));
}

#[test]
fn errors_carry_code_and_message() {
    let rt = runtime();
    let e = rt.open("/nonexistent/model.cmf").err().expect("an error");
    assert_eq!(e.code(), cmf::sys::CMF_ERR_FILE_NOT_FOUND);
    assert_eq!(e.code_name(), "FileNotFound");
    assert!(e.message().contains("/nonexistent/model.cmf"), "{}", e);
    assert!(e.to_string().starts_with("FileNotFound: "));
    let model = rt.open(model_path()).unwrap();
    let e = model.tensor("no.such.tensor").unwrap_err();
    assert_eq!(e.code(), cmf::sys::CMF_ERR_MISSING_TENSOR);
    let e = model.tensor("nul\0inside").unwrap_err();
    assert_eq!(e.code(), cmf::sys::CMF_ERR_INVALID_ARGUMENT);
}

#[test]
fn model_info_tensors_and_dequantize() {
    let rt = runtime();
    let model = rt.open(model_path()).unwrap();
    let info = model.info().unwrap();
    assert_eq!(info.arch_name, "qwen3");
    assert_eq!(info.format, "cmf");
    assert_eq!((info.version, info.shard_count), (2, 1));
    assert!(info.arch_json.contains("\"arch_name\":\"qwen3\""));
    let tensors: Vec<_> = model.tensors().collect::<cmf::Result<_>>().unwrap();
    assert_eq!(tensors.len() as u64, info.tensor_count);
    assert!(tensors.iter().enumerate().all(|(i, t)| t.index == i));
    assert_eq!(model.shard_paths(), vec![std::path::PathBuf::from(model_path())]);

    let norm = model.tensor("model.norm.weight").unwrap();
    assert_eq!((norm.dtype, norm.shape.clone(), norm.nbytes), (cmf::sys::CMF_DTYPE_F16, vec![192], 384));

    // Rows 7..10 of the embedding, through the codec and by hand from the payload.
    let emb = model.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(emb.shape, vec![4096, 192]);
    let payload = model.payload(emb.index).unwrap();
    let want: Vec<f32> = payload[2 * 7 * 192..2 * 10 * 192]
        .chunks(2)
        .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    let rows = model.dequantize_rows(emb.index, 7..10).unwrap();
    assert_eq!(rows, want);
    let whole = model.dequantize(emb.index).unwrap();
    assert_eq!(&whole[7 * 192..10 * 192], &rows[..]);
    assert!(model.dequantize_rows(norm.index, 0..2).is_err());
    let mut short = vec![0f32; 10];
    assert!(model.dequantize_into(emb.index, 0..1, &mut short).is_err());
}

#[test]
fn verify_with_a_trusted_key() {
    let rt = runtime();
    assert!(rt.open(model_path()).unwrap().verify(&VerifyOptions::default()).unwrap().ok());
    let dir = std::env::temp_dir().join(format!("cmf-rust-verify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.cmf");
    std::fs::copy(model_path(), &path).unwrap();
    cmf::sign_keygen(dir.join("me.key")).unwrap();
    cmf::sign_keygen(dir.join("other.key")).unwrap();
    let fp = cmf::sign_file(&path, dir.join("me.key")).unwrap();
    let pub_hex = std::fs::read_to_string(dir.join("me.key.pub")).unwrap().trim().to_string();
    let other = std::fs::read_to_string(dir.join("other.key.pub")).unwrap().trim().to_string();
    {
        let m = rt.open(&path).unwrap();
        let seen = Mutex::new(Vec::new());
        let progress = |done: u64, total: u64| seen.lock().unwrap().push((done, total));
        let r = m
            .verify(&VerifyOptions { trusted_keys: vec![pub_hex.clone()], progress: Some(&progress), ..Default::default() })
            .unwrap();
        assert!(r.ok(), "{:?}", r.problems);
        assert_eq!(r.signatures.len(), 1);
        assert_eq!((r.signatures[0].fingerprint.clone(), r.signatures[0].pubkey_hex.clone()), (fp, pub_hex));
        assert!(r.signatures[0].trusted);
        let last = *seen.lock().unwrap().last().expect("progress was reported");
        assert_eq!(last.0, last.1);
        let untrusted = m.verify(&VerifyOptions { trusted_keys: vec![other], ..Default::default() }).unwrap();
        assert!(!untrusted.ok());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizer_detokenizer_and_chat() {
    let raw = case("raw");
    let rt = runtime();
    let model = rt.open(model_path()).unwrap();
    let tok = model.tokenizer().unwrap();
    assert_eq!(tok.encode(raw.get("prompt").str(), false).unwrap(), raw.get("prompt_ids").ids());
    let generated = raw.get("generated_ids").ids();
    assert_eq!(tok.decode(&generated, false).unwrap(), raw.get("text").str());
    let mut d = tok.detokenizer(false).unwrap();
    let mut text = String::new();
    for id in &generated {
        text += &d.push(*id).unwrap();
    }
    text += &d.finish().unwrap();
    assert_eq!(text, raw.get("text").str());
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(tok.is_special(im_end));
    assert_eq!(tok.id_to_token(im_end).unwrap(), "<|im_end|>");
    assert_eq!(tok.decode(&[1_000_000], false).unwrap_err().code_name(), "Bounds");

    let chat = case("chat");
    let user = chat.get("messages").arr()[0].get("content").str().to_string();
    assert_eq!(model.render_chat(&[("user", &user)], true).unwrap(), chat.get("prompt").str());
    assert!(model.special_ids().unwrap().has_chat_template);
    let out = cmf::chat_render(
        Some("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"),
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        None,
    )
    .unwrap();
    assert_eq!(out, "[user] hi\n");
    let e = cmf::chat_render(Some("{{ raise_exception('no thanks') }}"), "{}", None).unwrap_err();
    assert_eq!(e.code_name(), "Template");
    assert!(e.message().contains("no thanks"));
}

#[test]
fn greedy_generation_matches_the_reference() {
    let raw = case("raw");
    let prompt = raw.get("prompt_ids").ids();
    let want = raw.get("generated_ids").ids();
    let rt = runtime();
    let model = rt.open(model_path()).unwrap();
    let mut s = model.session(&SessionOptions::default()).unwrap();
    let mut got = Vec::new();
    let stats = s
        .generate(&prompt, &GenerateOptions::greedy(want.len() as u32), |t| {
            got.push(t);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(got, want);
    assert_eq!(stats.stop_reason, StopReason::MaxTokens);
    assert_eq!(s.n_past(), (prompt.len() + want.len()) as u64);

    s.reset().unwrap();
    let mut text = String::new();
    s.generate_text(raw.get("prompt").str(), &GenerateOptions::greedy(want.len() as u32), |piece| {
        text.push_str(piece);
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(text, raw.get("text").str());

    s.reset().unwrap();
    let logits = s.eval(&prompt, false).unwrap();
    assert_eq!(logits.len() as u64, s.vocab_size());
    let argmax = (0..logits.len()).max_by(|&a, &b| logits[a].partial_cmp(&logits[b]).unwrap()).unwrap();
    assert_eq!(argmax as i32, want[0]);

    // The callback stops generation.
    s.reset().unwrap();
    let mut n = 0;
    let st = s
        .generate(&prompt, &GenerateOptions::greedy(20), |_| {
            n += 1;
            if n == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!((st.stop_reason, n), (StopReason::Callback, 3));
}

#[test]
fn a_panicking_callback_stops_and_resumes_the_panic() {
    let rt = runtime();
    let model = rt.open(model_path()).unwrap();
    let mut s = model.session(&SessionOptions::default()).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = s.generate(&[1413, 363], &GenerateOptions::greedy(10), |_| panic!("from the callback"));
    }));
    assert_eq!(*r.unwrap_err().downcast::<&str>().unwrap(), "from the callback");
    // The session is still usable.
    let st = s.generate(&[1413], &GenerateOptions::greedy(2), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(st.stop_reason, StopReason::MaxTokens);
}

#[test]
fn cancel_from_another_thread() {
    let rt = runtime();
    let model = rt.open(model_path()).unwrap();
    let mut s = model.session(&SessionOptions::default()).unwrap();
    let canceller = s.canceller();
    // (first token seen, cancel sent): the generating thread parks after its
    // first token until the other thread has cancelled.
    let state = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let mut got = Vec::new();
    let stats = std::thread::scope(|scope| {
        let st = Arc::clone(&state);
        scope.spawn(move || {
            let (lock, cv) = &*st;
            let mut g = cv.wait_while(lock.lock().unwrap(), |g| !g.0).unwrap();
            canceller.cancel();
            g.1 = true;
            cv.notify_all();
        });
        s.generate(&[1413, 363, 258], &GenerateOptions::greedy(40), |t| {
            got.push(t);
            let (lock, cv) = &*state;
            let mut g = lock.lock().unwrap();
            g.0 = true;
            cv.notify_all();
            let _g = cv.wait_while(g, |g| !g.1).unwrap();
            ControlFlow::Continue(())
        })
        .unwrap()
    });
    assert_eq!(stats.stop_reason, StopReason::Cancelled);
    assert_eq!(got.len(), 1);
}

#[test]
fn handles_are_shared_across_threads() {
    // Runtime, Model and Tokenizer are Sync: concurrent queries.
    let rt = runtime();
    let model = rt.open(model_path()).unwrap();
    let tok = model.tokenizer().unwrap();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let rows = model.dequantize_rows(0, 0..4).unwrap();
                assert_eq!(rows.len(), 4 * 192);
                assert_eq!(tok.encode("Emma", false).unwrap(), tok.encode("Emma", false).unwrap());
            });
        }
    });
    // A Session is Send: it may move to another thread.
    let mut s = model.session(&SessionOptions::default()).unwrap();
    let n = std::thread::scope(|scope| {
        scope
            .spawn(move || {
                s.generate(&[1413], &GenerateOptions::greedy(2), |_| ControlFlow::Continue(())).unwrap();
                s.n_past()
            })
            .join()
            .unwrap()
    });
    assert_eq!(n, 3);
}
