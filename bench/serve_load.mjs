// A bounded load run against `cmfhost serve` (loopback): at each
// concurrency level C, C client loops each send requests one after another
// (streamed completions, greedy, a fixed prompt and max_tokens) until the
// level has sent REQUESTS requests or DURATION seconds have passed, and
// wait for those in flight. Per level: aggregate generated tokens per
// second (all tokens / the level's wall time), decode rate (tokens after
// each request's first / the level's wall time), p50/p99 time to first
// token and p50/p99 inter-token latency (gaps between streamed chunks).
// With SERVER_PID in the environment, also the server's CPU seconds per
// level (utime + stime from /proc) and tokens per CPU second: on a machine
// shared with other work, wall-clock rates say as much about the others as
// about the server; CPU time is what the server itself spent.
// usage: [SERVER_PID=N] node bench/serve_load.mjs BASE_URL [LEVELS=1,2,4,8,16] [REQUESTS=32] [DURATION_S=120] [MAX_TOKENS=64]
const [base, levelsArg = "1,2,4,8,16", requestsArg = "32", durationArg = "120", maxTokensArg = "64"] = process.argv.slice(2);
if (!base) {
  console.error("usage: node bench/serve_load.mjs BASE_URL [LEVELS] [REQUESTS] [DURATION_S] [MAX_TOKENS]");
  process.exit(2);
}
const levels = levelsArg.split(",").map(Number);
const requests = Number(requestsArg), duration = Number(durationArg) * 1000, maxTokens = Number(maxTokensArg);
import fs from "node:fs";
const serverPid = process.env.SERVER_PID;
const cpuSeconds = () => {
  if (!serverPid) return NaN;
  const f = fs.readFileSync(`/proc/${serverPid}/stat`, "utf8").split(") ")[1].split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;  // utime, stime (fields 14, 15) in ticks of 1/100 s
};
const prompt = "The history of the town begins with a small market by the river, where farmers from the valley";

async function one() {
  const t0 = performance.now();
  const r = await fetch(base + "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true }),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const times = [];
  let tokens = 0, buf = "";
  const dec = new TextDecoder();
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith("data: {")) continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) tokens = j.usage.completion_tokens;
      if (j.choices?.[0]?.text) times.push(performance.now());
    }
  }
  return { ttft: (times[0] ?? performance.now()) - t0, gaps: times.slice(1).map((t, k) => t - times[k]), tokens };
}

const pct = (xs, p) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

console.log(`# ${new Date().toISOString()} ${base}, prompt ${prompt.length} chars, max_tokens ${maxTokens}, ` +
            `${requests} requests or ${duration / 1000} s per level`);
console.log("streams  requests  tokens   wall_s   tok/s   decode_tok/s  ttft_p50_ms  ttft_p99_ms  itl_p50_ms  itl_p99_ms   cpu_s  tok/cpu_s");
await one();  // warm-up
const rows = [];
for (const c of levels) {
  const t0 = performance.now(), cpu0 = cpuSeconds();
  let sent = 0;
  const results = [];
  await Promise.all(Array.from({ length: c }, async () => {
    while (sent < requests && performance.now() - t0 < duration) {
      sent++;
      results.push(await one());
    }
  }));
  const wall = (performance.now() - t0) / 1000, cpu = cpuSeconds() - cpu0;
  const tokens = results.reduce((a, r) => a + r.tokens, 0);
  const decodeTokens = results.reduce((a, r) => a + Math.max(0, r.tokens - 1), 0);
  const ttft = results.map((r) => r.ttft), gaps = results.flatMap((r) => r.gaps);
  const row = { c, n: results.length, tokens, wall, tps: tokens / wall, dtps: decodeTokens / wall, cpu, tpc: tokens / cpu };
  rows.push(row);
  console.log(`${String(c).padStart(7)}  ${String(results.length).padStart(8)}  ${String(tokens).padStart(6)}  ${wall.toFixed(1).padStart(7)}  ` +
              `${row.tps.toFixed(1).padStart(6)}  ${row.dtps.toFixed(1).padStart(12)}  ${pct(ttft, 50).toFixed(0).padStart(11)}  ` +
              `${pct(ttft, 99).toFixed(0).padStart(11)}  ${pct(gaps, 50).toFixed(1).padStart(10)}  ${pct(gaps, 99).toFixed(1).padStart(10)}  ` +
              `${cpu.toFixed(1).padStart(6)}  ${row.tpc.toFixed(1).padStart(9)}`);
}
const one_ = rows.find((r) => r.c === 1), eight = rows.find((r) => r.c === 8);
if (one_ && eight) {
  console.log(`# decode tok/s at 8 streams / 1 stream: ${(eight.dtps / one_.dtps).toFixed(2)}x`);
  if (serverPid) console.log(`# tokens per CPU second at 8 streams / 1 stream: ${(eight.tpc / one_.tpc).toFixed(2)}x`);
}
