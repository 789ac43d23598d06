#!/usr/bin/python3
"""The bad input matrix: what a user sees when cmfhost meets broken input,
a hostile environment or a crash, and what is left on disk afterwards.

Usage: bad_inputs.py CMFHOST BUILD_DIR SOURCE_DIR [--markdown | --discover]

Each row builds its case in a fresh temporary directory, runs cmfhost as a
user would, and asserts the exact message on stderr, the exit status and
what remains (no file, the old file unchanged, never a half-written one).
docs/reliability.md holds the same table: --markdown prints it, and the
test fails when the document's table differs from the rows here.
--discover prints what each row observed without asserting (to write a
new row).
"""
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

CMFHOST, BUILD, SRC = (os.path.abspath(p) for p in sys.argv[1:4])
MODE = sys.argv[4] if len(sys.argv) > 4 else ''
PLUGIN_DIRS = [os.path.join(BUILD, 'plugins', d) for d in ('codecs', 'archs', os.path.join('archs', 'qwen'),
                                                            os.path.join('backends', 'cpu'))]
AUSTEN = os.path.join(SRC, 'models', 'austen-tiny')
TINY = os.path.join(BUILD, 'tests', 'convert', 'tiny_models')
BAD_PLUGINS = os.path.join(BUILD, 'tests')
ROWS = []


class Ran:
    def __init__(self, code, err, out=''):
        self.code, self.err, self.out = code, err, out


def run(args, env=None, limit_fsize=None, as_user=None, cwd=None):
    e = dict(os.environ)
    e['CMF_PLUGIN_PATH'] = ':'.join(PLUGIN_DIRS)
    e.update(env or {})

    def pre():
        if limit_fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_fsize, limit_fsize))
    cmd = [CMFHOST] + args
    if as_user:
        cmd = ['setpriv', '--reuid', as_user, '--regid', as_user, '--clear-groups', '--'] + cmd
    p = subprocess.run(cmd, env=e, cwd=cwd, capture_output=True, text=True, errors='replace', preexec_fn=pre,
                       timeout=300)
    return Ran(p.returncode, p.stderr, p.stdout)


def row(area, case, command, expect_code, expect_err, left):
    """Registers a case. The function gets a fresh directory D and returns a
    Ran; `expect_err` is the whole of stderr with D written as DIR; `left`
    says what remains, which the function asserts itself."""
    def deco(fn):
        ROWS.append(dict(area=area, case=case, command=command, code=expect_code, err=expect_err, left=left, fn=fn))
        return fn
    return deco


def sha(path):
    return hashlib.sha256(open(path, 'rb').read()).hexdigest() if os.path.exists(path) else None


def listing(d):
    """Every file under d (hidden ones included), relative, sorted."""
    out = []
    for base, _, files in os.walk(d):
        out += [os.path.relpath(os.path.join(base, f), d) for f in files]
    return sorted(out)


_cache = {}


def converted(quant='q8', shard_gb=None):
    """austen-tiny converted once per (quant, sharding), copied on use."""
    key = (quant, shard_gb)
    if key not in _cache:
        d = tempfile.mkdtemp(prefix='cmf-matrix-model-')
        out = os.path.join(d, 'austen.cmf')
        args = ['convert', '--model', AUSTEN, '-o', out, '-q', quant, '--no-progress']
        if shard_gb:
            args += ['--shard-max-gb', str(shard_gb)]
        r = run(args)
        assert r.code == 0, r.err
        _cache[key] = d
    return _cache[key]


def copy_model(dst_dir, quant='q8'):
    src = os.path.join(converted(quant), 'austen.cmf')
    dst = os.path.join(dst_dir, 'austen.cmf')
    shutil.copy(src, dst)
    return dst


# ---- model files ------------------------------------------------------------

@row('model file', 'random bytes', 'info x.cmf', 1,
     'cmfhost info: InvalidMagic: not a CMF file: magic is not "CMF\\x01"', 'nothing written')
