// transformers.js beside bench/text_bench on the same text (one thread):
//   node bench/text_bench.mjs MODEL_DIR CORPUS_JSON [MIN_MB]
// MODEL_DIR holds tokenizer.json + tokenizer_config.json; needs
// @huggingface/transformers (tests/text/gen/node_modules, see gen_fixtures.mjs).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, basename, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "..", "tests", "text", "gen", "package.json"));
const { AutoTokenizer, env } = await import(require.resolve("@huggingface/transformers"));
const [modelDir, corpusPath, minMbArg] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = dirname(resolve(modelDir));
const t0 = performance.now();
const tok = await AutoTokenizer.from_pretrained(basename(resolve(modelDir)));
const loadS = (performance.now() - t0) / 1000;

const lines = JSON.parse(readFileSync(corpusPath, "utf8"));
const minBytes = (minMbArg ? Number(minMbArg) : 4) * 1e6;
const docs = [];
let total = 0;
while (total < minBytes) for (const l of lines) { docs.push(l + "\n"); total += Buffer.byteLength(l) + 1; }
const big = docs.join("");
const time = (f) => { const s = performance.now(); const n = f(); return [(performance.now() - s) / 1000, n]; };
const encAll = () => { let n = 0; for (const d of docs) n += tok.encode(d, { add_special_tokens: false }).length; return n; };
const [coldS] = time(encAll);
const [warmS, n] = time(encAll);
const [bigS] = time(() => tok.encode(big, { add_special_tokens: false }).length);
const mb = total / 1e6;
console.log(`transformers.js: load ${loadS.toFixed(2)} s | ${mb.toFixed(1)} MB in ${docs.length} lines: first pass ${(mb / coldS).toFixed(1)} MB/s, second ${(mb / warmS).toFixed(1)} MB/s (${n} tokens) | one string: ${(mb / bigS).toFixed(1)} MB/s`);
