#!/usr/bin/python3
"""cmfhost imagine-pack and imagine on the tiny Lumina-Image 2.0 pipeline of
make_lumina2_reference.py (CMF_LUMINA2_DIR: its OUT_DIR).

    cli_imagine_test.py CMFHOST

Checks:
  imagine-pack --quant f32   writes a pipeline file; info names its components;
  imagine --latent-in        the final latent (--latent-out) within 1e-3 of the
                             PyTorch loop, the PNG (decoded here with zlib) within
                             1 level on <= 1 % of the values of the reference image;
  imagine --seed             the same seed gives the same PNG, another seed another;
  q8 and q4t packs           run to a PNG of the right size;
  run on a pipeline file     points to imagine; clear errors for a directory
                             that is not a pipeline, a size off the multiple,
                             a latent of the wrong size; --help of both commands.
"""
import json
import os
import struct
import subprocess
import sys
import zlib

cmfhost = sys.argv[1]
base = os.environ["CMF_LUMINA2_DIR"]
ref = os.path.join(base, "ref")
work = os.path.join(base, "cli")
os.makedirs(work, exist_ok=True)
case = json.load(open(os.path.join(ref, "case.json")))
size = f"{case['width']}x{case['height']}"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, expect=0):
    p = subprocess.run([cmfhost] + args, capture_output=True, timeout=300)
    if expect is not None and p.returncode != expect:
        print("command:", " ".join([cmfhost] + args))
        print("stdout:", p.stdout.decode(errors="replace")[-2000:])
        print("stderr:", p.stderr.decode(errors="replace")[-2000:])
        check(False, f"exit status {p.returncode} (expected {expect}) of {' '.join(args[:1])}")
    return p


def f32(path):
    b = open(path, "rb").read()
    return struct.unpack("<%df" % (len(b) // 4), b)


def rel_err(a, r):
    return max(abs(x - y) for x, y in zip(a, r)) / max(abs(y) for y in r)


def read_png(path):
    """(width, height, RGB bytes) of an 8-bit RGB, non-interlaced PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype == 2 and interlace == 0, f"PNG is not 8-bit RGB: {hdr}"
    raw, stride, out, prev = zlib.decompress(idat), w * 3, bytearray(), bytearray(w * 3)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - 3] if i >= 3 else 0
            b = prev[i]
            c = prev[i - 3] if i >= 3 else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return w, h, bytes(out)


pipeline = os.path.join(base, "pipeline")
f32_file = os.path.join(work, "tiny-f32.cmf")
p = run(["imagine-pack", "--model", pipeline, "--output", f32_file, "--quant", "f32", "--no-progress"])
check(os.path.exists(f32_file), "imagine-pack writes the pipeline file")
p = run(["info", f32_file])
info = p.stdout.decode()
check("pipeline      lumina-image-2.0: dit next-dit" in info and "arch          lumina2-image" in info,
      "info names the pipeline and its components")

# Parity from the injected latent.
png, lat = os.path.join(work, "ref.png"), os.path.join(work, "ref.latent")
run(["imagine", f32_file, "-p", case["prompt"], "--steps", str(case["steps"]), "--cfg", str(case["guidance"]),
     "--size", size, "--latent-in", os.path.join(ref, "latent_in.f32"), "--latent-out", lat, "-o", png,
     "--no-progress"])
err = rel_err(f32(lat), f32(os.path.join(ref, "latent_out.f32")))
check(err < 1e-3, f"imagine's final latent within 1e-3 of PyTorch ({err:.2e})")
w, h, rgb = read_png(png)
want = open(os.path.join(ref, "image.u8"), "rb").read()
check((w, h) == (case["width"], case["height"]), f"PNG is {w}x{h}")
diff = [abs(x - y) for x, y in zip(rgb, want)]
n_diff = sum(d != 0 for d in diff)
check(len(rgb) == len(want) and n_diff <= 0.01 * len(want) and max(diff) <= 1,
      f"PNG vs the reference image: {n_diff} of {len(want)} values differ, by at most {max(diff)}")

# Seeds.
a, b, c = (os.path.join(work, f"seed{i}.png") for i in range(3))
common = ["-p", "a lighthouse", "--steps", "2", "--size", size, "--no-progress"]
run(["imagine", f32_file, "--seed", "7", "-o", a] + common)
run(["imagine", f32_file, "--seed", "7", "-o", b] + common)
run(["imagine", f32_file, "--seed", "8", "-o", c] + common)
check(read_png(a)[2] == read_png(b)[2], "the same seed gives the same image")
check(read_png(a)[2] != read_png(c)[2], "another seed gives another image")

# Quantized packs run.
for q in ("q8", "q4t"):
    out = os.path.join(work, f"tiny-{q}.cmf")
    run(["imagine-pack", "--model", pipeline, "--output", out, "--quant", q, "--no-progress"])
    img = os.path.join(work, f"{q}.png")
    run(["imagine", out, "-o", img, "--seed", "1"] + common[:-1] + ["--no-progress"])
    check(os.path.exists(img) and read_png(img)[:2] == (case["width"], case["height"]), f"a {q} pack makes a PNG")

# Errors.
p = run(["run", f32_file, "-p", "hi"], expect=None)
check(p.returncode != 0 and b"imagine" in p.stderr, "run on a pipeline file points to imagine")
p = run(["imagine-pack", "--model", os.path.join(pipeline, "vae"), "--output", os.path.join(work, "x.cmf"),
         "--no-progress"], expect=None)
check(p.returncode != 0 and b"model_index.json" in p.stderr and not os.path.exists(os.path.join(work, "x.cmf")),
      "imagine-pack on a directory that is not a pipeline: a clear error, no file")
p = run(["imagine", f32_file, "-p", "x", "--size", "30x24", "-o", os.path.join(work, "bad.png")], expect=None)
check(p.returncode != 0 and b"multiples of" in p.stderr, "a size off the multiple is refused")
p = run(["imagine", f32_file, "-p", "x", "--size", "64x64", "--latent-in", os.path.join(ref, "latent_in.f32"),
         "-o", os.path.join(work, "bad.png")], expect=None)
check(p.returncode != 0 and b"--latent-in" in p.stderr, "a latent of the wrong size is refused")
for cmd in ("imagine", "imagine-pack"):
    p = run([cmd, "--help"])
    check(b"--" in p.stdout, f"{cmd} --help")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