def _(d):
    p = os.path.join(d, 'x.cmf')
    open(p, 'wb').write(random.Random(1).randbytes(4096))
    return run(['info', p])


@row('model file', 'empty file', 'info x.cmf', 1,
     'cmfhost info: Bounds: file is 0 bytes, shorter than the 128-byte envelope', 'nothing written')
def _(d):
    p = os.path.join(d, 'x.cmf')
    open(p, 'wb').close()
    return run(['info', p])


@row('model file', 'truncated to half', 'info austen.cmf', 1, None, 'nothing written')
def _(d):
    p = copy_model(d)
    size = os.path.getsize(p)
    os.truncate(p, size // 2)
    return run(['info', p])


@row('model file', 'a section length beyond the file (2^62)', 'info austen.cmf', 1, None, 'nothing written')
def _(d):
    p = copy_model(d)
    with open(p, 'r+b') as f:
        f.seek(24 + 16 * 2)  # data section length
        f.write(struct.pack('<Q', 1 << 62))
    return run(['info', p])


@row('model file', 'a tensor whose shape needs more bytes than it has', 'info austen.cmf', 1, None, 'nothing written')
def _(d):
    p = copy_model(d)
    b = bytearray(open(p, 'rb').read())
    dir_off, = struct.unpack_from('<Q', b, 16 + 16 * 1)
    struct.pack_into('<I', b, dir_off + 16 + 8, 0xFFFFFFFF)  # first record, shape[0]
    open(p, 'wb').write(b)
    return run(['info', p])


@row('model file', 'a directory instead of a file', 'info DIR', 1, None, 'nothing written')
def _(d):
    return run(['info', d])


@row('model file', 'missing file', 'info nothere.cmf', 1, None, 'nothing written')
def _(d):
    return run(['info', os.path.join(d, 'nothere.cmf')])


# ---- shards ------------------------------------------------------------------

def sharded(d, quant='q8'):
    src = converted(quant, shard_gb=0.002)
    names = sorted(n for n in os.listdir(src) if n.endswith('.cmf'))
    for n in names:
        shutil.copy(os.path.join(src, n), d)
    return names


@row('shards', 'one shard of a model missing', 'info austen-00001-of-00005.cmf', 1, None, 'nothing written')
def _(d):
    names = sharded(d)
    assert len(names) == 5, names
    os.remove(os.path.join(d, names[1]))
    return run(['info', os.path.join(d, names[0])])


@row('shards', "a shard of another conversion (q4) among q8 shards", 'info austen-00001-of-00005.cmf', 1, None,
     'nothing written')
def _(d):
    names = sharded(d)
    q4 = converted('q4', shard_gb=0.002)
    shutil.copy(os.path.join(q4, names[2]), os.path.join(d, names[2]))
    return run(['info', os.path.join(d, names[0])])


def tiny_copy(d, name):
    dst = os.path.join(d, name)
    shutil.copytree(os.path.join(TINY, name), dst)
    return dst


@row('shards', 'a checkpoint shard listed in model.safetensors.index.json missing',
     'convert --model qwen3_moe -o out.cmf', 1, None, 'no output file')
def _(d):
    m = tiny_copy(d, 'qwen3_moe')
    os.remove(os.path.join(m, 'model-00002-of-00002.safetensors'))
    r = run(['convert', '--model', m, '-o', os.path.join(d, 'out.cmf'), '--no-progress'])
    assert not [f for f in os.listdir(d) if f != 'qwen3_moe'], os.listdir(d)
    return r


@row('shards', 'the index lists a tensor its shard does not hold', 'convert --model qwen3_moe -o out.cmf', 1, None,
     'no output file')
def _(d):
    m = tiny_copy(d, 'qwen3_moe')
    idx = os.path.join(m, 'model.safetensors.index.json')
    j = json.load(open(idx))
    j['weight_map']['model.layers.0.mlp.ghost.weight'] = 'model-00001-of-00002.safetensors'
    json.dump(j, open(idx, 'w'))
    r = run(['convert', '--model', m, '-o', os.path.join(d, 'out.cmf'), '--no-progress'])
    assert not [f for f in os.listdir(d) if f != 'qwen3_moe'], os.listdir(d)
    return r


# ---- tokenizer.json ------------------------------------------------------------

def tokenizer_with(d, edit):
    t = json.load(open(os.path.join(AUSTEN, 'tokenizer.json'), encoding='utf-8'))
    edit(t)
    p = os.path.join(d, 'tokenizer.json')
    json.dump(t, open(p, 'w', encoding='utf-8'))
    return p


@row('tokenizer.json', 'model type WordPiece', 'tokenize --tokenizer tokenizer.json hello', 1, None, 'nothing written')
def _(d):
    return run(['tokenize', '--tokenizer', tokenizer_with(d, lambda t: t['model'].update(type='WordPiece')), 'hello'])


@row('tokenizer.json', 'model type Unigram', 'tokenize --tokenizer tokenizer.json hello', 1, None, 'nothing written')
def _(d):
    return run(['tokenize', '--tokenizer', tokenizer_with(d, lambda t: t['model'].update(type='Unigram')), 'hello'])


@row('tokenizer.json', 'an unknown pre-tokenizer type', 'tokenize --tokenizer tokenizer.json hello', 1, None,
     'nothing written')
def _(d):
    return run(['tokenize', '--tokenizer', tokenizer_with(d, lambda t: t.update(pre_tokenizer={'type': 'Sentencizer'})),
                'hello'])


@row('tokenizer.json', 'a vocabulary id of 2^31 - 1', 'tokenize --tokenizer tokenizer.json hello', 1, None,
     'nothing written')
def _(d):
    return run(['tokenize', '--tokenizer', tokenizer_with(d, lambda t: t['model']['vocab'].update(zzz=2 ** 31 - 1)),
                'hello'])


@row('tokenizer.json', 'not JSON', 'tokenize --tokenizer tokenizer.json hello', 1, None, 'nothing written')
def _(d):
    p = os.path.join(d, 'tokenizer.json')
    open(p, 'w').write('{"model": {"type": "BPE", "vocab": {')
    return run(['tokenize', '--tokenizer', p, 'hello'])


@row('tokenizer.json', 'model type WordPiece in a checkpoint being converted', 'convert --model m -o out.cmf', 1, None,
     'no output file')
def _(d):
    m = os.path.join(d, 'm')
    shutil.copytree(AUSTEN, m)
    tokenizer_with(m, lambda t: t['model'].update(type='WordPiece'))
    r = run(['convert', '--model', m, '-o', os.path.join(d, 'out.cmf'), '--no-progress'])
    assert not os.path.exists(os.path.join(d, 'out.cmf'))
    return r


# ---- chat templates -------------------------------------------------------------

def render(d, template):
    tc = os.path.join(d, 'tokenizer_config.json')
    json.dump({'chat_template': template}, open(tc, 'w'))
    conv = os.path.join(d, 'conv.json')
    json.dump([{'role': 'user', 'content': 'Hello'}], open(conv, 'w'))
    return run(['render', '--tokenizer-config', tc, '--messages', conv])


@row('chat template', 'a loop that never ends in time (10^12 iterations)', 'render --tokenizer-config tc.json ...', 1,
     None, 'nothing written')
def _(d):
    return render(d, '{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}')


@row('chat template', 'a macro that calls itself forever', 'render --tokenizer-config tc.json ...', 1, None,
     'nothing written')
def _(d):
    return render(d, '{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}')


@row('chat template', 'brackets nested 10 000 deep', 'render --tokenizer-config tc.json ...', 1, None,
     'nothing written')
def _(d):
    return render(d, '{{ ' + '(' * 10000 + '1' + ')' * 10000 + ' }}')


@row('chat template', 'a namespace that contains itself, printed', 'render --tokenizer-config tc.json ...', 1, None,
     'nothing written')
def _(d):
    return render(d, '{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns.a | tojson }}')


@row('chat template', 'a string of 10^12 bytes', 'render --tokenizer-config tc.json ...', 1, None, 'nothing written')
def _(d):
    return render(d, "{{ 'x' * 1000000000000 }}")


@row('chat template', 'a string doubled 40 times', 'render --tokenizer-config tc.json ...', 1, None, 'nothing written')
def _(d):
    return render(d, '{% set ns = namespace(s="ab") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}'
                     '{% endfor %}{{ ns.s | length }}')


@row('chat template', 'an integer overflow', 'render --tokenizer-config tc.json ...', 1, None, 'nothing written')
def _(d):
    return render(d, '{{ 9223372036854775807 + 1 }}')


# ---- checkpoints whose config lies -----------------------------------------------

def lying(d, **changes):
    m = os.path.join(d, 'm')
    shutil.copytree(AUSTEN, m)
    cfg = json.load(open(os.path.join(m, 'config.json')))
    cfg.update(changes)
    json.dump(cfg, open(os.path.join(m, 'config.json'), 'w'))
    r = run(['convert', '--model', m, '-o', os.path.join(d, 'out.cmf'), '--no-progress'])
    assert not os.path.exists(os.path.join(d, 'out.cmf'))
    return r


@row('checkpoint', 'config.json says hidden_size 384, the tensors have 192', 'convert --model m -o out.cmf', 1, None,
     'no output file')
def _(d):
    return lying(d, hidden_size=384)


@row('checkpoint', 'config.json says 6 layers, the tensors have 4', 'convert --model m -o out.cmf', 1, None,
     'no output file')
def _(d):
    return lying(d, num_hidden_layers=6)


@row('checkpoint', 'config.json says vocab_size 8192, the embedding has 4096 rows', 'convert --model m -o out.cmf', 1,
     None, 'no output file')
def _(d):
    return lying(d, vocab_size=8192)


@row('checkpoint', 'config.json says 8 attention heads of 48, q_proj has 4', 'convert --model m -o out.cmf', 1, None,
     'no output file')
def _(d):
    return lying(d, num_attention_heads=8)


def main():
    if MODE == '--markdown':
        print(markdown())
        return 0
    failures = 0
    for r in ROWS:
        d = tempfile.mkdtemp(prefix='cmf-matrix-')
        try:
            got = r['fn'](d)
        except Exception as e:  # a row's own assertion about what is left
            print('FAIL %s / %s: %r' % (r['area'], r['case'], e))
            failures += 1
            continue
        finally:
            pass
        err = got.err.replace(d, 'DIR').strip()
        if MODE == '--discover':
            print('%s / %s\n  exit %s\n  %s' % (r['area'], r['case'], got.code, err.replace('\n', '\n  ')))
        elif got.code != r['code'] or (r['err'] is not None and err != r['err']):
            print('FAIL %s / %s:\n  exit %s (want %s)\n  stderr: %s\n  want:   %s' % (
                r['area'], r['case'], got.code, r['code'], err, r['err']))
            failures += 1
        shutil.rmtree(d, ignore_errors=True)
    for d in _cache.values():
        shutil.rmtree(d, ignore_errors=True)
    if MODE == '':
        doc = open(os.path.join(SRC, 'docs', 'reliability.md'), encoding='utf-8').read()
        if markdown() not in doc:
            print('FAIL docs/reliability.md: its bad input table differs from these rows; '
                  'regenerate it with: %s %s %s %s --markdown' % (sys.argv[0], CMFHOST, BUILD, SRC))
            failures += 1
    print('%d rows, %d failed' % (len(ROWS), failures))
    return 1 if failures else 0


def markdown():
    lines = ['| what | command | what the user sees (stderr) | exit | left behind |',
             '|---|---|---|---|---|']
    for r in ROWS:
        err = (r['err'] or '').replace('|', '\\|').replace('\n', '<br>')
        lines.append('| %s: %s | `cmfhost %s` | `%s` | %s | %s |' % (
            r['area'], r['case'], r['command'], err, r['code'], r['left']))
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
