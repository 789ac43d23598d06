#!/usr/bin/env node
// llama.cpp pp/tg benchmark through node-llama-cpp's prebuilt CPU binaries, measured
// the way llama-bench measures (llama.cpp itself cannot be built on this machine):
//   pp<P>: one llama_decode of P random token ids into an empty KV cache, logits for
//          the last token only (batch size >= P);
//   tg<N>: N single-token llama_decode calls from an empty KV cache, each producing
//          the logits of its token (the output projection runs every step; the next
//          input is a random id, as in llama-bench, so sampling does not matter).
// Every test: one warm-up run, then -r timed runs; the KV cache is cleared before
// each run and, with -d D, filled with D random tokens (untimed) first, as
// llama-bench -d does. Prints median (min-max) tok/s per test, and which llama.cpp build and
// ggml CPU variant library were loaded (read from /proc/self/maps: ggml picks the
// best of its libggml-cpu-*.so variants for this CPU at load time).
//
// usage: node bench.mjs MODEL.gguf [-p 512] [-n 128] [-r 3] [-d 0] [--threads 2]
//                                  [--flash-attn 0|1] [--cache-type f16|q8_0|f32]
//                                  [--check-tokens K [--dump-logits FILE]]
//   --cache-type T:   the KV cache's K and V type (llama-bench -ctk T -ctv T;
//                     a quantized V cache needs --flash-attn 1 in llama.cpp)
//   --check-tokens K: instead of timing, evaluate K fixed token ids one at a time
//                     and print the argmax next token and the logits of a fixed set
//                     of token ids after each (to compare two quantizations);
//                     --dump-logits writes the K x n_vocab logits as raw f32 to FILE
//                     (check_ref.py compares them with a numpy forward pass).
import fs from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function usage(code) {
    (code ? process.stderr : process.stdout).write(
        "usage: node bench.mjs MODEL.gguf [-p 512] [-n 128] [-r 3] [-d 0] [--threads 2] [--flash-attn 0|1] [--cache-type f16|q8_0|f32] [--check-tokens K [--dump-logits FILE]]\n");
    process.exit(code);
}

const opts = { p: 512, n: 128, r: 3, d: 0, threads: 2, fa: 0, cache: "f16", check: 0, dump: null };
const cacheTypes = { f16: "F16", q8_0: "Q8_0", f32: "F32" };
let modelPath = null;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const num = () => {
        const v = Number(argv[++i]);
        if (!Number.isInteger(v) || v < 0) { console.error(`bench.mjs: ${a} needs a non-negative integer`); usage(2); }
        return v;
    };
    if (a === "-h" || a === "--help") usage(0);
    else if (a === "-p") opts.p = num();
    else if (a === "-n") opts.n = num();
    else if (a === "-r") opts.r = num();
    else if (a === "-d") opts.d = num();
    else if ((a === "--cache-type" || a === "-ctk") && i + 1 < argv.length) {
        opts.cache = argv[++i];
        if (!(opts.cache in cacheTypes)) { console.error(`bench.mjs: --cache-type is f16, q8_0 or f32, not ${opts.cache}`); usage(2); }
    }
    else if (a === "-t" || a === "--threads") opts.threads = num();
    else if (a === "--flash-attn" || a === "-fa") opts.fa = num();
    else if (a === "--check-tokens") opts.check = num();
    else if (a === "--dump-logits" && i + 1 < argv.length) opts.dump = argv[++i];
    else if (!a.startsWith("-") && modelPath === null) modelPath = a;
    else { console.error(`bench.mjs: unknown argument ${a}`); usage(2); }
}
if (modelPath === null) usage(2);
if (!fs.existsSync(modelPath)) { console.error(`bench.mjs: no such file ${modelPath}`); process.exit(1); }
if (opts.r < 1 || opts.threads < 1) { console.error("bench.mjs: -r and --threads must be >= 1"); process.exit(2); }

// build: "never" -- use the prebuilt binaries or fail; never try to compile llama.cpp.
// Info-level logs are needed for llama.cpp's own timers (llama_perf_context_print);
// of the rest only warnings and errors are shown.
const perfLines = [];
const llama = await getLlama({
    gpu: false, build: "never", maxThreads: opts.threads, logLevel: LlamaLogLevel.info,
    logger: (level, message) => {
        if (/llama_perf_context_print:\s+(prompt )?eval time/.test(message)) perfLines.push(message.trim());
        else if (level === "warn" || level === "error" || level === "fatal") process.stderr.write(`llama.cpp ${level}: ${message}\n`);
    },
});
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
// node-llama-cpp exposes no vocabulary size: take it from token_embd's ne[1].
const embd = (model.fileInfo.fullTensorInfo ?? model.fileInfo.tensorInfo ?? [])
    .find((t) => t.name === "token_embd.weight");
const nVocab = Number(embd?.dimensions?.[1]);
if (!Number.isInteger(nVocab) || nVocab < 2) throw new Error(`cannot find the vocabulary size (token_embd.weight) in ${modelPath}`);
// (llama.cpp pads the context to a multiple of 256 and node-llama-cpp shifts a
// full one, dropping tokens: leave room above what a run holds.)
const ctxSize = Math.ceil((Math.max(opts.d + Math.max(opts.p, opts.n), opts.check + 1, 64) + 1) / 256) * 256;
const context = await model.createContext({
    contextSize: ctxSize,
    batchSize: Math.max(opts.p, opts.d ? 512 : 1),
    threads: { ideal: opts.threads, min: opts.threads },
    flashAttention: opts.fa !== 0,
    experimentalKvCacheKeyType: cacheTypes[opts.cache],
    experimentalKvCacheValueType: cacheTypes[opts.cache],
    sequences: 1,
    performanceTracking: true,
});
const seq = context.getSequence();

