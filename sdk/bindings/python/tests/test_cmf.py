"""Tests of the Python binding against a built libcmf and the project's
default model (models/austen-tiny converted by the build).

Environment: CMF_TEST_MODEL (the .cmf), CMF_TEST_EXPECTED
(models/austen-tiny/expected_greedy.json: the PyTorch reference's ids),
CMF_STRUCT_LAYOUTS (tests/abi/struct_layouts built: the C compiler's layouts),
plus CMF_LIBRARY / CMF_PLUGIN_PATH to find libcmf and its plugins.
Run: python3 -m unittest discover -s tests  (from sdk/bindings/python)."""
import array
import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cmf  # noqa: E402
from cmf import _native  # noqa: E402


def need_env(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"set {name} (see the docstring of {__file__})")
    return value


MODEL = need_env("CMF_TEST_MODEL")
CASES = {c["name"]: c for c in json.load(open(need_env("CMF_TEST_EXPECTED")))["cases"]}
GREEDY = dict(temperature=0.0, repetition_penalty=1.0)


def read_text(path):
    with open(path) as f:
        return f.read().strip()


def f16_to_float(payload):
    return [struct.unpack("<e", payload[i:i + 2])[0] for i in range(0, len(payload), 2)]


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = cmf.Runtime(threads=2)
        cls.model = cls.rt.open(MODEL)

    @classmethod
    def tearDownClass(cls):
        cls.rt.close()


class LayoutTest(unittest.TestCase):
    def test_ctypes_structs_match_the_c_compiler(self):
        dump = json.loads(subprocess.run([need_env("CMF_STRUCT_LAYOUTS")], check=True, capture_output=True,
                                         text=True).stdout)
        self.assertEqual(set(dump), set(_native.STRUCTS))
        for name, cls in _native.STRUCTS.items():
            with self.subTest(struct=name):
                self.assertEqual(ctypes.sizeof(cls), dump[name]["size"])
                got = {f[0]: getattr(cls, f[0]).offset for f in cls._fields_}
                self.assertEqual(got, dump[name]["fields"])


class RuntimeTest(Base):
    def test_versions_threads_plugins(self):
        self.assertGreaterEqual(cmf.abi_version(), 1)
        self.assertRegex(cmf.version(), r"^\d+\.\d+\.\d+")
        self.assertEqual(self.rt.threads, 2)
        names = {(c.kind, c.name) for c in self.rt.components()}
        self.assertIn(("codec", "f16"), names)
        self.assertIn(("backend", "cpu"), names)
        self.assertIn(("arch", "qwen"), names)
        self.assertTrue(all(c.kind == "codec" for c in self.rt.components("codec")))
        self.assertTrue(any(p.loaded and p.path.endswith(".so") for p in self.rt.plugins()))

    def test_errors_carry_code_and_message(self):
        with self.assertRaises(cmf.Error) as e:
            self.rt.open("/nonexistent/model.cmf")
        self.assertEqual(e.exception.code, _native.ERR_FILE_NOT_FOUND)
        self.assertEqual(e.exception.name, "FileNotFound")
        self.assertIn("/nonexistent/model.cmf", e.exception.message)
        with self.assertRaises(cmf.Error) as e:
            self.rt.load_plugin("/nonexistent/cmf-nothing.so")
        self.assertEqual(e.exception.code, _native.ERR_FILE_NOT_FOUND)
        with tempfile.NamedTemporaryFile(suffix=".cmf") as f:
            f.write(b"not a cmf file at all" * 10)
            f.flush()
            with self.assertRaises(cmf.Error) as e:
                self.rt.open(f.name)
            self.assertEqual(e.exception.name, "InvalidMagic")


