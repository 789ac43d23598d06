#!/usr/bin/python3
"""Write tiny Hugging Face checkpoint directories for the test suite.

Usage: gen_tiny_models.py OUT_DIR [--stamp FILE] [--only NAME ...]

Each OUT_DIR/<name>/ holds config.json, model.safetensors (or shards plus
model.safetensors.index.json), tokenizer.json, tokenizer_config.json and,
for some, generation_config.json / chat_template.jinja. Configs (MODELS
below) are one or more tiny models per supported family, each exercising
its features (biases, q/k-norm, MoE, hybrids, Gemma extras), with additions
(MTP heads, wrappers, fused banks). Weights are seeded (random.Random(seed)): the same bytes every run.

Pure standard library on purpose: safetensors is written by hand (8-byte
length, JSON header, raw little-endian data), so the fixtures need neither
torch nor numpy. The tokenizer is a small byte-level BPE built here
(printable ASCII, Ġ/Ċ, a few merges, <|endoftext|> 126,
<pad> 127).

Side files for tests (not part of a HF checkpoint): expected_rows.json in
the qwen3_next fixture maps each split GDN projection row to its source row
of the fused tensor, computed here independently of the C++ plan.
"""
import json
import math
import os
import random
import struct
import sys

# ---------------------------------------------------------------- safetensors


def f32_bits(x):
    return struct.unpack('<I', struct.pack('<f', x))[0]