function cpuVariant() {
    const maps = fs.readFileSync("/proc/self/maps", "utf8");
    const libs = new Set();
    for (const m of maps.matchAll(/\S*libggml-cpu[^\s]*\.so/g)) libs.add(m[0].split("/").pop());
    return [...libs].join(",") || "unknown";
}

// Deterministic pseudo-random token ids (xorshift32), like llama-bench's random ids.
let rng = 0x9e3779b9;
function randomToken() {
    rng ^= rng << 13; rng >>>= 0; rng ^= rng >>> 17; rng ^= rng << 5; rng >>>= 0;
    return rng % nVocab;
}

// An empty cache, then -d random tokens in batches of up to 512 (untimed).
async function fillDepth() {
    await seq.clearHistory();
    for (let done = 0; done < opts.d;) {
        const k = Math.min(512, opts.d - done);
        const input = Array.from({ length: k }, randomToken);
        input[k - 1] = [input[k - 1], { generateNext: { token: true } }];
        await seq.controlledEvaluate(input);
        done += k;
    }
    if (seq.nextTokenIndex !== opts.d) throw new Error(`depth: sequence holds ${seq.nextTokenIndex} tokens, expected ${opts.d}`);
}

// pp: one evaluation of P tokens; only the last asks for a next token (= logits).
async function runPrompt(P) {
    await fillDepth();
    const input = Array.from({ length: P }, randomToken);
    input[P - 1] = [input[P - 1], { generateNext: { token: true } }];
    const t0 = process.hrtime.bigint();
    const out = await seq.controlledEvaluate(input);
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (out[P - 1]?.next?.token == null) throw new Error("pp: no output for the last token");
    if (seq.nextTokenIndex !== opts.d + P) throw new Error(`pp: sequence holds ${seq.nextTokenIndex} tokens, expected ${opts.d + P}`);
    return P / dt;
}

// tg: N evaluations of exactly one token each, each producing logits (greedy token).
async function runGen(N) {
    await fillDepth();
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < N; i++) {
        const out = await seq.controlledEvaluate([[randomToken(), { generateNext: { token: true } }]]);
        if (out[0]?.next?.token == null) throw new Error("tg: no output token");
    }
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (seq.nextTokenIndex !== opts.d + N) throw new Error(`tg: sequence holds ${seq.nextTokenIndex} tokens, expected ${opts.d + N}`);
    return N / dt;
}

async function measure(name, fn, arg) {
    await fn(arg);  // warm-up
    const v = [];
    for (let i = 0; i < opts.r; i++) v.push(await fn(arg));
    v.sort((a, b) => a - b);
    const med = v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
    console.log(`${name.padEnd(8)} ${med.toFixed(2).padStart(9)} tok/s (${v[0].toFixed(2)}-${v[v.length - 1].toFixed(2)}, median of ${opts.r})`);
}

async function check(K) {
    await seq.clearHistory();
    const probe = [0, 1, 1000, 50000, 151935 % nVocab];
    const all = new Float32Array(K * nVocab);
    for (let i = 0; i < K; i++) {
        const tok = (i * 7919 + 11) % nVocab;
        const [o] = await seq.controlledEvaluate([[tok, { generateNext: { token: true, logits: true } }]]);
        const lg = o.next.logits;
        let best = -1, bestV = -Infinity;
        for (const [t, v] of lg) {
            all[i * nVocab + t] = v;
            if (v > bestV) { bestV = v; best = t; }
        }
        console.log(`check pos ${i} in ${tok}: argmax ${best} (${bestV.toFixed(4)}), sampled ${o.next.token}; logits[${probe.join(",")}] = ` +
            probe.map((t) => (lg.get(t) ?? NaN).toFixed(4)).join(" "));
    }
    if (opts.dump) fs.writeFileSync(opts.dump, Buffer.from(all.buffer));
}

const rel = llama.llamaCppRelease;
console.log(`llama.cpp ${rel?.release ?? "?"} (${llama.buildType}, node-llama-cpp), CPU backend ${cpuVariant()}, ` +
    `${opts.threads} threads (context uses ${context.currentThreads}), flash-attn ${opts.fa ? 1 : 0}, KV cache ${opts.cache}, ctx ${context.contextSize}, batch ${context.batchSize}`);
console.log(`ggml ${llama.systemInfo.trim()}`);
console.log(`model ${modelPath} (${(fs.statSync(modelPath).size / 1e6).toFixed(0)} MB), n_vocab ${nVocab}`);
if (opts.check) await check(opts.check);
else {
    const at = opts.d ? ` @ d${opts.d}` : "";
    if (opts.p) await measure(`pp${opts.p}${at}`, runPrompt, opts.p);
    if (opts.n) await measure(`tg${opts.n}${at}`, runGen, opts.n);
    // Cross-check without node/JS overhead: llama.cpp's timers over all runs
    // including warm-ups ("prompt eval" = the pp batches, "eval" = the tg steps;
    // with -d only "eval": the prompt evals include the depth fills).
    await context.printTimings();
    for (const l of perfLines) {
        const m = /(prompt eval|eval) time =\s*([\d.]+) ms \/\s*(\d+) (?:tokens|runs).*?([\d.]+) tokens per second/.exec(l);
        if (m && !(opts.d && m[1] === "prompt eval")) console.log(`llama.cpp timers: ${m[1].padEnd(11)} ${Number(m[4]).toFixed(2).padStart(9)} tok/s over ${m[3]} tokens (all runs incl. warm-up)`);
    }
}
await context.dispose();
await model.dispose();
await llama.dispose();