class ModelTest(Base):
    def test_info_and_tensors(self):
        info = self.model.info()
        self.assertEqual(info.arch_name, "qwen3")
        self.assertEqual(info.format, "cmf")
        self.assertEqual(info.version, 2)
        self.assertEqual(info.shard_count, 1)
        self.assertEqual(json.loads(info.arch_json)["arch_name"], "qwen3")
        self.assertEqual(json.loads(info.header_json)["arch"]["arch_name"], "qwen3")
        tensors = list(self.model.tensors())
        self.assertEqual(len(tensors), info.tensor_count)
        self.assertEqual([t.index for t in tensors], list(range(len(tensors))))
        norm = self.model.tensor("model.norm.weight")
        self.assertEqual(norm.shape, (192,))
        self.assertEqual(norm.dtype, 1)  # f16
        self.assertEqual(norm.nbytes, 384)
        self.assertEqual(self.model.tensor_index("model.norm.weight"), norm.index)
        self.assertEqual(self.model.shard_paths(), [MODEL])
        with self.assertRaises(cmf.Error) as e:
            self.model.tensor("no.such.tensor")
        self.assertEqual(e.exception.name, "MissingTensor")

    def test_dequantize_matches_the_payload(self):
        for use_numpy in ([True, False] if cmf._np is not None else [False]):
            with self.subTest(numpy=use_numpy):
                cmf.use_numpy = use_numpy
                try:
                    emb = self.model.tensor("model.embed_tokens.weight")
                    want = f16_to_float(self.model.payload(emb)[2 * 7 * 192:2 * 10 * 192])
                    rows = self.model.dequantize("model.embed_tokens.weight", rows=(7, 10))
                    whole = self.model.dequantize(emb.index)
                    if use_numpy:
                        self.assertEqual(rows.shape, (3, 192))
                        self.assertEqual(whole.shape, (4096, 192))
                        self.assertEqual(rows.flatten().tolist(), want)
                        self.assertEqual(whole[7:10].tolist(), rows.tolist())
                    else:
                        self.assertIsInstance(rows, array.array)
                        self.assertEqual(rows.typecode, "f")
                        self.assertEqual(rows.tolist(), want)
                        self.assertEqual(whole[7 * 192:10 * 192].tolist(), want)
                        self.assertEqual(memoryview(rows).format, "f")
                finally:
                    cmf.use_numpy = cmf._np is not None
        with self.assertRaises(cmf.Error):
            self.model.dequantize("model.norm.weight", rows=(0, 2))

    def test_verify_with_a_trusted_key(self):
        self.assertTrue(self.model.verify().ok)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.cmf")
            shutil.copy(MODEL, path)
            cmf.sign_keygen(os.path.join(d, "me.key"))
            cmf.sign_keygen(os.path.join(d, "other.key"))
            fp = cmf.sign_file(path, os.path.join(d, "me.key"))
            pub, other = (read_text(os.path.join(d, k + ".key.pub")) for k in ("me", "other"))
            with self.rt.open(path) as m:
                seen = []
                r = m.verify(trusted_keys=[pub], progress=lambda done, total: seen.append((done, total)))
                self.assertEqual(r.problems, [])
                self.assertEqual([(s.fingerprint, s.pubkey_hex, s.trusted) for s in r.signatures], [(fp, pub, True)])
                self.assertTrue(seen and seen[-1][0] == seen[-1][1])
                self.assertFalse(m.verify(trusted_keys=[other]).ok)
                # A flipped payload byte is a problem naming the tensor.
                emb = m.tensor("model.embed_tokens.weight")
                data_off = m.info().sections["data"][0]
            with open(path, "r+b") as f:
                f.seek(data_off + emb.offset + 10)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0x40]))
            with self.rt.open(path) as m:
                problems = m.verify(check_signature=False).problems
                self.assertTrue(any("model.embed_tokens.weight" in p for p in problems), problems)


class TextTest(Base):
    def test_tokenizer_round_trip(self):
        raw = CASES["raw"]
        with self.model.tokenizer() as tok:
            self.assertEqual(tok.encode(raw["prompt"]), raw["prompt_ids"])
            self.assertEqual(tok.decode(raw["generated_ids"]), raw["text"])
            self.assertGreater(tok.vocab_size, max(raw["generated_ids"]))
            im_end = tok.token_to_id("<|im_end|>")
            self.assertTrue(tok.is_special(im_end))
            self.assertEqual(tok.id_to_token(im_end), "<|im_end|>")
            with tok.detokenizer() as d:
                text = "".join(d.push(i) for i in raw["generated_ids"]) + d.finish()
            self.assertEqual(text, raw["text"])
            with self.assertRaises(cmf.Error) as e:
                tok.decode([10 ** 6])
            self.assertEqual(e.exception.name, "Bounds")

    def test_chat_templates(self):
        chat = CASES["chat"]
        self.assertEqual(self.model.render_chat(chat["messages"]), chat["prompt"])
        self.assertTrue(self.model.special_ids().has_chat_template)
        tmpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        self.assertEqual(cmf.chat_render(tmpl, {"messages": [{"role": "user", "content": "hi"}]}), "[user] hi\n")
        with self.assertRaises(cmf.Error) as e:
            cmf.chat_render("{{ raise_exception('no thanks') }}", {})
        self.assertEqual(e.exception.name, "Template")
        self.assertIn("no thanks", e.exception.message)