def encode(values, dtype):
    if dtype == 'F32':
        return struct.pack('<%df' % len(values), *values)
    if dtype == 'F16':
        return struct.pack('<%de' % len(values), *values)
    if dtype == 'BF16':
        out = bytearray()
        for v in values:
            b = f32_bits(v)
            b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16  # round to nearest even
            out += struct.pack('<H', b & 0xFFFF)
        return bytes(out)
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype, metadata=None):
    """tensors: list of (name, shape, values)."""
    header = {}
    blobs = []
    off = 0
    for name, shape, values in tensors:
        data = encode(values, dtype)
        header[name] = {'dtype': dtype, 'shape': list(shape), 'data_offsets': [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata is not None:
        header['__metadata__'] = metadata
    text = json.dumps(header, separators=(',', ':')).encode()
    text += b' ' * ((8 - len(text) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- tokenizer

def tokenizer_files(out):
    chars = [chr(c) for c in range(33, 127)]  # printable ASCII without space: 94
    vocab = {c: i for i, c in enumerate(chars)}
    vocab['Ġ'] = len(vocab)
    vocab['Ċ'] = len(vocab)
    merges = []
    for a, b in [('Ġ', 't'), ('h', 'e'), ('Ġt', 'he'), ('i', 'n'), ('Ġ', 'a'), ('e', 'r'), ('o', 'n'), ('Ġ', 's'),
                 ('r', 'e'), ('a', 't'), ('e', 'n'), ('o', 'r'), ('Ġ', 'w'), ('Ġ', 'o'), ('i', 's'), ('Ġ', 'c'),
                 ('e', 's'), ('in', 'g'), ('Ġ', 'b'), ('e', 'd'), ('Ġ', 'f'), ('a', 'n'), ('Ġ', 'i'), ('o', 'u'),
                 ('Ġ', 'h'), ('Ġ', 'm'), ('l', 'l'), ('Ġ', 'p'), ('Ġ', 'd'), ('a', 'r')]:
        if len(vocab) >= 126:
            break
        merges.append(a + ' ' + b)
        vocab[a + b] = len(vocab)
    while len(vocab) < 126:
        vocab['<unused%d>' % len(vocab)] = len(vocab)
    vocab['<|endoftext|>'] = 126
    vocab['<pad>'] = 127
    added = [{'id': i, 'content': t, 'single_word': False, 'lstrip': False, 'rstrip': False,
              'normalized': False, 'special': True} for t, i in (('<|endoftext|>', 126), ('<pad>', 127))]
    tok = {
        'version': '1.0', 'truncation': None, 'padding': None, 'added_tokens': added,
        'normalizer': None,
        'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True, 'use_regex': True},
        'post_processor': None,
        'decoder': {'type': 'ByteLevel', 'add_prefix_space': True, 'trim_offsets': True, 'use_regex': True},
        'model': {'type': 'BPE', 'dropout': None, 'unk_token': None, 'continuing_subword_prefix': None,
                  'end_of_word_suffix': None, 'fuse_unk': False, 'byte_fallback': False,
                  'vocab': vocab, 'merges': merges},
    }
    with open(os.path.join(out, 'tokenizer.json'), 'w') as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    cfg = {'tokenizer_class': 'PreTrainedTokenizerFast', 'eos_token': '<|endoftext|>', 'pad_token': '<pad>',
           'model_max_length': 256, 'chat_template': template,
           'added_tokens_decoder': {str(t['id']): {k: v for k, v in t.items() if k != 'id'} for t in added}}
    with open(os.path.join(out, 'tokenizer_config.json'), 'w') as f:
        json.dump(cfg, f, indent=1)


# ---------------------------------------------------------------- weights


class Weights:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.tensors = []

    def mat(self, name, *shape, std=0.05):
        n = 1
        for d in shape:
            n *= d
        self.tensors.append((name, shape, [self.rng.gauss(0.0, std) for _ in range(n)]))

    def norm(self, name, n):
        self.tensors.append((name, (n,), [1.0 + self.rng.gauss(0.0, 0.3) for _ in range(n)]))

    def vec(self, name, n, std=0.1):
        self.tensors.append((name, (n,), [self.rng.gauss(0.0, std) for _ in range(n)]))

    def put(self, name, shape, values):
        self.tensors.append((name, shape, values))


def attention(w, p, c, hd, bias=False, qk_norm=False, gated=False):
    H, nh, nkv = c['hidden_size'], c['num_attention_heads'], c['num_key_value_heads']
    w.mat(p + 'self_attn.q_proj.weight', (2 if gated else 1) * nh * hd, H)
    w.mat(p + 'self_attn.k_proj.weight', nkv * hd, H)
    w.mat(p + 'self_attn.v_proj.weight', nkv * hd, H)
    w.mat(p + 'self_attn.o_proj.weight', H, nh * hd)
    if bias:
        w.vec(p + 'self_attn.q_proj.bias', nh * hd)
        w.vec(p + 'self_attn.k_proj.bias', nkv * hd)
        w.vec(p + 'self_attn.v_proj.bias', nkv * hd)
    if qk_norm:
        w.norm(p + 'self_attn.q_norm.weight', hd)
        w.norm(p + 'self_attn.k_norm.weight', hd)


def dense_mlp(w, p, H, inter):
    w.mat(p + 'mlp.gate_proj.weight', inter, H)
    w.mat(p + 'mlp.up_proj.weight', inter, H)
    w.mat(p + 'mlp.down_proj.weight', H, inter)


def moe_mlp(w, p, c, shared=False, fused=None):
    H, E, I = c['hidden_size'], c['num_experts'], c['moe_intermediate_size']
    w.mat(p + 'mlp.gate.weight', E, H)
    if fused == 'banks':
        w.mat(p + 'mlp.experts.gate_up_proj', E, 2 * I, H)
        w.mat(p + 'mlp.experts.down_proj', E, H, I)
    elif fused == 'banks_t':
        w.mat(p + 'mlp.experts.gate_up_proj', E, H, 2 * I)
        w.mat(p + 'mlp.experts.down_proj', E, I, H)
    else:
        for e in range(E):
            w.mat(p + 'mlp.experts.%d.gate_proj.weight' % e, I, H)
            w.mat(p + 'mlp.experts.%d.up_proj.weight' % e, I, H)
            w.mat(p + 'mlp.experts.%d.down_proj.weight' % e, H, I)
    if shared:
        S = c['shared_expert_intermediate_size']
        w.mat(p + 'mlp.shared_expert.gate_proj.weight', S, H)
        w.mat(p + 'mlp.shared_expert.up_proj.weight', S, H)
        w.mat(p + 'mlp.shared_expert.down_proj.weight', H, S)
        w.mat(p + 'mlp.shared_expert_gate.weight', 1, H)


def gdn(w, p, c, fused=False):
    H = c['hidden_size']
    nk, nv = c['linear_num_key_heads'], c['linear_num_value_heads']
    dk, dv, K = c['linear_key_head_dim'], c['linear_value_head_dim'], c['linear_conv_kernel_dim']
    conv = 2 * nk * dk + nv * dv
    if fused:
        w.mat(p + 'linear_attn.in_proj_qkvz.weight', nk * (2 * dk + 2 * (nv // nk) * dv), H)
        w.mat(p + 'linear_attn.in_proj_ba.weight', 2 * nv, H)
    else:
        w.mat(p + 'linear_attn.in_proj_qkv.weight', conv, H)
        w.mat(p + 'linear_attn.in_proj_z.weight', nv * dv, H)
        w.mat(p + 'linear_attn.in_proj_b.weight', nv, H)
        w.mat(p + 'linear_attn.in_proj_a.weight', nv, H)
    w.mat(p + 'linear_attn.conv1d.weight', conv, 1, K, std=0.2)
    w.vec(p + 'linear_attn.A_log', nv, std=0.5)
    w.vec(p + 'linear_attn.dt_bias', nv, std=0.5)
    w.norm(p + 'linear_attn.norm.weight', dv)
    w.mat(p + 'linear_attn.out_proj.weight', H, nv * dv)


def fused_gdn_rows(c):
    """Source row of each output row, as HF's modeling_qwen3_next.py
    fix_query_key_value_ordering reads the fused layout (independent of the
    C++ plan)."""
    nk, nv = c['linear_num_key_heads'], c['linear_num_value_heads']
    dk, dv = c['linear_key_head_dim'], c['linear_value_head_dim']
    rep = nv // nk
    gw = 2 * dk + 2 * rep * dv
    q = [g * gw + i for g in range(nk) for i in range(dk)]
    k = [g * gw + dk + i for g in range(nk) for i in range(dk)]
    v = [g * gw + 2 * dk + i for g in range(nk) for i in range(rep * dv)]
    z = [g * gw + 2 * dk + rep * dv + i for g in range(nk) for i in range(rep * dv)]
    b = [g * 2 * rep + i for g in range(nk) for i in range(rep)]
    a = [g * 2 * rep + rep + i for g in range(nk) for i in range(rep)]
    return {'in_proj_qkv': q + k + v, 'in_proj_z': z, 'in_proj_b': b, 'in_proj_a': a}


# ---------------------------------------------------------------- models

BASE = {'vocab_size': 128, 'hidden_act': 'silu', 'max_position_embeddings': 256, 'rms_norm_eps': 1e-6,
        'rope_theta': 10000.0}


def cfg(**kw):
    c = dict(BASE)
    c.update(kw)
    return c


def decoder(w, c, prefix='model.', hd=None, bias=False, qk_norm=False, sandwich=False, layer_mlp=None, layer_mix=None):
    H = c['hidden_size']
    hd = hd or c.get('head_dim') or H // c['num_attention_heads']
    w.mat(prefix + 'embed_tokens.weight', c['vocab_size'], H, std=0.1)
    for i in range(c['num_hidden_layers']):
        p = '%slayers.%d.' % (prefix, i)
        w.norm(p + 'input_layernorm.weight', H)
        w.norm(p + 'post_attention_layernorm.weight', H)
        if sandwich:
            w.norm(p + 'pre_feedforward_layernorm.weight', H)
            w.norm(p + 'post_feedforward_layernorm.weight', H)
        (layer_mix or (lambda w, p, i: attention(w, p, c, hd, bias, qk_norm)))(w, p, i)
        (layer_mlp or (lambda w, p, i: dense_mlp(w, p, H, c['intermediate_size'])))(w, p, i)
    w.norm(prefix + 'norm.weight', H)


def mtp_head(w, c, hd):
    H = c['hidden_size']
    w.mat('mtp.fc.weight', H, 2 * H)
    w.norm('mtp.pre_fc_norm_embedding.weight', H)
    w.norm('mtp.pre_fc_norm_hidden.weight', H)
    p = 'mtp.layers.0.'
    w.norm(p + 'input_layernorm.weight', H)
    w.norm(p + 'post_attention_layernorm.weight', H)
    attention(w, p, c, hd, qk_norm=True, gated=True)
    dense_mlp(w, p, H, c['intermediate_size'])
    w.norm('mtp.norm.weight', H)


def model_qwen2(w):
    c = cfg(model_type='qwen2', architectures=['Qwen2ForCausalLM'], hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
            use_sliding_window=False, attention_dropout=0.0, bos_token_id=126, eos_token_id=126)
    decoder(w, c, bias=True)
    return c, 'F16', {'generation_config': {'eos_token_id': [126, 127], 'bos_token_id': 126}}


def model_qwen3(w, tied):
    c = cfg(model_type='qwen3', architectures=['Qwen3ForCausalLM'], hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=False,
            rope_theta=1000000.0, tie_word_embeddings=tied, use_sliding_window=False, eos_token_id=126)
    decoder(w, c, qk_norm=True)
    if not tied:
        w.mat('lm_head.weight', 128, 64, std=0.1)
    return c, 'F32', {'chat_template_jinja': '{{ messages[0].content }}'} if tied else {}


def model_qwen3_moe(w):
    c = cfg(model_type='qwen3_moe', architectures=['Qwen3MoeForCausalLM'], hidden_size=64, intermediate_size=96,
            moe_intermediate_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[2], norm_topk_prob=True,
            attention_bias=False, tie_word_embeddings=False)

    def mlp(w, p, i):
        if i == 2:
            dense_mlp(w, p, 64, 96)
        else:  # layer 3 in the fused-bank layout, layer 1 transposed banks
            moe_mlp(w, p, c, fused={3: 'banks', 1: 'banks_t'}.get(i))
    decoder(w, c, qk_norm=True, layer_mlp=mlp)
    w.mat('lm_head.weight', 128, 64, std=0.1)
    return c, 'F32', {'shards': 2}


def model_qwen2_moe(w):
    c = cfg(model_type='qwen2_moe', architectures=['Qwen2MoeForCausalLM'], hidden_size=64, intermediate_size=96,
            moe_intermediate_size=48, shared_expert_intermediate_size=80, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
            decoder_sparse_step=2, mlp_only_layers=[], norm_topk_prob=False, qkv_bias=True,
            tie_word_embeddings=False)

    def mlp(w, p, i):
        if (i + 1) % 2 == 0:
            moe_mlp(w, p, c, shared=True)
        else:
            dense_mlp(w, p, 64, 96)
    decoder(w, c, bias=True, layer_mlp=mlp)
    w.mat('lm_head.weight', 128, 64, std=0.1)
    return c, 'BF16', {}


def model_qwen3_next(w):
    c = cfg(model_type='qwen3_next', architectures=['Qwen3NextForCausalLM'], hidden_size=64, intermediate_size=96,
            moe_intermediate_size=48, shared_expert_intermediate_size=80, num_hidden_layers=4,
            layer_types=['linear_attention', 'full_attention', 'linear_attention', 'full_attention'],
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25,
            linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
            mlp_only_layers=[], norm_topk_prob=True, attention_bias=False, tie_word_embeddings=False)

    def mix(w, p, i):
        if c['layer_types'][i] == 'linear_attention':
            gdn(w, p, c, fused=True)
        else:
            attention(w, p, c, 16, qk_norm=True, gated=True)
    decoder(w, c, layer_mix=mix, layer_mlp=lambda w, p, i: moe_mlp(w, p, c, shared=True))
    w.mat('lm_head.weight', 128, 64, std=0.1)
    return c, 'F32', {'expected_rows': fused_gdn_rows(c)}


def model_qwen3_5(w):
    tc = cfg(model_type='qwen3_5_text', hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             layer_types=['linear_attention', 'linear_attention', 'linear_attention', 'full_attention'],
             num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             rope_parameters={'rope_type': 'default', 'rope_theta': 10000000.0, 'partial_rotary_factor': 0.25,
                              'mrope_section': [2, 1, 1], 'mrope_interleaved': True},
             linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
             linear_conv_kernel_dim=4, attention_bias=False, mtp_num_hidden_layers=1, eos_token_id=126)
    del tc['rope_theta']
    c = {'model_type': 'qwen3_5', 'architectures': ['Qwen3_5ForConditionalGeneration'], 'text_config': tc,
         'tie_word_embeddings': False, 'vision_config': {'depth': 1}}

    def mix(w, p, i):
        if tc['layer_types'][i] == 'linear_attention':
            gdn(w, p, tc)
        else:
            attention(w, p, tc, 32, qk_norm=True, gated=True)
    decoder(w, tc, prefix='model.language_model.', layer_mix=mix)
    w.mat('lm_head.weight', 128, 64, std=0.1)
    mtp_head(w, tc, 32)
    w.mat('model.visual.blocks.0.attn.qkv.weight', 48, 16)
    return c, 'BF16', {}


GEMMA_IDS = {'bos_token_id': 2, 'eos_token_id': 1, 'pad_token_id': 0}


def model_gemma(w):
    c = cfg(model_type='gemma', architectures=['GemmaForCausalLM'], hidden_size=96, intermediate_size=192,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
            hidden_act='gelu_pytorch_tanh', hidden_activation='gelu_pytorch_tanh', attention_bias=False,
            tie_word_embeddings=True, **GEMMA_IDS)
    decoder(w, c)
    return c, 'F16', {}


def model_gemma2(w):
    c = cfg(model_type='gemma2', architectures=['Gemma2ForCausalLM'], hidden_size=64, intermediate_size=128,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=1.0, final_logit_softcapping=2.0,
            hidden_activation='gelu_pytorch_tanh', attention_bias=False, tie_word_embeddings=True, **GEMMA_IDS)
    del c['hidden_act']
    decoder(w, c, sandwich=True)
    return c, 'F32', {}


def model_gemma3(w):
    tc = cfg(model_type='gemma3_text', hidden_size=64, intermediate_size=128, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, sliding_window=4,
             sliding_window_pattern=3,
             layer_types=['sliding_attention', 'sliding_attention', 'full_attention',
                          'sliding_attention', 'sliding_attention', 'full_attention'],
             rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling={'rope_type': 'linear', 'factor': 8.0},
             final_logit_softcapping=None, attn_logit_softcapping=None, hidden_activation='gelu_pytorch_tanh',
             attention_bias=False, tie_word_embeddings=True, **GEMMA_IDS)
    del tc['hidden_act']
    c = {'model_type': 'gemma3', 'architectures': ['Gemma3ForConditionalGeneration'], 'text_config': tc,
         'vision_config': {'hidden_size': 16}, 'eos_token_id': [1, 106], **{k: v for k, v in GEMMA_IDS.items() if k != 'eos_token_id'}}
    decoder(w, tc, prefix='language_model.model.', qk_norm=True, sandwich=True)
    w.mat('vision_tower.vision_model.embeddings.patch_embedding.weight', 16, 3, 2, 2)
    w.mat('multi_modal_projector.mm_input_projection_weight', 16, 64)
    return c, 'BF16', {}


MODELS = {
    'qwen2': (1, model_qwen2),
    'qwen3': (2, lambda w: model_qwen3(w, False)),
    'qwen3_tied': (3, lambda w: model_qwen3(w, True)),
    'qwen3_moe': (4, model_qwen3_moe),
    'qwen2_moe': (5, model_qwen2_moe),
    'qwen3_next': (6, model_qwen3_next),
    'qwen3_5': (7, model_qwen3_5),
    'gemma': (8, model_gemma),
    'gemma2': (9, model_gemma2),
    'gemma3': (10, model_gemma3),
}


def write_model(root, name):
    seed, fn = MODELS[name]
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    w = Weights(seed)
    config, dtype, extra = fn(w)
    with open(os.path.join(out, 'config.json'), 'w') as f:
        json.dump(config, f, indent=1)
    shards = extra.get('shards', 1)
    if shards == 1:
        write_safetensors(os.path.join(out, 'model.safetensors'), w.tensors, dtype, {'format': 'pt'})
    else:
        per = math.ceil(len(w.tensors) / shards)
        weight_map = {}
        for s in range(shards):
            fname = 'model-%05d-of-%05d.safetensors' % (s + 1, shards)
            part = w.tensors[s * per:(s + 1) * per]
            write_safetensors(os.path.join(out, fname), part, dtype, {'format': 'pt'})
            for t in part:
                weight_map[t[0]] = fname
        with open(os.path.join(out, 'model.safetensors.index.json'), 'w') as f:
            json.dump({'metadata': {'total_size': 0}, 'weight_map': weight_map}, f, indent=1)
    tokenizer_files(out)
    if 'generation_config' in extra:
        with open(os.path.join(out, 'generation_config.json'), 'w') as f:
            json.dump(extra['generation_config'], f)
    if 'chat_template_jinja' in extra:
        with open(os.path.join(out, 'chat_template.jinja'), 'w') as f:
            f.write(extra['chat_template_jinja'])
    if 'expected_rows' in extra:
        with open(os.path.join(out, 'expected_rows.json'), 'w') as f:
            json.dump(extra['expected_rows'], f)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    root = argv[1]
    rest = argv[2:]
    stamp = os.path.join(root, 'stamp')
    if len(rest) >= 2 and rest[0] == '--stamp':
        stamp, rest = rest[1], rest[2:]
    names = rest[1:] if rest and rest[0] == '--only' else list(MODELS)
    for n in names:
        if n not in MODELS:
            print('unknown model %s (known: %s)' % (n, ', '.join(MODELS)), file=sys.stderr)
            return 2
        write_model(root, n)
    with open(stamp, 'w') as f:
        f.write(' '.join(names) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
