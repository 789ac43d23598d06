"""Read Jane Austen's six novels from Debian's r-cran-janeaustenr without R.

The package stores its data as an R "lazy-load database": `Rdata.rdx` is a
gzip-compressed R serialization (XDR, format version 3) of an index
`list(variables = list(name = c(offset, length), ...), ...)`, and
`Rdata.rdb` holds, at each (offset, length), a 4-byte big-endian uncompressed
length followed by a zlib stream of another R serialization -- here a
character vector with one element per printed line of the novel (empty
strings between paragraphs).

Only the handful of R object types these files use are decoded; anything
else raises ValueError naming the type, so a changed package fails loudly
instead of yielding garbage.
"""

import gzip
import os
import struct
import zlib

JANEAUSTENR_DATA = "/usr/lib/R/site-library/janeaustenr/data"

# Order used everywhere (publication order).
NOVELS = [
    ("sensesensibility", "Sense and Sensibility"),
    ("prideprejudice", "Pride and Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
]

# R SEXP type codes (R Internals, "Serialization formats").
_NILSXP, _SYMSXP, _LISTSXP, _CHARSXP = 0, 1, 2, 9
_LGLSXP, _INTSXP, _REALSXP, _STRSXP, _VECSXP = 10, 13, 14, 16, 19
_REFSXP, _NILVALUE_SXP = 255, 254


class _RReader:
    def __init__(self, data):
        self.d = data
        self.p = 0
        self.refs = []

    def _int(self):
        (v,) = struct.unpack_from(">i", self.d, self.p)
        self.p += 4
        return v

    def _bytes(self, n):
        if self.p + n > len(self.d):
            raise ValueError("R serialization truncated")
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def read_stream(self):
        if self._bytes(2) != b"X\n":
            raise ValueError("not an XDR R serialization")
        version = self._int()
        self._int()  # writer R version
        self._int()  # minimal reader R version
        if version == 3:
            self._bytes(self._int())  # native encoding name
        elif version != 2:
            raise ValueError(f"unsupported R serialization version {version}")
        return self.read_item()

    def read_item(self):
        flags = self._int()
        t = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        if t == _NILVALUE_SXP:
            return None
        if t == _REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self._int()
            return self.refs[idx - 1]
        if t == _SYMSXP:
            name = self.read_item()
            sym = ("sym", name)
            self.refs.append(sym)
            return sym
        if t == _CHARSXP:
            n = self._int()
            return None if n == -1 else self._bytes(n).decode("utf-8")
        if t == _LISTSXP:
            attr = self.read_item() if has_attr else None
            tag = self.read_item() if has_tag else None
            car = self.read_item()
            cdr = self.read_item()
            del attr
            items = [(tag[1] if tag else None, car)]
            if isinstance(cdr, list):
                items.extend(cdr)
            elif cdr is not None:
                raise ValueError("improper pairlist")
            return items
        if t in (_LGLSXP, _INTSXP):
            n = self._int()
            val = list(struct.unpack_from(f">{n}i", self._bytes(4 * n)))
        elif t == _REALSXP:
            n = self._int()
            val = list(struct.unpack_from(f">{n}d", self._bytes(8 * n)))
        elif t == _STRSXP:
            n = self._int()
            val = [self.read_item() for _ in range(n)]
        elif t == _VECSXP:
            n = self._int()
            val = [self.read_item() for _ in range(n)]
        else:
            raise ValueError(f"unsupported R object type {t}")
        if has_attr:
            attrs = dict(self.read_item())
            names = attrs.get("names")
            if names is not None and t == _VECSXP:
                return dict(zip(names, val))
        return val


def read_novel_lines(data_dir=JANEAUSTENR_DATA):
    """Return {novel_key: [line, ...]} for the six novels."""
    rdx = os.path.join(data_dir, "Rdata.rdx")
    rdb = os.path.join(data_dir, "Rdata.rdb")
    if not os.path.exists(rdx):
        raise FileNotFoundError(
            f"{rdx} missing: apt-get install r-cran-janeaustenr")
    index = _RReader(gzip.decompress(open(rdx, "rb").read())).read_stream()
    variables = index["variables"]
    blob = open(rdb, "rb").read()
    out = {}
    for key, _title in NOVELS:
        off, length = variables[key]
        raw = blob[off:off + length]
        (ulen,) = struct.unpack(">I", raw[:4])
        payload = zlib.decompress(raw[4:])
        if len(payload) != ulen:
            raise ValueError(f"{key}: length mismatch in Rdata.rdb")
        lines = _RReader(payload).read_stream()
        if not isinstance(lines, list) or not all(isinstance(s, str) for s in lines):
            raise ValueError(f"{key}: expected a character vector")
        out[key] = lines
    return out


def lines_to_paragraphs(lines):
    """Join printed lines into paragraphs (blank line = paragraph break).

    Project Gutenberg marks italics with underscores (_word_); they are
    dropped so the model sees plain prose.
    """
    paras, cur = [], []
    for line in lines:
        s = line.strip()
        if not s:
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        cur.append(s.replace("_", ""))
    if cur:
        paras.append(" ".join(cur))
    return paras


if __name__ == "__main__":
    novels = read_novel_lines()
    for key, title in NOVELS:
        paras = lines_to_paragraphs(novels[key])
        chars = sum(len(p) for p in paras)
        print(f"{title}: {len(novels[key])} lines, {len(paras)} paragraphs, {chars} chars")
        print("   ", paras[:3])
