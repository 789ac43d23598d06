#!/usr/bin/python3
"""Train cmf's default demo model: a tiny Qwen3 on Jane Austen's novels.

    nice -n 10 /usr/bin/python3 tools/train/train_default_model.py [--out models/austen-tiny]

Needs Debian packages python3-torch, python3-numpy, python3-regex,
libopenblas0-pthread and r-cran-janeaustenr (the corpus). Everything is
deterministic for a fixed --seed on the same torch build and thread count
(2): corpus split, tokenizer, data order, initialisation.

Steps:
 1. Read the six novels from r-cran-janeaustenr (austen_corpus.py), split
    into paragraphs; hold out one contiguous block of paragraphs from the
    middle of each novel (heldout.txt), never trained on.
 2. Train a byte-level BPE (Qwen pre-tokenizer regex) on the training
    paragraphs; write tokenizer.json / tokenizer_config.json.
 3. Build two training streams:
      raw  -- the novels as plain text (paragraphs joined by blank lines,
              novels separated by <|endoftext|>), sampled as random windows;
      chat -- ChatML conversations made from training paragraphs with a few
              fixed request templates (continue a given opening sentence,
              write a passage from a named novel, a passage about a named
              character, a passage in Austen's style). The assistant turn is
              always verbatim Austen text; loss is on the assistant turn only.
    A fixed fraction (--chat-frac) of each batch is chat.
 4. Train Qwen3ForCausalLM (qwen3_torch.py) with AdamW, warmup + cosine LR.
 5. Write config.json, generation_config.json, model.safetensors (f32) and
    train_log.json; print held-out loss / perplexity.
"""

import argparse
import json
import math
import os
import random
import sys
import time

# The machine is shared and oversubscribed: let idle OpenMP threads sleep
# instead of spinning (must be set before torch loads its OpenMP runtime).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import austen_corpus  # noqa: E402
from bpe_tokenizer import ByteLevelBPE, train_bpe  # noqa: E402
from qwen3_torch import Qwen3ForCausalLM, save_safetensors  # noqa: E402

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Main characters per novel, used for "Tell me about X." chat requests.
CHARACTERS = {
    "sensesensibility": ["Elinor", "Marianne", "Edward", "Willoughby", "Colonel Brandon"],
    "prideprejudice": ["Elizabeth", "Mr. Darcy", "Jane", "Mr. Bingley", "Mr. Collins", "Lydia"],
    "mansfieldpark": ["Fanny", "Edmund", "Sir Thomas", "Mrs. Norris", "Crawford"],
    "emma": ["Emma", "Mr. Knightley", "Harriet", "Mr. Elton", "Frank Churchill", "Mr. Woodhouse"],
    "northangerabbey": ["Catherine", "Henry Tilney", "Isabella", "General Tilney", "Thorpe"],
    "persuasion": ["Anne", "Captain Wentworth", "Sir Walter", "Lady Russell", "Louisa"],
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "models", "austen-tiny"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=4096, help="incl. 3 special tokens")
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=48)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=128, help="training sequence length")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=380,
                    help="step count when --time-budget is 0")
    ap.add_argument("--time-budget", type=float, default=2100,
                    help="train for this many seconds instead of a fixed step count: "
                         "the LR schedule runs on elapsed-time fraction and the LR of "
                         "every step is recorded in train_log.json, so --replay-lr can "
                         "repeat the run exactly on any machine speed")
    ap.add_argument("--replay-lr", default="",
                    help="train_log.json of an earlier run: replay its per-step LRs")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--chat-frac", type=float, default=0.25)
    ap.add_argument("--heldout-chars", type=int, default=1000,
                    help="approx. characters held out per novel")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bench", action="store_true",
                    help="only time a few steps and exit (writes nothing)")
    return ap.parse_args()


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---- corpus ------------------------------------------------------------------

def split_corpus(heldout_chars):
    """-> ({novel: [train paragraphs]}, [held-out paragraphs])."""
    novels = austen_corpus.read_novel_lines()
    train, heldout = {}, []
    for key, _title in austen_corpus.NOVELS:
        paras = austen_corpus.lines_to_paragraphs(novels[key])
        start = len(paras) // 2
        # Begin the held-out block at a real paragraph (not a chapter heading).
        while len(paras[start]) < 200:
            start += 1
        end, n = start, 0
        while n < heldout_chars:
            n += len(paras[end]) + 2
            end += 1
        heldout.extend(paras[start:end])
        train[key] = paras[:start] + paras[end:]
    return train, heldout


def first_sentence_split(p):
    """Split a paragraph after its first sentence, or None."""
    for k in range(20, min(len(p), 240)):
        if p[k] in ".!?" and k + 2 < len(p) and p[k + 1] == " " and p[k + 2].isupper():
            return p[:k + 1], p[k + 2:]
    return None