class SessionTest(Base):
    def test_greedy_generation_matches_the_reference(self):
        raw = CASES["raw"]
        with self.model.session() as s:
            got = []
            stats = s.generate(raw["prompt_ids"], max_tokens=raw["max_new_tokens"], on_token=got.append, **GREEDY)
            self.assertEqual(got, raw["generated_ids"])
            self.assertEqual(stats.stop_reason, "max_tokens")
            self.assertEqual(stats.generated_tokens, len(got))
            self.assertEqual(s.n_past, len(raw["prompt_ids"]) + len(got))
            s.reset()
            self.assertEqual(s.n_past, 0)
            self.assertEqual(list(s.stream(raw["prompt_ids"], max_tokens=16, **GREEDY)), raw["generated_ids"][:16])
            s.reset()
            text = "".join(s.generate_text(raw["prompt"], max_tokens=raw["max_new_tokens"], **GREEDY))
            self.assertEqual(text, raw["text"])
            s.reset()
            logits = s.eval(raw["prompt_ids"])
            self.assertEqual(len(logits), s.vocab_size)
            self.assertEqual(max(range(len(logits)), key=lambda i: logits[i]), raw["generated_ids"][0])

    def test_callback_stop_and_exceptions(self):
        with self.model.session() as s:
            got = []
            stats = s.generate([1413, 363], max_tokens=20, on_token=lambda t: got.append(t) or len(got) == 3,
                               **GREEDY)
            self.assertEqual((stats.stop_reason, len(got)), ("callback", 3))

            def boom(token):
                raise KeyError("from the callback")
            with self.assertRaises(KeyError):
                s.generate([1413], max_tokens=5, on_token=boom)
            # Leaving a stream early stops the generation. The worker runs at
            # most a full queue (64 tokens) plus one ahead of the reader,
            # however the threads are scheduled, so 200 tokens are never all
            # made. (The context already holds the two calls above: count
            # from where the stream starts.)
            n0 = s.n_past
            it = s.stream([1413, 363], max_tokens=200, **GREEDY)
            first = next(it)
            time.sleep(0.3)  # time for the worker to fill the queue: the bound's worst case
            it.close()
            self.assertIsInstance(first, int)
            self.assertLessEqual(s.n_past - n0, 2 + 1 + 64 + 1)

    def test_cancel_from_another_thread(self):
        with self.model.session() as s:
            first = threading.Event()
            release = threading.Event()
            got = []

            def on_token(t):
                got.append(t)
                first.set()
                release.wait(30)  # parked until the other thread has cancelled
                return False

            def canceller():
                first.wait(30)
                s.cancel()
                release.set()
            th = threading.Thread(target=canceller)
            th.start()
            stats = s.generate([1413, 363, 258], max_tokens=40, on_token=on_token, **GREEDY)
            th.join()
            self.assertEqual(stats.stop_reason, "cancelled")
            self.assertEqual(len(got), 1)

    def test_one_call_at_a_time(self):
        with self.model.session() as s:
            inside = []

            def on_token(t):
                with self.assertRaises(cmf.Error) as e:
                    s.n_past
                inside.append(e.exception.message)
                return True
            s.generate([1413], max_tokens=3, on_token=on_token)
            self.assertIn("in use", inside[0])


class LifetimeTest(unittest.TestCase):
    def test_released_exactly_once_and_parents_close_children(self):
        rt = cmf.Runtime(threads=1)
        model = rt.open(MODEL)
        s = model.session()
        tok = model.tokenizer()
        d = tok.detokenizer()
        rt.close()  # closes the model, which closes its session
        self.assertTrue(model.closed and s.closed)
        self.assertFalse(tok.closed)  # a model's tokenizer does not borrow it
        for call in (lambda: model.info(), lambda: s.n_past, lambda: rt.threads):
            with self.assertRaises(cmf.Error) as e:
                call()
            self.assertIn("closed", e.exception.message)
        rt.close()
        model.close()
        tok.close()
        self.assertTrue(d.closed)
        with self.assertRaises(cmf.Error):
            rt.open(MODEL)

    def test_close_while_generating_cancels_and_waits(self):
        rt = cmf.Runtime(threads=1)
        model = rt.open(MODEL)
        s = model.session()
        started = threading.Event()
        result = []

        def run():
            result.append(s.generate([1413], max_tokens=0, on_token=lambda t: started.set(), **GREEDY))
        th = threading.Thread(target=run)
        th.start()
        started.wait(30)
        rt.close()  # cancels the running generation, waits for it, frees
        th.join()
        self.assertEqual(result[0].stop_reason, "cancelled")
        self.assertTrue(s.closed)

    def test_garbage_collection_frees(self):
        import gc
        import weakref
        rt = cmf.Runtime(threads=1)
        s = rt.open(MODEL).session()  # the model lives as long as its session
        ref = weakref.ref(s.model)
        self.assertIsNotNone(ref())
        del s
        gc.collect()
        self.assertIsNone(ref())
        rt.close()


class ExamplesTest(unittest.TestCase):
    def run_example(self, *args):
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
        return subprocess.run([sys.executable, "-B", os.path.join(here, args[0])] + list(args[1:]), check=True,
                              capture_output=True, text=True).stdout

    def test_generate_example(self):
        raw = CASES["raw"]
        out = self.run_example("generate.py", MODEL, "--raw", raw["prompt"], "-n", str(raw["max_new_tokens"]))
        self.assertEqual(out, raw["text"] + "\n")
        chat = CASES["chat"]
        out = self.run_example("generate.py", MODEL, chat["messages"][-1]["content"], "-n",
                               str(chat["max_new_tokens"]))
        self.assertEqual(out, chat["text"] + "\n")

    def test_inspect_example(self):
        out = self.run_example("inspect_model.py", MODEL, "--tensor", "model.norm.weight")
        self.assertIn("arch qwen3", out)
        self.assertIn("verify: ok", out)


if __name__ == "__main__":
    unittest.main()
