// The parity corpus: deterministic, >= 2000 strings mixing scripts, code,
// emoji/ZWJ, whitespace runs, digits, special-token text and odd input.
// Shared by gen_fixtures.mjs (writes ../fixtures/corpus.json).
const pools = {
  en: ["Hello, world!", "The quick brown fox jumps over the lazy dog.", "I'm sure they'll've done it; we'd rather not.",
       "Don't STOP believing", "e-mail: someone@example.com", "https://example.org/path?q=1&x=y#frag", "A.B.C. and U.S.A.",
       "It's 3:45 p.m. on 2024-05-17", "well...    really?!", "CamelCaseIdentifierName", "snake_case_name_here"],
  ru: ["Привет, мир!", "Съешь же ещё этих мягких французских булок, да выпей чаю.", "Ёлка и ёжик", "ПРОПИСНЫЕ буквы"],
  zh: ["你好，世界！", "我爱自然语言处理。", "今天天气很好，我们去公园吧。", "中文標點符號：「」『』"],
  ja: ["こんにちは世界", "カタカナとひらがなと漢字", "東京都渋谷区", "ｶﾀｶﾅ半角"],
  ko: ["안녕하세요 세계", "한국어 문장입니다.", "ㅋㅋㅋ"],
  ar: ["مرحبا بالعالم", "اللغة العربية جميلة", "١٢٣٤٥"],
  he: ["שלום עולם", "עברית"],
  hi: ["नमस्ते दुनिया", "हिन्दी भाषा", "क्षत्रिय"],
  th: ["สวัสดีชาวโลก", "ภาษาไทย"],
  el: ["Γειά σου Κόσμε", "Ελληνικά ΣΊΣΥΦΟΣ"],
  de: ["Grüße aus München", "Straße Maß Fuß", "ÄÖÜäöüß"],
  fr: ["Ça va? Très bien, merci.", "l'été à l'hôpital", "œuvre naïve"],
  es: ["¿Dónde está la biblioteca?", "¡Olé! mañana"],
  vi: ["Tiếng Việt có dấu", "Xin chào thế giới"],
  code: ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }", "const x = {a: 1, 'b': [2, 3]};",
         "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); }", "SELECT * FROM t WHERE id IN (1, 2, 3);",
         "\tif x:\n\t\tpass", "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }", "<div class=\"a\">text</div>",
         "$ ls -la | grep '^d' > out.txt 2>&1", "x = [i for i in range(10) if i % 2 == 0]"],
  emoji: ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇺🇦🇯🇵", "🧑🏿‍💻", "✨🔥💯", "👩‍❤️‍💋‍👨", "1️⃣"],
  ws: [" ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", "\t\t", " \n ", "\r\n", "    ", "        ", " \t \n", "\u00a0", "\u3000", "\u2003"],
  digits: ["0", "7", "42", "123", "2024", "3.14159", "1,000,000", "-17", "1e-9", "0x1F", "٣", "१२३", "１２３"],
  special_qwen: ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start"],
  special_gemma: ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>", "<mask>", "<unused0>", "<start_of_image>"],
  odd: ["\u0000", "\u0007", "\u200b", "\u200d", "\ufeff", "e\u0301", "Å", "ﬁ", "\u{10FFFF}", "\ud7ff", "a\u0308\u0304",
        "'s", "'S", "'LL", "''", "’", "…", "—", "«»", "°C", "½", "™", "∑∫√", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ⅻ", "ǅ", "İ", "ß"],
};

// Small deterministic PRNG (mulberry32) so the corpus never changes.
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function buildCorpus() {
  const out = new Set();
  const keys = Object.keys(pools);
  for (const k of keys) for (const s of pools[k]) out.add(s);
  // every pair of pool entries joined with a space, for the short pools
  const r = rng(12345);
  const pick = (arr) => arr[Math.floor(r() * arr.length)];
  const joins = ["", " ", "  ", "\n", "\t", ", ", "\n\n", " \n"];
  while (out.size < 2100) {
    const n = 1 + Math.floor(r() * 4);
    let s = "";
    for (let i = 0; i < n; i++) {
      const k = pick(keys);
      s += (i ? pick(joins) : (r() < 0.15 ? pick(joins) : "")) + pick(pools[k]);
    }
    if (r() < 0.1) s += pick(joins);
    out.add(s);
  }
  // a few long ones
  out.add(pools.en.join(" ").repeat(3));
  out.add(pools.code.join("\n"));
  out.add(" ".repeat(40) + "x" + "\n".repeat(12));
  out.add("9".repeat(50));
  out.add("");
  return [...out];
}
