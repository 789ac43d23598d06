#!/usr/bin/python3
"""End-to-end test of `cmfhost convert` / `cmfhost requant` on the tiny HF
fixtures: convert, verify, info --json (arch block, dtypes), every tensor
decoded back (`cmfhost tensor`) within its dtype's bound of the source,
requant f16 -> q8, and failing conversions that leave nothing behind.

usage: cli_convert_test.py CMFHOST MODELS_DIR PLUGIN_PATH"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

CMFHOST, MODELS, PLUGINS = sys.argv[1:4]
F32, F16, BF16, Q8_ROW, Q8_2F, Q4TP = 0, 1, 2, 3, 9, 15
QUANT_DTYPE = {'f16': F16, 'q8': Q8_ROW, 'q4tp': Q4TP}
# Relative RMS bounds for quantized dtypes (as tests/convert/pipeline_test.cpp).
REL_RMS = {Q8_ROW: 0.02, Q8_2F: 0.02, Q4TP: 0.2}
failures = []


def fail(msg):
    failures.append(msg)
    print('FAIL:', msg, file=sys.stderr)


def run(*args, expect=0):
    p = subprocess.run([CMFHOST, *args, '--plugin-path', PLUGINS], capture_output=True, text=True)
    if expect is not None and p.returncode != expect:
        fail('%s: exit %d (want %d)\n%s%s' % (' '.join(args), p.returncode, expect, p.stdout, p.stderr))
    return p


def read_safetensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith('.safetensors'):
            continue
        raw = open(os.path.join(d, f), 'rb').read()
        n = int.from_bytes(raw[:8], 'little')
        hdr = json.loads(raw[8:8 + n])
        base = 8 + n
        for name, t in hdr.items():
            if name == '__metadata__':
                continue
            a, b = t['data_offsets']
            buf = raw[base + a:base + b]
            if t['dtype'] == 'F32':
                v = np.frombuffer(buf, '<f4')
            elif t['dtype'] == 'F16':
                v = np.frombuffer(buf, '<f2').astype(np.float32)
            elif t['dtype'] == 'BF16':
                v = (np.frombuffer(buf, '<u2').astype(np.uint32) << 16).view(np.float32)
            else:
                raise ValueError(t['dtype'])
            out[name] = v.astype(np.float64)
    return out


def expected_dtype(name, shape, quant):
    if len(shape) != 2 or shape[0] * shape[1] < 32 or name.endswith('.mlp.gate.weight'):
        return F16
    if quant == 'q4tp' and shape[1] % 32:
        return Q8_2F
    return QUANT_DTYPE[quant]


def check_decoded(model, t, src, tmp):
    out = os.path.join(tmp, 'dec.f32')
    if run('tensor', model, t['name'], '--out', out).returncode:
        return
    got = np.fromfile(out, '<f4').astype(np.float64)
    if got.size != src.size:
        fail('%s %s: %d values decoded, source has %d' % (model, t['name'], got.size, src.size))
        return
    d = t['dtype_id']
    if d == F16:
        bound = np.abs(src) * 2.0 ** -11 + 2.0 ** -24
        bad = int(np.sum(np.abs(got - src) > bound))
        if bad:
            fail('%s %s (f16): %d values off by more than half an ulp' % (model, t['name'], bad))
    elif d == F32:
        if not np.array_equal(got, src):
            fail('%s %s (f32): not exact' % (model, t['name']))
    else:
        rel = np.sqrt(np.mean((got - src) ** 2)) / max(np.sqrt(np.mean(src ** 2)), 1e-30)
        if not rel <= REL_RMS[d]:
            fail('%s %s (dtype %d): relative RMS error %.4f > %.4f' % (model, t['name'], d, rel, REL_RMS[d]))


def check_model(out, fixture, quant, src, tmp, want_arch, all_named):
    run('verify', out, '--no-progress')
    p = run('info', out, '--json')
    if p.returncode:
        return
    info = json.loads(p.stdout)
    header = info['header']
    arch = header.get('arch', {})
    for k, v in want_arch.items():
        if arch.get(k) != v:
            fail('%s: header.arch.%s = %r, want %r' % (out, k, arch.get(k), v))
    if 'section_hashes' not in header:
        fail('%s: header without section_hashes' % out)
    matched = 0
    for t in info['tensors']:
        want = expected_dtype(t['name'], t['shape'], quant)
        if t['dtype_id'] != want:
            fail('%s %s shape %s: dtype %d, want %d' % (out, t['name'], t['shape'], t['dtype_id'], want))
        s = src.get(t['name'])
        if s is None or s.size != int(np.prod(t['shape'])):
            if all_named:
                fail('%s: output tensor %s has no same-named source tensor' % (out, t['name']))
            continue
        matched += 1
        check_decoded(out, t, s, tmp)
    if matched == 0:
        fail('%s: no tensor compared with its source' % out)
    return info


def main():
    with tempfile.TemporaryDirectory() as tmp:
        cases = [('qwen3', 'f16', True), ('qwen3', 'q8', True), ('qwen3', 'q4tp', True),
                 ('qwen2', 'f16', True), ('qwen2', 'q8', True), ('qwen2', 'q4tp', True),
                 ('qwen3_moe', 'q8', False), ('gemma', 'q4tp', False)]
        for fixture, quant, all_named in cases:
            d = os.path.join(MODELS, fixture)
            cfg = json.load(open(os.path.join(d, 'config.json')))
            src = read_safetensors(d)
            out = os.path.join(tmp, '%s-%s.cmf' % (fixture, quant))
            if run('convert', '--model', d, '--output', out, '--quant', quant).returncode:
                continue
            want_arch = {'num_layers': cfg['num_hidden_layers'], 'hidden_size': cfg['hidden_size']}
            info = check_model(out, fixture, quant, src, tmp, want_arch, all_named)
            if info and quant == 'f16' and fixture == 'qwen3':
                # requant f16 -> q8: q8 dtypes, verify, decoded within q8's bound of the source.
                rq = os.path.join(tmp, 'qwen3-requant-q8.cmf')
                if run('requant', out, '--quant', 'q8', '-o', rq).returncode == 0:
                    rinfo = check_model(rq, fixture, 'q8', src, tmp, want_arch, True)
                    if rinfo and rinfo['header'].get('quant_type') == info['header'].get('quant_type'):
                        fail('requant left quant_type at %r' % rinfo['header'].get('quant_type'))
                # --only: just the MLP weights re-encoded, the rest copied.
                ro = os.path.join(tmp, 'qwen3-only-mlp.cmf')
                if run('requant', out, '--quant', 'q8', '--only', 'mlp.*', '-o', ro).returncode == 0:
                    run('verify', ro, '--no-progress')
                    oinfo = json.loads(run('info', ro, '--json').stdout)
                    for t in oinfo['tensors']:
                        want = expected_dtype(t['name'], t['shape'], 'q8' if '.mlp.' in t['name'] else 'f16')
                        if t['dtype_id'] != want:
                            fail('requant --only mlp.*: %s dtype %d, want %d' % (t['name'], t['dtype_id'], want))
        # The multimodal gemma3 wrapper converts as its text model; the
        # vision tower and projector are left out, and the user is told.
        g3 = os.path.join(tmp, 'gemma3-wrapper.cmf')
        p = run('convert', '--model', os.path.join(MODELS, 'gemma3'), '--output', g3, '--quant', 'q8')
        if p.returncode == 0:
            if 'not converted: 2 tensors' not in p.stderr or 'vision_tower.' not in p.stderr:
                fail('gemma3 wrapper: convert does not say the vision tower was left out: %s' % p.stderr)
            names = [t['name'] for t in json.loads(run('info', g3, '--json').stdout)['tensors']]
            if any('vision' in n or 'multi_modal' in n for n in names):
                fail('gemma3 wrapper: vision tensors in the file')
            if 'model.layers.0.self_attn.q_norm.weight' not in names:
                fail('gemma3 wrapper: the text stack was not renamed to model.*: %s' % names[:5])
        # Sharded output.
        sh = os.path.join(tmp, 'sharded.cmf')
        if run('convert', '--model', os.path.join(MODELS, 'qwen3'), '--output', sh, '--quant', 'f16',
               '--shard-max-gb', '0.00002').returncode == 0:
            shards = sorted(f for f in os.listdir(tmp) if f.startswith('sharded-'))
            if len(shards) < 2:
                fail('--shard-max-gb 0.00002 gave %d shard(s): %s' % (len(shards), shards))
            else:
                run('verify', os.path.join(tmp, shards[0]), '--no-progress')

        # Failures: clear message, exit code, nothing left behind.
        fdir = os.path.join(tmp, 'fail')
        os.makedirs(fdir)
        bad_model = os.path.join(tmp, 'unknown_arch')
        os.makedirs(bad_model)
        json.dump({'model_type': 'no_such_arch'}, open(os.path.join(bad_model, 'config.json'), 'w'))
        qwen3 = os.path.join(MODELS, 'qwen3')
        for args, code, text in [
                (['--model', os.path.join(tmp, 'missing'), '--quant', 'q8'], 1, 'does not exist'),
                (['--model', qwen3, '--quant', 'q9'], 2, 'q9'),
                (['--model', qwen3, '--quant', 'q8', '--quant-map', 'mlp.*'], 2, 'mlp'),
                (['--model', bad_model, '--quant', 'q8'], 1, 'no_such_arch')]:
            out = os.path.join(fdir, 'out.cmf')
            p = run('convert', *args, '--output', out, expect=code)
            if text not in p.stderr:
                fail('convert %s: stderr does not mention %r: %s' % (' '.join(args), text, p.stderr))
            left = os.listdir(fdir)
            if left:
                fail('convert %s left %s behind' % (' '.join(args), left))
        p = run('requant', os.path.join(tmp, 'qwen3-f16.cmf'), '--quant', 'q9', '-o', os.path.join(fdir, 'r.cmf'), expect=2)
        if os.listdir(fdir):
            fail('failed requant left %s behind' % os.listdir(fdir))
        run('convert', '--help')
        run('requant', '--help')
    if failures:
        print('%d failure(s)' % len(failures), file=sys.stderr)
        sys.exit(1)
    print('ok')


main()
