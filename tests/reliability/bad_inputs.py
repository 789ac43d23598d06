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
import atexit
import hashlib
import json
import os
import random
import re
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


# Where the rows run as another user find cmfhost, its libraries, plugins and
# the source model: the build and source trees themselves when that user can
# read them, else a copy in a world-readable temporary directory (a checkout
# under a private directory, as /root or mktemp -d, is unreadable to nobody).
# The copy's root is written as SRC in the errors compared.
STAGE = {}


def as_uid(uid, cmd):
    """cmd run as user and group uid, without supplementary groups."""
    return ['setpriv', '--reuid', str(uid), '--regid', str(uid), '--clear-groups', '--'] + cmd


def stage_binary(src, dst):
    """src made reachable at dst: the same file linked (a sanitizer build's
    libraries and plugins are hundreds of MB; copies filled a small CI disk),
    a copy only across file systems. Symlinks stay symlinks."""
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    os.chmod(dst, 0o755)


def stage_binaries(src_dir, dst_dir, wanted):
    """stage_binary for each file of src_dir whose name is wanted (not the
    directories beside them, as meson's libcmf.so.0.1.0.p/)."""
    os.makedirs(dst_dir)
    for n in os.listdir(src_dir):
        if wanted(n) and not os.path.isdir(os.path.join(src_dir, n)):
            stage_binary(os.path.join(src_dir, n), os.path.join(dst_dir, n))


def tools_for(uid):
    if uid in STAGE:
        return STAGE[uid]
    probe = subprocess.run(as_uid(uid, [CMFHOST, '--version']), capture_output=True, text=True, errors='replace', timeout=60,
                           env=dict(os.environ, CMF_PLUGIN_PATH=':'.join(PLUGIN_DIRS)))
    reach = subprocess.run(as_uid(uid, ['sh', '-c', 'for p; do test -r "$p" -a -x "$p" || exit 1; done', 'sh'] +
                                  PLUGIN_DIRS + [AUSTEN]),
                           capture_output=True, timeout=60)
    if probe.returncode == 0 and reach.returncode == 0:
        STAGE[uid] = (CMFHOST, PLUGIN_DIRS, None)
        return STAGE[uid]
    root = tempfile.mkdtemp(prefix='cmf-matrix-tools-')
    os.chmod(root, 0o755)
    stage_binaries(os.path.join(BUILD, 'core'), os.path.join(root, 'core'), lambda n: n.startswith('libcmf.so'))
    os.makedirs(os.path.join(root, 'host'))
    # its RUNPATH $ORIGIN/../core finds the staged library
    stage_binary(CMFHOST, os.path.join(root, 'host', os.path.basename(CMFHOST)))
    dirs = []
    for i, p in enumerate(PLUGIN_DIRS):
        dirs.append(os.path.join(root, 'plugins', str(i)))
        stage_binaries(p, dirs[-1], lambda n: n.endswith('.so'))
    models = os.path.join(root, 'models')
    shutil.copytree(AUSTEN, os.path.join(models, 'austen-tiny'))
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        if dirpath.startswith(models):
            for n in filenames:
                os.chmod(os.path.join(dirpath, n), 0o644)
    STAGE[uid] = (os.path.join(root, 'host', os.path.basename(CMFHOST)), dirs, root)
    return STAGE[uid]


def source_model(uid):
    """AUSTEN as the user uid reads it."""
    root = tools_for(uid)[2] if uid else None
    return os.path.join(root, 'models', 'austen-tiny') if root else AUSTEN


def run(args, env=None, limit_fsize=None, as_user=None, cwd=None):
    host, plugin_dirs = (tools_for(as_user)[:2]) if as_user else (CMFHOST, PLUGIN_DIRS)
    e = dict(os.environ)
    e['CMF_PLUGIN_PATH'] = ':'.join(plugin_dirs)
    e.update(env or {})

    def pre():
        if limit_fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_fsize, limit_fsize))
    cmd = [host] + args
    if as_user:
        cmd = as_uid(as_user, cmd)
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
     'cmfhost info: DIR/x.cmf: InvalidMagic: not a CMF file: magic is not "CMF\\x01"', 'nothing written')
def _(d):
    p = os.path.join(d, 'x.cmf')
    open(p, 'wb').write(random.Random(1).randbytes(4096))
    return run(['info', p])


