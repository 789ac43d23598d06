#!/usr/bin/python3
"""tokenizer.model -> tokenizer.json in the converter, against SentencePiece.

Usage: sentencepiece_test.py CMFHOST TINY_MODELS_DIR CORPUS_JSON

Trains small byte-fallback BPE models with Debian's spm_train on text made
from the text tests' corpus (tests/text/fixtures/corpus.json), in the
configuration Gemma's tokenizer.model has (identity normalizer, no dummy
prefix, whitespace kept, <pad>/<eos>/<bos>/<unk> at 0-3, <start_of_turn> and
<end_of_turn> as user-defined pieces). Each model is put beside the tiny
gemma checkpoint in place of its tokenizer.json and converted with
`cmfhost convert`; the ids `cmfhost tokenize` gives from the .cmf's
tokenizer must equal spm_encode's on every corpus string (plus strings with
the turn markers and characters the model never saw, which fall back to
bytes; a control piece written in the text, e.g. "<bos>", is one token, as
HF's tokenizer matches special tokens, and the text around it goes through
spm_encode piece by piece), and with special tokens the <bos> is prepended;
tokenizer_config.json's add_bos_token / add_eos_token decide the
post-processor as HF's Gemma and Llama fast tokenizers do. Then: a unigram
model is refused by name, and a checkpoint without any tokenizer converts
with a warning and `cmfhost run` says why it cannot chat.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    cmfhost, models, corpus_path = sys.argv[1:]
    if not shutil.which("spm_train") or not shutil.which("spm_encode"):
        print("SKIP: spm_train/spm_encode not found (scripts/setup.sh --tests installs sentencepiece)", file=sys.stderr)
        sys.exit(77)
    corpus = json.load(open(corpus_path, encoding="utf-8"))
    # spm_encode reads one sentence per line: strings without line breaks.
    strings = [s for s in corpus if "\n" not in s and "\r" not in s and s.strip() == s and s][:400]
    strings += ["<start_of_turn>user\tHello<end_of_turn>", "a<end_of_turn><start_of_turn>b",
                "\u65e5\u672c\u8a9e \U0001F600 \u00e9", "  two  spaces\tand\ttabs  "]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "train.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n".join(corpus[:1500]) + "\n")
        for vocab in (1000, 2000):
            prefix = os.path.join(tmp, f"bpe{vocab}")
            r = run(["spm_train", f"--input={text}", f"--model_prefix={prefix}", "--model_type=bpe",
                     f"--vocab_size={vocab}", "--byte_fallback=true", "--add_dummy_prefix=false",
                     "--remove_extra_whitespaces=false", "--normalization_rule_name=identity",
                     "--character_coverage=0.98", "--split_digits=true", "--allow_whitespace_only_pieces=true",
                     "--user_defined_symbols=<start_of_turn>,<end_of_turn>", "--pad_id=0", "--eos_id=1",
                     "--bos_id=2", "--unk_id=3", "--pad_piece=<pad>", "--eos_piece=<eos>", "--bos_piece=<bos>",
                     "--unk_piece=<unk>", "--minloglevel=2"])
            if r.returncode != 0:
                sys.exit(f"spm_train failed: {r.stderr[-2000:]}")
            ckpt = os.path.join(tmp, f"gemma{vocab}")
            shutil.copytree(os.path.join(models, "gemma"), ckpt)
            for name in ("tokenizer.json",):
                if os.path.exists(os.path.join(ckpt, name)):
                    os.remove(os.path.join(ckpt, name))
            shutil.copy(prefix + ".model", os.path.join(ckpt, "tokenizer.model"))
            out = os.path.join(tmp, f"gemma{vocab}.cmf")
            r = run([cmfhost, "convert", "--model", ckpt, "--output", out, "--quant", "f16"])
            if r.returncode != 0:
                sys.exit(f"convert failed: {r.stderr}")
            # HF matches control pieces (<bos>, <eos>, <pad>, <unk>) in the
            # text as whole tokens; spm_encode spells them out. The expected
            # ids: the text between control pieces through spm_encode, the
            # control pieces' own ids between.
            controls = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
            pattern = re.compile("(" + "|".join(re.escape(c) for c in controls) + ")")
            parts = [[p for p in pattern.split(s) if p] for s in strings]
            segments = [p for ps in parts for p in ps if p not in controls]
            enc = run(["spm_encode", f"--model={prefix}.model", "--output_format=id"],
                      input="\n".join(segments) + "\n")
            seg_ids = iter([[int(x) for x in line.split()] for line in enc.stdout.split("\n")[:len(segments)]])
            want = [[i for p in ps for i in ([controls[p]] if p in controls else next(seg_ids))] for ps in parts]
            strings_file = os.path.join(tmp, "strings.json")
            with open(strings_file, "w", encoding="utf-8") as f:
                json.dump(strings, f)
            got = json.loads(run([cmfhost, "tokenize", out, "--file", strings_file]).stdout)
            bad = [(s, w, g) for s, w, g in zip(strings, want, got) if w != g]
            for s, w, g in bad[:5]:
                print(f"vocab {vocab}: {s!r}\n  spm_encode {w}\n  cmf        {g}", file=sys.stderr)
            print(f"vocab {vocab}: {len(strings) - len(bad)}/{len(strings)} strings encode as spm_encode does")
            failures += len(bad)
            with_bos = json.loads(run([cmfhost, "tokenize", out, "Hello", "--special", "--json"]).stdout)["ids"]
            plain = json.loads(run([cmfhost, "tokenize", out, "Hello", "--json"]).stdout)["ids"]
            if with_bos != [2] + plain:
                print(f"with special tokens: {with_bos}, expected [2] + {plain}", file=sys.stderr)
                failures += 1
            markers = [s for s in strings if "<end_of_turn>" in s]
            if not all(4 in g or 5 in g for s, g in zip(strings, got) if s in markers):
                print("the turn markers are not single tokens", file=sys.stderr)
                failures += 1

        # The bos/eos policy of tokenizer_config.json, as HF's Gemma and
        # Llama fast tokenizers apply it when they load: the same model with
        # add_bos_token false and add_eos_token true encodes "Hello" as
        # Hello <eos>; a tokenizer.json whose post-processor adds <bos> is
        # rebuilt the same way for those classes, and kept as it is for others.
        ckpt = os.path.join(tmp, "gemma_policy")
        shutil.copytree(os.path.join(models, "gemma"), ckpt)
        os.remove(os.path.join(ckpt, "tokenizer.json"))
        shutil.copy(os.path.join(tmp, "bpe1000.model"), os.path.join(ckpt, "tokenizer.model"))
        with open(os.path.join(ckpt, "tokenizer_config.json"), "w") as f:
            json.dump({"add_bos_token": False, "add_eos_token": True, "eos_token": "<eos>"}, f)
        out = os.path.join(tmp, "policy.cmf")
        run([cmfhost, "convert", "--model", ckpt, "--output", out])
        ids = json.loads(run([cmfhost, "tokenize", out, "Hello", "--special", "--json"]).stdout)["ids"]
        if ids[0] == 2 or ids[-1] != 1:
            print(f"tokenizer.model with add_bos_token false, add_eos_token true: {ids}", file=sys.stderr)
            failures += 1
        os.remove(os.path.join(ckpt, "tokenizer.model"))
        tok = {"version": "1.0", "added_tokens": [
                   {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                    "normalized": False, "special": True} for i, c in enumerate(["<pad>", "<eos>", "<bos>"])],
               "normalizer": None, "pre_tokenizer": None,
               "post_processor": {"type": "TemplateProcessing",
                                  "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                             {"Sequence": {"id": "A", "type_id": 0}}],
                                  "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                           {"Sequence": {"id": "A", "type_id": 0}},
                                           {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                                           {"Sequence": {"id": "B", "type_id": 1}}],
                                  "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
               "decoder": None,
               "model": {"type": "BPE", "vocab": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "a": 3, "b": 4}, "merges": []}}
        with open(os.path.join(ckpt, "tokenizer.json"), "w") as f:
            json.dump(tok, f)
        for cls, want in (("GemmaTokenizer", [3, 4, 1]), ("GemmaTokenizerFast", [3, 4, 1]),
                          ("PreTrainedTokenizerFast", [2, 3, 4])):
            with open(os.path.join(ckpt, "tokenizer_config.json"), "w") as f:
                json.dump({"tokenizer_class": cls, "add_bos_token": False, "add_eos_token": True,
                           "bos_token": "<bos>", "eos_token": "<eos>"}, f)
            run([cmfhost, "convert", "--model", ckpt, "--output", out])
            ids = json.loads(run([cmfhost, "tokenize", out, "ab", "--special", "--json"]).stdout)["ids"]
            if ids != want:
                print(f"tokenizer.json with {cls}, add_bos_token false, add_eos_token true: {ids}, want {want}",
                      file=sys.stderr)
                failures += 1

        # A unigram model is refused with the reason.
        uni = os.path.join(tmp, "uni")
        ascii_text = os.path.join(tmp, "ascii.txt")
        with open(ascii_text, "w", encoding="utf-8") as f:
            f.write("\n".join(s for s in corpus[:1500] if s.isascii()) + "\n")
        r = run(["spm_train", f"--input={ascii_text}", f"--model_prefix={uni}", "--model_type=unigram",
                 "--vocab_size=200", "--minloglevel=2"])
        if r.returncode != 0:
            sys.exit(f"spm_train (unigram) failed: {r.stderr[-2000:]}")
        ckpt = os.path.join(tmp, "gemma_uni")
        shutil.copytree(os.path.join(models, "gemma"), ckpt)
        os.remove(os.path.join(ckpt, "tokenizer.json"))
        shutil.copy(uni + ".model", os.path.join(ckpt, "tokenizer.model"))
        r = run([cmfhost, "convert", "--model", ckpt, "--output", os.path.join(tmp, "uni.cmf")])
        if r.returncode == 0 or "unigram" not in r.stderr or os.path.exists(os.path.join(tmp, "uni.cmf")):
            print(f"a unigram tokenizer.model was not refused clearly: {r.returncode} {r.stderr}", file=sys.stderr)
            failures += 1

        # A truncated tokenizer.model is refused naming the file; nothing is left behind.
        with open(uni + ".model", "rb") as f:
            head = f.read(100)
        with open(os.path.join(ckpt, "tokenizer.model"), "wb") as f:
            f.write(head)
        bad_out = os.path.join(tmp, "truncated.cmf")
        r = run([cmfhost, "convert", "--model", ckpt, "--output", bad_out])
        if r.returncode == 0 or "tokenizer.model: SentencePiece model:" not in r.stderr or os.path.exists(bad_out):
            print(f"a truncated tokenizer.model was not refused clearly: {r.returncode} {r.stderr}", file=sys.stderr)
            failures += 1

        # No tokenizer at all: converts with a warning; run says why it cannot chat.
        ckpt = os.path.join(tmp, "gemma_none")
        shutil.copytree(os.path.join(models, "gemma"), ckpt)
        os.remove(os.path.join(ckpt, "tokenizer.json"))
        out = os.path.join(tmp, "none.cmf")
        r = run([cmfhost, "convert", "--model", ckpt, "--output", out])
        if r.returncode != 0 or "no tokenizer" not in r.stderr:
            print(f"convert without a tokenizer: {r.returncode} {r.stderr}", file=sys.stderr)
            failures += 1
        r = run([cmfhost, "run", out, "-p", "hi", "-n", "2"])
        if r.returncode == 0 or "no tokenizer" not in r.stderr:
            print(f"run without a tokenizer: {r.returncode} {r.stderr}", file=sys.stderr)
            failures += 1
    if failures:
        sys.exit(f"{failures} failures")


if __name__ == "__main__":
    main()
