"""Byte-level BPE (GPT-2 / Qwen style): training, encoding, HF tokenizer.json I/O.

Encoding follows what HF `tokenizers` does for a Qwen2/Qwen3 tokenizer.json:
split on added (special) tokens, NFC-normalise the rest, split it with the
Qwen pre-tokenization regex, map each piece's UTF-8 bytes to printable
characters (GPT-2 bytes_to_unicode), then apply merges by rank inside each
piece. Decoding maps the characters back to bytes.

Uses the `regex` module (Debian python3-regex) because the pattern needs
\\p{L} / \\p{N} classes, which the stdlib `re` lacks.
"""

import collections
import json
import unicodedata

import regex

# Qwen2/Qwen3 pre-tokenizer pattern (the tokenizer.json "Split" regex).
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRETOK = regex.compile(PRETOKENIZE_PATTERN)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def pretokenize(text):
    return _PRETOK.findall(unicodedata.normalize("NFC", text))


def train_bpe(texts, n_merges, log=print):
    """Learn `n_merges` merges over the pre-tokenized words of `texts`.

    Deterministic: ties in pair frequency are broken by the lexicographically
    smallest pair of token strings. Returns the list of merges (a, b).
    """
    word_counts = collections.Counter()
    for t in texts:
        word_counts.update(pretokenize(t))
    words = [list("".join(BYTE_TO_CHAR[b] for b in w.encode("utf-8")))
             for w in word_counts]
    freqs = list(word_counts.values())
    pair_counts = collections.Counter()
    where = collections.defaultdict(set)  # pair -> word indices containing it
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_counts[(a, b)] += freqs[i]
            where[(a, b)].add(i)
    merges = []
    for step in range(n_merges):
        if not pair_counts:
            break
        best_n = max(pair_counts.values())
        best = min(p for p, c in pair_counts.items() if c == best_n)
        merges.append(best)
        a, b = best
        merged = a + b
        for i in list(where[best]):
            w = words[i]
            f = freqs[i]
            # Remove this word's old pair counts, merge, add new ones.
            for p in zip(w, w[1:]):
                pair_counts[p] -= f
                if pair_counts[p] <= 0:
                    del pair_counts[p]
                where[p].discard(i)
            nw, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(merged)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            words[i] = nw
            for p in zip(nw, nw[1:]):
                pair_counts[p] += f
                where[p].add(i)
        where.pop(best, None)
        if log and (step + 1) % 500 == 0:
            log(f"  bpe: {step + 1} merges, last {merged!r} x{best_n}")
    return merges


class ByteLevelBPE:
    def __init__(self, vocab, merges, special_tokens):
        self.vocab = vocab                      # token string -> id
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.ranks = {tuple(m): r for r, m in enumerate(merges)}
        self.merges = merges
        self.special = dict(special_tokens)     # content -> id
        for c, i in self.special.items():
            self.id_to_token[i] = c
        if self.special:
            self._special_re = regex.compile(
                "(" + "|".join(regex.escape(s) for s in
                               sorted(self.special, key=len, reverse=True)) + ")")
        else:
            self._special_re = None
        self._cache = {}

    @classmethod
    def build(cls, merges, special_tokens=SPECIAL_TOKENS):
        vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
        for a, b in merges:
            vocab[a + b] = len(vocab)
        specials = {s: len(vocab) + k for k, s in enumerate(special_tokens)}
        return cls(vocab, merges, specials)

    @property
    def vocab_size(self):
        return len(self.vocab) + len(self.special)

    def _bpe(self, piece):
        hit = self._cache.get(piece)
        if hit is not None:
            return hit
        sym = list("".join(BYTE_TO_CHAR[b] for b in piece.encode("utf-8")))
        while len(sym) > 1:
            best, best_rank = None, None
            for k in range(len(sym) - 1):
                r = self.ranks.get((sym[k], sym[k + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = k, r
            if best is None:
                break
            sym[best:best + 2] = [sym[best] + sym[best + 1]]
        ids = [self.vocab[s] for s in sym]
        self._cache[piece] = ids
        return ids

    def encode(self, text):
        """Text may contain special tokens; they map to their ids."""
        ids = []
        parts = self._special_re.split(text) if self._special_re else [text]
        for part in parts:
            if not part:
                continue
            if part in self.special:
                ids.append(self.special[part])
                continue
            for piece in pretokenize(part):
                ids.extend(self._bpe(piece))
        return ids

    def decode(self, ids, skip_special=False):
        out, buf = [], bytearray()
        for i in ids:
            tok = self.id_to_token[i]
            if tok in self.special:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                if not skip_special:
                    out.append(tok)
            else:
                buf.extend(CHAR_TO_BYTE[c] for c in tok)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    # ---- HF tokenizer.json -------------------------------------------------
    def to_hf_json(self):
        byte_level = {"type": "ByteLevel", "add_prefix_space": False,
                      "trim_offsets": False, "use_regex": False}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {"id": i, "content": c, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": True}
                for c, i in sorted(self.special.items(), key=lambda kv: kv[1])
            ],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": PRETOKENIZE_PATTERN},
                     "behavior": "Isolated", "invert": False},
                    dict(byte_level),
                ],
            },
            "post_processor": dict(byte_level),
            "decoder": dict(byte_level),
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": "",
                "end_of_word_suffix": "",
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": dict(sorted(self.vocab.items(), key=lambda kv: kv[1])),
                "merges": [a + " " + b for a, b in self.merges],
            },
        }

    @classmethod
    def from_hf_json(cls, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        m = j["model"]
        if m["type"] != "BPE":
            raise ValueError(f"{path}: model type {m['type']} is not BPE")
        merges = [tuple(x.split(" ")) if isinstance(x, str) else tuple(x)
                  for x in m["merges"]]
        specials = {t["content"]: t["id"] for t in j["added_tokens"]}
        return cls(m["vocab"], merges, specials)