def trim_to_sentences(text, max_chars):
    """Cut text at the last sentence end within max_chars (or at a word)."""
    if len(text) <= max_chars:
        return text
    cut = max(text.rfind(c, 0, max_chars) for c in ".!?")
    if cut >= max_chars // 3:
        return text[:cut + 1]
    return text[:text.rfind(" ", 0, max_chars)]


def make_chat_examples(train, rng):
    titles = dict(austen_corpus.NOVELS)
    ex = []
    for key, paras in train.items():
        for p in paras:
            if len(p) < 120:
                continue
            kind = rng.random()
            if kind < 0.45:
                split = first_sentence_split(p)
                if split is None:
                    continue
                user = "Continue the story: " + split[0]
                reply = split[1]
            elif kind < 0.65:
                user = f"Write a passage from {titles[key]}."
                reply = p
            elif kind < 0.85:
                names = [c for c in CHARACTERS[key] if c in p]
                if not names:
                    continue
                user = f"Tell me about {rng.choice(names)}."
                reply = p
            else:
                user = "Write a passage in the style of Jane Austen."
                reply = p
            ex.append((user, trim_to_sentences(reply, 380)))
    return ex


def chat_text(user, reply):
    return (f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{reply}<|im_end|>\n")


def build_streams(tok, train, chat_examples, ctx):
    eot = tok.special["<|endoftext|>"]
    raw = []
    for key, paras in train.items():
        raw.extend(tok.encode("\n\n".join(paras)))
        raw.append(eot)
    raw = torch.tensor(raw, dtype=torch.long)
    # Chat rows: [ctx+1] ids padded with <|endoftext|>, and a loss mask over
    # targets that is 1 only on the assistant reply and its <|im_end|>\n.
    prefix_marker = tok.encode("<|im_start|>assistant\n")
    rows, masks = [], []
    for user, reply in chat_examples:
        ids = tok.encode(chat_text(user, reply))
        if len(ids) > ctx + 1:
            continue
        # position of the first reply token
        for s in range(len(ids) - len(prefix_marker)):
            if ids[s:s + len(prefix_marker)] == prefix_marker:
                start = s + len(prefix_marker)
                break
        m = [0] * ctx
        for t in range(start, len(ids)):
            m[t - 1] = 1  # target index t-1 predicts ids[t]
        rows.append(ids + [eot] * (ctx + 1 - len(ids)))
        masks.append(m)
    return raw, torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.float32)


# ---- evaluation -----------------------------------------------------------------

@torch.no_grad()
def heldout_loss(model, ids, ctx):
    """Mean NLL (nats/token) over every token of `ids` but the first.

    Windows of `ctx` inputs with stride ctx, each evaluated from an empty
    context: window k feeds ids[k*ctx : k*ctx+ctx] and scores the next token
    at every position (the last window may be shorter).
    """
    model.eval()
    total, n = 0.0, 0
    for s in range(0, len(ids) - 1, ctx):
        x = torch.tensor([ids[s:s + ctx]])
        y = torch.tensor([ids[s + 1:s + ctx + 1]])
        x = x[:, :y.shape[1]]
        logits = model(x)
        total += float(F.cross_entropy(logits[0].float(), y[0], reduction="sum"))
        n += y.shape[1]
    model.train()
    return total / n, n


# ---- main -----------------------------------------------------------------------