@row('model file', 'empty file', 'info x.cmf', 1,
     'cmfhost info: DIR/x.cmf: Bounds: file is 0 bytes, shorter than the 128-byte envelope', 'nothing written')
def _(d):
    p = os.path.join(d, 'x.cmf')
    open(p, 'wb').close()
    return run(['info', p])


@row('model file', 'truncated to half', 'info austen.cmf', 1, 'cmfhost info: DIR/austen.cmf: Bounds: data section [7032832, 9550016) beyond the end of the file (4823650 bytes)', 'nothing written')
def _(d):
    p = copy_model(d)
    size = os.path.getsize(p)
    os.truncate(p, size // 2)
    return run(['info', p])


@row('model file', 'a section length beyond the file (2^62)', 'info austen.cmf', 1, 'cmfhost info: DIR/austen.cmf: Bounds: data section [7032832, 4611686018434420736) beyond the end of the file (9647301 bytes)', 'nothing written')
def _(d):
    p = copy_model(d)
    with open(p, 'r+b') as f:
        f.seek(24 + 16 * 2)  # data section length
        f.write(struct.pack('<Q', 1 << 62))
    return run(['info', p])


@row('model file', 'a tensor whose shape needs more bytes than it has', 'info austen.cmf', 1, "cmfhost info: DIR/austen.cmf: Bounds: tensor 'model.embed_tokens.weight' (q8_row): nbytes 794624 but its shape needs 833223655230", 'nothing written')
def _(d):
    p = copy_model(d)
    b = bytearray(open(p, 'rb').read())
    dir_off, = struct.unpack_from('<Q', b, 16 + 16 * 1)
    struct.pack_into('<I', b, dir_off + 16 + 8, 0xFFFFFFFF)  # first record, shape[0]
    open(p, 'wb').write(b)
    return run(['info', p])


@row('model file', 'a directory instead of a file', 'info DIR', 1, "cmfhost info: DIR: Io: 'DIR' is a directory, not a CMF file", 'nothing written')
def _(d):
    return run(['info', d])


@row('model file', 'missing file', 'info nothere.cmf', 1, "cmfhost info: DIR/nothere.cmf: FileNotFound: file not found: 'DIR/nothere.cmf'", 'nothing written')
def _(d):
    return run(['info', os.path.join(d, 'nothere.cmf')])


def damaged_payload(d):
    """austen.cmf with one byte of its data section flipped (a bit rot or a
    bad copy: every structure still parses, one tensor's hash no longer
    matches)."""
    p = copy_model(d)
    with open(p, 'r+b') as f:
        f.seek(16 + 16 * 2)
        data_off, = struct.unpack('<Q', f.read(8))
        f.seek(data_off + 4096)
        b = f.read(1)
        f.seek(data_off + 4096)
        f.write(bytes([b[0] ^ 0x40]))
    return p


def on_damaged(d, args_of):
    """Runs cmfhost args_of(path of a damaged model) and asserts it wrote nothing."""
    m = damaged_payload(d)
    before = listing(d)
    r = run(args_of(m))
    nothing_new(d, before)
    return r


@row('model file', 'one payload byte flipped, requantized', 'requant austen.cmf -q q4 -o out.cmf', 1,
     "cmfhost requant: requant DIR/austen.cmf: HashMismatch: DIR/austen.cmf: tensor 'model.embed_tokens.weight': payload hash64 31f22e2ccfd7d538 does not match its directory's 7cefab1fe0cbcd6f (the file is damaged; cmfhost verify lists every such tensor)",
     'no output file, no temp file')
def _(d):
    return on_damaged(d, lambda m: ['requant', m, '-q', 'q4', '-o', os.path.join(d, 'out.cmf'), '--no-progress'])


@row('model file', 'one payload byte flipped, compacted', 'compact austen.cmf -o out.cmf', 1,
     "cmfhost compact: DIR/austen.cmf: HashMismatch: DIR/austen.cmf: tensor 'model.embed_tokens.weight': payload hash64 31f22e2ccfd7d538 does not match its directory's 7cefab1fe0cbcd6f (the file is damaged; cmfhost verify lists every such tensor)",
     'no output file, no temp file')
def _(d):
    return on_damaged(d, lambda m: ['compact', m, '-o', os.path.join(d, 'out.cmf')])


# ---- shards ------------------------------------------------------------------

SHARD_GB = 0.001  # ~1 MiB of payload per shard: austen-tiny q8 makes 3


def sharded(d, src):
    names = sorted(n for n in os.listdir(src) if n.endswith('.cmf'))
    for n in names:
        shutil.copy(os.path.join(src, n), d)
    return names


@row('shards', 'one shard of a model missing', 'info austen-00001-of-00003.cmf', 1, "cmfhost info: DIR/austen-00001-of-00003.cmf: FileNotFound: shard 2 of 3 is missing: 'DIR/austen-00002-of-00003.cmf'", 'nothing written')
def _(d):
    names = sharded(d, converted('q8', SHARD_GB))
    assert len(names) == 3, names
    os.remove(os.path.join(d, names[1]))
    return run(['info', os.path.join(d, names[0])])


def other_conversion():
    """austen-tiny with one weight changed, converted and sharded the same way."""
    if 'other' not in _cache:
        d = tempfile.mkdtemp(prefix='cmf-matrix-other-')
        m = os.path.join(d, 'm')
        shutil.copytree(AUSTEN, m)
        st = os.path.join(m, 'model.safetensors')
        b = bytearray(open(st, 'rb').read())
        b[-5] ^= 0x40  # a byte of the last tensor's data
        open(st, 'wb').write(b)
        r = run(['convert', '--model', m, '-o', os.path.join(d, 'austen.cmf'), '-q', 'q8', '--no-progress',
                 '--shard-max-gb', str(SHARD_GB)])
        assert r.code == 0, r.err
        shutil.rmtree(m)
        _cache['other'] = d
    return _cache['other']


@row('shards', 'a shard from another conversion (one weight differs)', 'verify austen-00001-of-00003.cmf', 1, "cmfhost verify: DIR/austen-00001-of-00003.cmf: Parse: shard 'DIR/austen-00003-of-00003.cmf' belongs to another model: its header's provenance differs from shard 1's",
     'nothing written')
def _(d):
    names = sharded(d, converted('q8', SHARD_GB))
    other = other_conversion()
    last = names[-1]
    assert sha(os.path.join(other, last)) != sha(os.path.join(d, last))
    shutil.copy(os.path.join(other, last), os.path.join(d, last))
    return run(['verify', os.path.join(d, names[0])])


def tiny_copy(d, name):
    dst = os.path.join(d, name)
    shutil.copytree(os.path.join(TINY, name), dst)
    return dst


@row('shards', 'a checkpoint shard listed in model.safetensors.index.json missing',
     'convert --model qwen3_moe -o out.cmf', 1, 'cmfhost convert: convert DIR/qwen3_moe: FileNotFound: DIR/qwen3_moe/model-00002-of-00002.safetensors: cannot open: No such file or directory', 'no output file')
def _(d):
    m = tiny_copy(d, 'qwen3_moe')
    os.remove(os.path.join(m, 'model-00002-of-00002.safetensors'))
    r = run(['convert', '--model', m, '-o', os.path.join(d, 'out.cmf'), '--no-progress'])
    assert not [f for f in os.listdir(d) if f != 'qwen3_moe'], os.listdir(d)
    return r


@row('shards', 'the index lists a tensor its shard does not hold', 'convert --model qwen3_moe -o out.cmf', 1, 'cmfhost convert: convert DIR/qwen3_moe: MissingTensor: DIR/qwen3_moe/model.safetensors.index.json: tensor "model.layers.0.mlp.ghost.weight" is listed in weight_map but absent from model-00001-of-00002.safetensors',
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


@row('tokenizer.json', 'model type WordPiece', 'tokenize --tokenizer tokenizer.json hello', 1, "cmfhost tokenize: DIR/tokenizer.json: Unsupported: tokenizer.json: unsupported model type 'WordPiece' (only BPE is implemented)", 'nothing written')
def _(d):
    return run(['tokenize', '--tokenizer', tokenizer_with(d, lambda t: t['model'].update(type='WordPiece')), 'hello'])


@row('tokenizer.json', 'model type Unigram', 'tokenize --tokenizer tokenizer.json hello', 1, "cmfhost tokenize: DIR/tokenizer.json: Unsupported: tokenizer.json: unsupported model type 'Unigram' (only BPE is implemented)", 'nothing written')
def _(d):
    return run(['tokenize', '--tokenizer', tokenizer_with(d, lambda t: t['model'].update(type='Unigram')), 'hello'])


@row('tokenizer.json', 'an unknown pre-tokenizer type', 'tokenize --tokenizer tokenizer.json hello', 1, "cmfhost tokenize: DIR/tokenizer.json: Unsupported: tokenizer.json: unsupported pre_tokenizer type 'Sentencizer' (pre_tokenizer)",
     'nothing written')
def _(d):
    return run(['tokenize', '--tokenizer', tokenizer_with(d, lambda t: t.update(pre_tokenizer={'type': 'Sentencizer'})),
                'hello'])


@row('tokenizer.json', 'a vocabulary id of 2^31 - 1', 'tokenize --tokenizer tokenizer.json hello', 1, "cmfhost tokenize: DIR/tokenizer.json: Parse: tokenizer.json: model.vocab: id 2147483647 of 'zzz' is above 16777215, the largest this tokenizer takes",
     'nothing written')
def _(d):
    return run(['tokenize', '--tokenizer', tokenizer_with(d, lambda t: t['model']['vocab'].update(zzz=2 ** 31 - 1)),
                'hello'])


@row('tokenizer.json', 'not JSON', 'tokenize --tokenizer tokenizer.json hello', 1, 'cmfhost tokenize: DIR/tokenizer.json: Parse: tokenizer.json: not valid JSON: The JSON document has an improper structure: missing or superfluous commas, braces, missing keys, etc.', 'nothing written')
def _(d):
    p = os.path.join(d, 'tokenizer.json')
    open(p, 'w').write('{"model": {"type": "BPE", "vocab": {')
    return run(['tokenize', '--tokenizer', p, 'hello'])


@row('tokenizer.json', 'model type WordPiece in a checkpoint being converted', 'convert --model m -o out.cmf', 1, "cmfhost convert: convert DIR/m: Unsupported: DIR/m/tokenizer.json: unsupported model type 'WordPiece' (only BPE is implemented)",
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


@row('chat template', 'a loop that would scan a 1 MB string 10^6 times', 'render --tokenizer-config tc.json ...', 1,
     'cmfhost render: Template: chat template line 1: the template did more than 10000000 steps of work (an endless or runaway loop?)', 'nothing written')
def _(d):
    # Any runaway loop ends at the same limit; this one reaches it in a
    # fraction of a second (each scan costs 15 625 steps), so the suite stays fast.
    return render(d, "{% set s = 'x' * 1000000 %}{% for i in range(1000000) %}{{ s.count('y') }}{% endfor %}")


@row('chat template', 'a macro that calls itself forever', 'render --tokenizer-config tc.json ...', 1, 'cmfhost render: Template: chat template line 1: statements, expressions and macro calls nested deeper than 500 levels (runaway recursion?)',
     'nothing written')
def _(d):
    return render(d, '{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}')


@row('chat template', 'brackets nested 10 000 deep', 'render --tokenizer-config tc.json ...', 1, 'cmfhost render: Template: chat template line 1: template nested too deeply',
     'nothing written')
def _(d):
    return render(d, '{{ ' + '(' * 10000 + '1' + ')' * 10000 + ' }}')


@row('chat template', 'a namespace that contains itself, printed', 'render --tokenizer-config tc.json ...', 1, 'cmfhost render: Template: chat template line 1: a value nested deeper than 500 levels (does a namespace contain itself?)',
     'nothing written')
def _(d):
    return render(d, '{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns.a | tojson }}')


@row('chat template', 'a string of 10^12 bytes', 'render --tokenizer-config tc.json ...', 1, 'cmfhost render: Template: chat template line 1: a string of 1000000000000 bytes, over the limit of 67108864', 'nothing written')
def _(d):
    return render(d, "{{ 'x' * 1000000000000 }}")


@row('chat template', 'a string doubled 40 times', 'render --tokenizer-config tc.json ...', 1, 'cmfhost render: Template: chat template line 1: a string of 134217728 bytes, over the limit of 67108864', 'nothing written')
def _(d):
    return render(d, '{% set ns = namespace(s="ab") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}'
                     '{% endfor %}{{ ns.s | length }}')


@row('chat template', 'an integer overflow', 'render --tokenizer-config tc.json ...', 1, "cmfhost render: Template: chat template line 1: integer overflow in 9223372036854775807 + 1 (Python's integers are unbounded, ours 64-bit)", 'nothing written')
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


@row('checkpoint', 'config.json says hidden_size 384, the tensors have 192', 'convert --model m -o out.cmf', 1, 'cmfhost convert: convert DIR/m: Bounds: DIR/m/model.safetensors: tensor "model.embed_tokens.weight" has shape [4096, 192] but the config implies [vocab_size 4096 (or fewer rows), hidden_size 384]',
     'no output file')
def _(d):
    return lying(d, hidden_size=384)


@row('checkpoint', 'config.json says 6 layers, the tensors have 4', 'convert --model m -o out.cmf', 1, 'cmfhost convert: convert DIR/m: MissingTensor: DIR/m/config.json: the config announces 6 layers but the checkpoint has no tensor of layer 4 (model.layers.4.*)',
     'no output file')
def _(d):
    return lying(d, num_hidden_layers=6)


@row('checkpoint', 'config.json says vocab_size 8192, the embedding has 4096 rows', 'convert --model m -o out.cmf', 0,
     '', 'a model that runs: fewer embedding rows than vocab_size is allowed (logits of the missing ids are 0)')
def _(d):
    m = os.path.join(d, 'm')
    shutil.copytree(AUSTEN, m)
    cfg = json.load(open(os.path.join(m, 'config.json')))
    cfg['vocab_size'] = 8192
    json.dump(cfg, open(os.path.join(m, 'config.json'), 'w'))
    out = os.path.join(d, 'out.cmf')
    r = run(['convert', '--model', m, '-o', out, '--no-progress'])
    g = run(['run', out, '--raw', '--greedy', '-p', 'It is', '-n', '4'])
    assert g.code == 0, g.err
    return r


@row('checkpoint', 'config.json says 8 attention heads of 48, q_proj has 4', 'convert --model m -o out.cmf', 1, 'cmfhost convert: convert DIR/m: Bounds: DIR/m/model.safetensors: tensor "model.layers.0.self_attn.o_proj.weight" has shape [192, 192] but the config implies [192, 384]',
     'no output file')
def _(d):
    return lying(d, num_attention_heads=8)


# ---- a full disk, a read-only directory ------------------------------------------
# A full disk is a file-size limit here (RLIMIT_FSIZE, which needs no
# privileges): a write past it fails with EFBIG where a full disk gives
# ENOSPC, through the same error path. cmfhost ignores SIGXFSZ for this.

FSIZE = 1 << 20


def nothing_new(d, before):
    after = listing(d)
    assert after == before, 'left behind: %r' % sorted(set(after) - set(before))


@row('full disk', 'convert past a 1 MiB file-size limit', 'convert --model austen-tiny -o out.cmf', 1, "cmfhost convert: convert SRC/models/austen-tiny: Io: cannot write 'DIR/out.cmf': File too large",
     'no output file, no temp file')
def _(d):
    r = run(['convert', '--model', AUSTEN, '-o', os.path.join(d, 'out.cmf'), '--no-progress'], limit_fsize=FSIZE)
    nothing_new(d, [])
    return r


@row('full disk', 'requant past a 1 MiB file-size limit', 'requant austen.cmf -q q4 -o out.cmf', 1, "cmfhost requant: requant DIR/austen.cmf: Io: cannot write 'DIR/out.cmf': File too large",
     'no output file, no temp file')
def _(d):
    m = copy_model(d)
    before = listing(d)
    r = run(['requant', m, '-q', 'q4', '-o', os.path.join(d, 'out.cmf'), '--no-progress'], limit_fsize=FSIZE)
    nothing_new(d, before)
    return r


@row('full disk', 'compact past a 1 MiB file-size limit', 'compact austen.cmf -o out.cmf', 1, "cmfhost compact: DIR/austen.cmf: Io: cannot write 'DIR/out.cmf': File too large",
     'no output file, no temp file')
def _(d):
    m = copy_model(d)
    before = listing(d)
    r = run(['compact', m, '-o', os.path.join(d, 'out.cmf')], limit_fsize=FSIZE)
    nothing_new(d, before)
    return r


def readonly_dir(d):
    """d/ro, read-only for whoever runs cmfhost: root ignores directory
    permissions, so as root the command runs as nobody (uid/gid 65534)."""
    ro = os.path.join(d, 'ro')
    os.mkdir(ro)
    os.chmod(d, 0o755)
    return ro


def as_user():
    return 65534 if os.geteuid() == 0 else None  # nobody / nogroup


def run_ro(d, ro, args):
    os.chmod(ro, 0o555)
    try:
        return run(args, as_user=as_user())
    finally:
        os.chmod(ro, 0o755)


@row('read-only directory', 'convert into it', 'convert --model austen-tiny -o ro/out.cmf', 1, "cmfhost convert: convert SRC/models/austen-tiny: Io: cannot create a temp file next to 'DIR/ro/out.cmf': Permission denied", 'nothing created')
def _(d):
    ro = readonly_dir(d)
    r = run_ro(d, ro, ['convert', '--model', source_model(as_user()), '-o', os.path.join(ro, 'out.cmf'), '--no-progress'])
    assert listing(ro) == []
    return r


@row('read-only directory', 'requant into it', 'requant austen.cmf -q q4 -o ro/out.cmf', 1, "cmfhost requant: requant DIR/austen.cmf: Io: cannot create a temp file next to 'DIR/ro/out.cmf': Permission denied", 'nothing created')
def _(d):
    ro = readonly_dir(d)
    m = copy_model(d)
    r = run_ro(d, ro, ['requant', m, '-q', 'q4', '-o', os.path.join(ro, 'out.cmf'), '--no-progress'])
    assert listing(ro) == []
    return r


@row('read-only directory', 'compact into it', 'compact austen.cmf -o ro/out.cmf', 1, "cmfhost compact: DIR/austen.cmf: Io: cannot create a temp file next to 'DIR/ro/out.cmf': Permission denied", 'nothing created')
def _(d):
    ro = readonly_dir(d)
    m = copy_model(d)
    r = run_ro(d, ro, ['compact', m, '-o', os.path.join(ro, 'out.cmf')])
    assert listing(ro) == []
    return r


@row('read-only directory', 'sign a model that lies in it', 'sign ro/austen.cmf --key key', 1, "cmfhost sign: DIR/ro/austen.cmf: Io: cannot create a temp file next to 'DIR/ro/austen.cmf.sig': Permission denied",
     'nothing created')
def _(d):
    ro = readonly_dir(d)
    m = copy_model(ro)
    key = os.path.join(d, 'key')
    assert run(['keygen', key]).code == 0
    os.chmod(key, 0o644)  # readable by the unprivileged user of this row
    r = run_ro(d, ro, ['sign', m, '--key', key])
    assert listing(ro) == ['austen.cmf']
    return r


@row('read-only directory', 'keygen into it', 'keygen ro/key', 1, "cmfhost keygen: DIR/ro/key: Io: cannot create a temp file next to 'DIR/ro/key': Permission denied", 'nothing created')
def _(d):
    ro = readonly_dir(d)
    r = run_ro(d, ro, ['keygen', os.path.join(ro, 'key')])
    assert listing(ro) == []
    return r


# ---- SIGKILL during every writer -----------------------------------------------------

def temp_fd_size(pid, d):
    """Size of the unnamed temp file (O_TMPFILE) the process writes in d, or None."""
    try:
        for fd in os.listdir('/proc/%d/fd' % pid):
            link = os.readlink('/proc/%d/fd/%s' % (pid, fd))
            if link.startswith(d + '/') and link.endswith('(deleted)'):
                return os.stat('/proc/%d/fd/%s' % (pid, fd)).st_size
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


def kill_when(args, d, min_bytes):
    """Starts cmfhost, SIGKILLs it once its temp file in d holds at least
    min_bytes; returns the bytes it had written then (None if it finished first)."""
    e = dict(os.environ, CMF_PLUGIN_PATH=':'.join(PLUGIN_DIRS))
    p = subprocess.Popen([CMFHOST] + args, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = None
    while p.poll() is None:
        size = temp_fd_size(p.pid, d)
        if size is not None and size >= min_bytes:
            seen = size
            p.send_signal(signal.SIGKILL)
            break
        time.sleep(0.0005)
    p.wait()
    return seen


def killed_writer(d, args, out, old=None):
    """Kills the writer early in its file and past half of it; each time
    `out` must be the old file (or absent), and nothing else may appear."""
    before = listing(d)
    old_sha = sha(out)
    hits = []
    for min_bytes in (1, 3 << 20):
        hits.append(kill_when(args, d, min_bytes))
        assert sha(out) == old_sha, 'killed after %s bytes: %s changed' % (hits[-1], out)
        nothing_new(d, before)
    assert all(h is not None for h in hits), 'the writer finished before the kill: %r' % hits
    return Ran(-9, '')


@row('SIGKILL', 'convert, killed after 1 byte and after 3 MiB of its output', 'convert --model austen-tiny -q f32 -o out.cmf',
     -9, '', 'no output file, no temp file')
def _(d):
    return killed_writer(d, ['convert', '--model', AUSTEN, '-q', 'f32', '-o', os.path.join(d, 'out.cmf'), '--no-progress'],
                         os.path.join(d, 'out.cmf'))


@row('SIGKILL', 'requant over an existing output, killed twice the same way', 'requant austen.cmf -q f32 -o out.cmf',
     -9, '', 'the old out.cmf, unchanged')
def _(d):
    m = copy_model(d)
    out = os.path.join(d, 'out.cmf')
    shutil.copy(m, out)
    return killed_writer(d, ['requant', m, '-q', 'f32', '-o', out, '--no-progress'], out)


@row('SIGKILL', 'compact over an existing output, killed twice the same way', 'compact austen.cmf -o out.cmf',
     -9, '', 'the old out.cmf, unchanged')
def _(d):
    m = copy_model(d, 'f32')
    out = os.path.join(d, 'out.cmf')
    open(out, 'wb').write(b'an older file')
    return killed_writer(d, ['compact', m, '-o', out], out)


@row('SIGKILL', 'sign over an existing signature, killed at 40 moments', 'sign austen.cmf --key key2', -9, '',
     'the old .sig or the complete new one; a kill between naming the finished temp file and renaming it over '
     'the old one leaves that complete file as a hidden .austen.cmf.sig.tmp.* beside it')
def _(d):
    m = copy_model(d, 'f32')
    k1, k2 = os.path.join(d, 'key1'), os.path.join(d, 'key2')
    assert run(['keygen', k1]).code == 0 and run(['keygen', k2]).code == 0
    assert run(['sign', m, '--key', k1]).code == 0
    old = open(m + '.sig', 'rb').read()
    before = listing(d)
    e = dict(os.environ, CMF_PLUGIN_PATH=':'.join(PLUGIN_DIRS))
    t0 = time.monotonic()
    full = subprocess.run([CMFHOST, 'sign', m, '--key', k2], env=e, capture_output=True).returncode
    took = time.monotonic() - t0
    assert full == 0
    new = open(m + '.sig', 'rb').read()
    open(m + '.sig', 'wb').write(old)
    for i in range(40):
        p = subprocess.Popen([CMFHOST, 'sign', m, '--key', k2], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(took * i / 40)
        p.send_signal(signal.SIGKILL)
        p.wait()
        now = open(m + '.sig', 'rb').read()
        assert now in (old, new), 'a torn signature after a kill at %.3f s' % (took * i / 40)
        open(m + '.sig', 'wb').write(old)
        # The replace is link (name the finished anonymous file), then
        # rename: a kill between the two can leave the named file, but only
        # complete.
        for extra in set(listing(d)) - set(before):
            assert extra.startswith('.austen.cmf.sig.tmp.'), 'left behind: %r' % extra
            assert open(os.path.join(d, extra), 'rb').read() == new, 'a partial temp file left behind: %r' % extra
            os.unlink(os.path.join(d, extra))
        nothing_new(d, before)
    return Ran(-9, '')


@row('SIGKILL', 'append (C API cmf_writer_open_append; no command appends), killed at each write point',
     'container_tests -tc="*append-only growth*"', 0, '', 'the old model, still valid (its envelope is written last)')
def _(d):
    exe = os.path.join(BUILD, 'tests', 'container', 'container_tests')
    p = subprocess.run([exe, '--test-case=*append-only growth is valid at every crash point*', '--no-version'],
                       env=dict(os.environ, CMF_PLUGIN_PATH=':'.join(PLUGIN_DIRS)), capture_output=True, text=True)
    assert p.returncode == 0 and re.search(r'test cases: +1 \| +1 passed', p.stdout), p.stdout + p.stderr
    return Ran(p.returncode, '')


# ---- plugins ------------------------------------------------------------------------

def plugins_with(path, extra_env=None):
    """`cmfhost plugins` with one plugin file: what it says of that file
    (its table line, or its line under 'refused plugins:') plus stderr."""
    r = run(['plugins'], env=dict({'CMF_PLUGIN_PATH': path}, **(extra_env or {})))
    said = [ln.strip() for ln in r.out.splitlines() if path in ln]
    return Ran(r.code, '\n'.join(said + ([r.err.strip()] if r.err.strip() else [])))


@row('plugin', 'SIGSEGV inside its init', 'plugins (CMF_PLUGIN_PATH=cmf-test-crashes-in-init.so)', -11, 'cmfhost: plugin BUILD/tests/plugins/cmf-test-crashes-in-init.so crashed (SIGSEGV) while loading; remove it from the plugin path (CMF_PLUGIN_PATH, --plugin-path or the installed plugin directory) and run again',
     'nothing (the process dies: no library survives a crash in a plugin it runs; exit 139 in a shell)')
def _(d):
    # Under AddressSanitizer, its own SEGV report would replace cmfhost's.
    return plugins_with(os.path.join(BAD_PLUGINS, 'plugins', 'cmf-test-crashes-in-init.so'),
                        {'ASAN_OPTIONS': os.environ.get('ASAN_OPTIONS', '') + ':handle_segv=0'})


# Plugins whose init hands the host a broken vtable (tests/plugins/bad_plugins.c):
# each is refused, named, and the others keep working; `cmfhost plugins` lists it.
BROKEN_PLUGINS = [
    ('vtable struct_size 8', 'vt-too-small',
     "init failed: codec 'test-dtype': vtable struct_size 8 is smaller than the v1 minimum 64",
     'nothing; the plugin is listed as refused, the others work'),
    ('vtable struct_size 2^31 - 1', 'vt-huge', None, 'nothing; loaded: the host reads only the members it knows'),
    ('a NULL required member (dequantize_rows)', 'null-required',
     "init failed: codec 'test-dtype': expected_size and dequantize_rows are required", 'nothing; refused'),
    ('a backend with NULL operations', 'backend-null-ops',
     "init failed: backend 'hollow': required operations are NULL: weight_bind, weight_free, matmul, buffer_alloc, "
     'buffer_free, buffer_write, buffer_read, copy, rms_norm, rope, attention, gated_act, add, add_bias, embed',
     'nothing; refused'),
    ('a name that is not UTF-8', 'bad-name',
     'init failed: codec name has byte 0xff at 3 (must be UTF-8 without control characters)', 'nothing; refused'),
    ('a 300-byte name', 'long-name', 'init failed: codec name is 300 bytes long (at most 256)', 'nothing; refused'),
    ('a NULL vtable', 'null-vtable', 'init failed: register_codec: NULL argument', 'nothing; refused'),
    ('init asks cmf_plugin_in_progress() who is loading', 'reports-in-progress',
     'init failed: BUILD/tests/cmf-test-reports-in-progress.so', 'nothing; refused with its own path'),
]
for case, kind, refusal, left in BROKEN_PLUGINS:
    file = 'cmf-test-%s.so' % kind
    said = ('BUILD/tests/%s: %s' % (file, refusal) if refusal else
            'codec    test-dtype   dtype 200                          1    BUILD/tests/%s' % file)
    row('plugin', case, 'plugins (CMF_PLUGIN_PATH=%s)' % file, 0, said, left)(
        lambda d, file=file: plugins_with(os.path.join(BAD_PLUGINS, file)))


def main():
    if MODE == '--markdown':
        print(markdown())
        return 0
    failures = 0
    atexit.register(lambda: [shutil.rmtree(t[2], ignore_errors=True) for t in STAGE.values() if t[2]])
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
        err = got.err.replace(d, 'DIR').replace(BUILD, 'BUILD').replace(SRC, 'SRC')
        for staged in STAGE.values():
            if staged[2]:
                err = err.replace(staged[2], 'SRC')
        err = err.strip()
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
    lines = ['| input or event | command | what the user sees | exit | left behind |',
             '|---|---|---|---|---|']
    for r in ROWS:
        err = r['err'] or ''
        seen = '`' + err.replace('|', '\\|').replace('\n', '`<br>`') + '`' if err else '(nothing)'
        code = r['code']
        if code < 0:
            name = {9: 'SIGKILL', 11: 'SIGSEGV'}.get(-code, 'signal %d' % -code)
            code = 'killed by %s (%d in a shell)' % (name, 128 - code)
        lines.append('| %s: %s | `cmfhost %s` | %s | %s | %s |' % (
            r['area'], r['case'], r['command'], seen, code, r['left']))
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