def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    t0 = time.time()

    train, heldout = split_corpus(a.heldout_chars)
    log(f"corpus: {sum(len(p) for v in train.values() for p in v)} training chars, "
        f"{sum(len(p) for p in heldout)} held-out chars")

    n_merges = a.vocab_size - 256 - 3
    merges = train_bpe([p for v in train.values() for p in v], n_merges,
                       log=lambda s: log(s))
    tok = ByteLevelBPE.build(merges)
    assert tok.vocab_size == a.vocab_size, tok.vocab_size
    log(f"tokenizer: {tok.vocab_size} tokens ({len(merges)} merges)")

    chat_ex = make_chat_examples(train, rng)
    raw, chat_rows, chat_masks = build_streams(tok, train, chat_ex, a.ctx)
    heldout_text = "\n\n".join(heldout) + "\n"
    heldout_ids = tok.encode(heldout_text)
    log(f"data: raw stream {len(raw)} tokens "
        f"({sum(len(p) for v in train.values() for p in v) / len(raw):.2f} chars/token), "
        f"{len(chat_rows)} chat rows, held-out {len(heldout_ids)} tokens")

    eot, im_start, im_end = (tok.special[s] for s in
                             ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": tok.vocab_size,
        "hidden_size": a.hidden,
        "intermediate_size": a.ffn,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": a.layers,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": eot,
        "eos_token_id": im_end,
        "pad_token_id": eot,
        "torch_dtype": "float32",
    }
    model = Qwen3ForCausalLM(cfg)
    model.init_weights(cfg["initializer_range"])
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters ({n_params * 4 / 1e6:.1f} MB as f32)")

    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_from_progress(step, prog):
        # linear warmup over the first steps, then cosine from lr to lr/10
        # over progress (fraction of steps or of the time budget) in [0, 1].
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        prog = min(1.0, max(0.0, prog))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))

    replay = None
    if a.replay_lr:
        with open(a.replay_lr) as f:
            replay = json.load(f)["lr_per_step"]

    n_chat = round(a.batch * a.chat_frac)
    n_raw = a.batch - n_chat
    gen = torch.Generator().manual_seed(a.seed)
    history = []
    steps = 5 if a.bench else (len(replay) if replay else a.steps)
    lrs = []
    t_train = time.time()
    t_sched = None  # time-budget clock starts after warmup's first step
    model.train()
    step = 0
    while True:
        if replay is not None:
            if step >= len(replay):
                break
            lr = replay[step]
        elif a.time_budget and not a.bench:
            if t_sched is None:
                t_sched = time.time()
            prog = (time.time() - t_sched) / a.time_budget
            if prog >= 1.0:
                break
            lr = lr_from_progress(step, prog)
        else:
            if step >= steps:
                break
            lr = lr_from_progress(step, step / max(1, steps - 1))
        lrs.append(lr)
        starts = torch.randint(0, len(raw) - a.ctx - 1, (n_raw,), generator=gen)
        xr = torch.stack([raw[s:s + a.ctx + 1] for s in starts.tolist()])
        ci = torch.randint(0, len(chat_rows), (n_chat,), generator=gen)
        xc, mc = chat_rows[ci], chat_masks[ci]
        x = torch.cat([xr, xc])
        mask = torch.cat([torch.ones(n_raw, a.ctx), mc])
        logits = model(x[:, :-1])
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                              reduction="none").view_as(mask)
        loss = (nll * mask).sum() / mask.sum()
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            el = time.time() - t_train
            log(f"step {step} loss {loss.item():.3f} lr {lr:.2e} "
                f"{el / (step + 1):.2f}s/step")
            history.append({"step": step, "loss": round(loss.item(), 4)})
        if (step + 1) % 100 == 0 and not a.bench:
            hl, _ = heldout_loss(model, heldout_ids, a.ctx)
            log(f"  held-out loss {hl:.3f} ppl {math.exp(hl):.1f}")
            history.append({"step": step, "heldout_loss": round(hl, 4)})
        step += 1
    steps = step
    log(f"trained {steps} steps, final batch loss {loss.item():.3f}")
    if a.bench:
        log(f"bench: {(time.time() - t_train) / steps:.2f}s/step "
            f"({a.batch * a.ctx} tokens/step)")
        return

    # ---- write the checkpoint ----
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)

    def write_json(name, obj):
        tmp = os.path.join(out, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, os.path.join(out, name))

    write_json("config.json", cfg)
    write_json("generation_config.json", {
        "bos_token_id": eot,
        "eos_token_id": [im_end, eot],
        "pad_token_id": eot,
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "repetition_penalty": 1.1,
    })
    tok_json = tok.to_hf_json()
    tmp = os.path.join(out, "tokenizer.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False, separators=(",", ":"))
    os.replace(tmp, os.path.join(out, "tokenizer.json"))
    write_json("tokenizer_config.json", {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": cfg["max_position_embeddings"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "added_tokens_decoder": {
            str(i): {"content": c, "lstrip": False, "normalized": False,
                     "rstrip": False, "single_word": False, "special": True}
            for c, i in sorted(tok.special.items(), key=lambda kv: kv[1])
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": CHAT_TEMPLATE,
    })
    with open(os.path.join(out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(heldout_text)
    # Save, then reload what was written so the reported held-out loss is
    # the committed checkpoint's.
    save_safetensors(model.hf_state_dict(), os.path.join(out, "model.safetensors"),
                     metadata={"format": "pt"})
    from qwen3_torch import load_checkpoint
    reloaded, _ = load_checkpoint(out)
    hl, n_tok = heldout_loss(reloaded, heldout_ids, a.ctx)
    n_bytes = len(heldout_text.encode("utf-8"))
    result = {
        "args": vars(a) | {"out": os.path.relpath(out, os.getcwd())},
        "n_params": n_params,
        "train_tokens_raw_stream": len(raw),
        "chat_rows": len(chat_rows),
        "steps": steps,
        "tokens_seen": steps * a.batch * a.ctx,
        "train_seconds": round(time.time() - t_train),
        "total_seconds": round(time.time() - t0),
        "torch_version": torch.__version__,
        "heldout": {"tokens_scored": n_tok, "bytes": n_bytes,
                    "loss_nats_per_token": round(hl, 4),
                    "perplexity": round(math.exp(hl), 3),
                    "bits_per_byte": round(hl * n_tok / n_bytes / math.log(2), 4)},
        "history": history,
        "lr_per_step": lrs,
    }
    write_json("train_log.json", result)
    log(f"held-out: loss {hl:.4f} nats/token, perplexity {math.exp(hl):.2f} "
        f"over {n_tok} tokens")
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
