// `cmfhost serve` on loopback, driven by the official OpenAI client and by
// raw HTTP: chat and completions (streaming and not), the error rows
// (400, 401, 404, 405, 413, 429, 503), client disconnects, concurrency
// (8 streams at once give what each gives alone, greedy) and shutdown.
// Run: node serve_test.mjs CMFHOST MODEL (the q8 austen-tiny model).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { startServer, stopServer, waitForExit, request, metric } from "./serve_util.mjs";

let srv, client;

before(async () => {
  srv = await startServer(["--parallel", "8", "--ctx", "256", "--max-body", "65536"]);
  client = new OpenAI({ baseURL: srv.base + "/v1", apiKey: "unused", maxRetries: 0 });
});
after(async () => {
  assert.equal(await stopServer(srv), 0, srv.output());
});

const greedy = { temperature: 0, seed: 1 };

test("chat completion through the OpenAI client: shape and usage", async () => {
  const r = await client.chat.completions.create({
    model: "whatever", messages: [{ role: "user", content: "Who is Mr. Darcy?" }], max_tokens: 20, ...greedy,
  });
  assert.equal(r.object, "chat.completion");
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.model, "austen-q8");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.ok(r.choices[0].message.content.length > 0);
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 5);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 20);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test("streamed chat equals the non-streamed answer, usage in the final chunk", async () => {
  const messages = [{ role: "system", content: "You are Miss Bennet." }, { role: "user", content: "Tell me of Netherfield." }];
  const full = await client.chat.completions.create({ messages, max_tokens: 30, ...greedy, model: "m" });
  const stream = await client.chat.completions.create({
    messages, max_tokens: 30, ...greedy, model: "m", stream: true, stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null, chunks = 0, roleSeen = false, usageOnly = 0;
  for await (const c of stream) {
    chunks++;
    assert.equal(c.object, "chat.completion.chunk");
    if (c.choices.length === 0) { usageOnly++; usage = c.usage; continue; }
    if (c.choices[0].delta.role) roleSeen = true;
    text += c.choices[0].delta.content ?? "";
    if (c.choices[0].finish_reason) { finish = c.choices[0].finish_reason; assert.ok(c.usage, "usage in the final chunk"); }
  }
  assert.ok(roleSeen);
  assert.ok(chunks > 3, "streamed in pieces");
  assert.equal(text, full.choices[0].message.content);
  assert.equal(finish, full.choices[0].finish_reason);
  assert.equal(usageOnly, 1);
  assert.deepEqual(usage, full.usage);
});

test("completions, streamed and not, and the model list", async () => {
  const prompt = "It is a truth universally acknowledged, that";
  const full = await client.completions.create({ model: "m", prompt, max_tokens: 16, ...greedy });
  assert.equal(full.object, "text_completion");
  assert.ok(full.choices[0].text.length > 0);
  assert.equal(full.usage.prompt_tokens, 11);  // the reference prompt's ids (models/austen-tiny/expected_greedy.json)
  let text = "";
  for await (const c of await client.completions.create({ model: "m", prompt, max_tokens: 16, ...greedy, stream: true }))
    text += c.choices[0]?.text ?? "";
  assert.equal(text, full.choices[0].text);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["austen-q8"]);
});

test("stop strings end the answer before them", async () => {
  const messages = [{ role: "user", content: "Describe Pemberley." }];
  const full = (await client.chat.completions.create({ model: "m", messages, max_tokens: 40, ...greedy })).choices[0];
  const words = full.message.content.split(" ");
  assert.ok(words.length > 4, full.message.content);
  const stop = " " + words[3];
  const cut = full.message.content.slice(0, full.message.content.indexOf(stop));
  const r = (await client.chat.completions.create({ model: "m", messages, max_tokens: 40, ...greedy, stop: [stop, "@@@"] })).choices[0];
  assert.equal(r.message.content, cut);
  assert.equal(r.finish_reason, "stop");
  let streamed = "";
  for await (const c of await client.chat.completions.create({ model: "m", messages, max_tokens: 40, ...greedy, stop, stream: true }))
    streamed += c.choices[0]?.delta?.content ?? "";
  assert.equal(streamed, cut);
});

test("8 simultaneous streams all complete and equal the same requests run one at a time", async () => {
  const prompts = ["Who is Emma?", "Describe Bath.", "What did Elizabeth say?", "Tell me of Mr. Knightley.",
    "Where is Highbury?", "Who is Lady Catherine?", "What is a ball?", "Speak of Mr. Collins."];
  const run = async (p) => {
    let text = "";
    const s = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: p }], max_tokens: 24, ...greedy, stream: true });
    for await (const c of s) text += c.choices[0]?.delta?.content ?? "";
    return text;
  };
  const together = await Promise.all(prompts.map(run));
  const alone = [];
  for (const p of prompts) alone.push(await run(p));
  assert.deepEqual(together, alone);
  assert.ok(new Set(alone).size > 1, "different prompts give different answers, so a mix-up would show");
  assert.ok((await metric(srv, "cmf_requests_total")) >= 16);
});

test("error rows: 400, 404, 405, 413 in OpenAI's error shape", async () => {
  const post = (path, body, headers = { "Content-Type": "application/json" }) =>
    request(srv, "POST", path, { body, headers });
  const expectError = (r, status, type, param) => {
    assert.equal(r.status, status, r.body);
    const j = JSON.parse(r.body);
    assert.equal(typeof j.error.message, "string");
    assert.ok(j.error.message.length > 0);
    assert.equal(j.error.type, type);
    if (param !== undefined) assert.equal(j.error.param, param);
  };
  const chat = "/v1/chat/completions";
  expectError(await post(chat, "{not json"), 400, "invalid_request_error");
  expectError(await post(chat, "[1,2]"), 400, "invalid_request_error");
  expectError(await post(chat, JSON.stringify({ model: "m" })), 400, "invalid_request_error", "messages");
  expectError(await post(chat, JSON.stringify({ messages: [] })), 400, "invalid_request_error", "messages");
  expectError(await post(chat, JSON.stringify({ messages: [{ role: "wizard", content: "x" }] })), 400, "invalid_request_error", "messages[0].role");
  const msgs = [{ role: "user", content: "hi" }];
  expectError(await post(chat, JSON.stringify({ messages: msgs, temperature: 5 })), 400, "invalid_request_error", "temperature");
  expectError(await post(chat, JSON.stringify({ messages: msgs, top_p: 0 })), 400, "invalid_request_error", "top_p");
  expectError(await post(chat, JSON.stringify({ messages: msgs, n: 2 })), 400, "invalid_request_error", "n");
  expectError(await post(chat, JSON.stringify({ messages: msgs, max_tokens: 0 })), 400, "invalid_request_error", "max_tokens");
  expectError(await post(chat, JSON.stringify({ messages: msgs, stop: ["a", "b", "c", "d", "e"] })), 400, "invalid_request_error", "stop");
  expectError(await post(chat, JSON.stringify({ messages: msgs, seed: "x" })), 400, "invalid_request_error", "seed");
  expectError(await post(chat, JSON.stringify({ messages: msgs, stream: "yes" })), 400, "invalid_request_error", "stream");
  expectError(await post("/v1/completions", JSON.stringify({ prompt: 3 })), 400, "invalid_request_error", "prompt");
  // A prompt longer than a slot's context (--ctx 256).
  const long = JSON.stringify({ prompt: "Mr. Darcy walked. ".repeat(200) });
  const r = await post("/v1/completions", long);
  expectError(r, 400, "invalid_request_error", "prompt");
  assert.equal(JSON.parse(r.body).error.code, "context_length_exceeded");
  expectError(await request(srv, "GET", "/v1/nothing"), 404, "not_found_error");
  expectError(await request(srv, "GET", "/v1/chat/completions"), 405, "invalid_request_error");
  expectError(await post(chat, JSON.stringify({ messages: [{ role: "user", content: "x".repeat(70000) }] })), 413, "invalid_request_error");
  // The server is still fine afterwards.
  assert.equal((await request(srv, "GET", "/health")).status, 200);
});

test("a client that disconnects cancels its request", async () => {
  const before = await metric(srv, "cmf_requests_cancelled_total");
  const body = JSON.stringify({ messages: [{ role: "user", content: "Talk for a long time." }], max_tokens: 220, stream: true, ...greedy });
  await new Promise((resolve, reject) => {
    const sock = net.connect(srv.port, "127.0.0.1", () => {
      sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    });
    let got = "";
    sock.on("data", (d) => {
      got += d;
      if (got.includes("data: {") && !sock.destroyed) { sock.destroy(); resolve(); }
    });
    sock.on("error", reject);
  });
  let cancelled = before;
  for (let i = 0; i < 200 && cancelled === before; i++) {
    await new Promise((r) => setTimeout(r, 25));
    cancelled = await metric(srv, "cmf_requests_cancelled_total");
  }
  assert.equal(cancelled, before + 1);
  assert.equal(await metric(srv, "cmf_active_sequences"), 0);
});

test("a client that sends Expect: 100-continue gets the 100 before it sends the body", async () => {
  const body = JSON.stringify({ prompt: "It is", max_tokens: 3, ...greedy });
  const got = await new Promise((resolve, reject) => {
    const sock = net.connect(srv.port, "127.0.0.1", () => {
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n` +
                 `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n`);
    });
    let data = "";
    sock.on("data", (d) => {
      if (data === "" && String(d).startsWith("HTTP/1.1 100 ")) sock.write(body);  // only after the 100
      data += d;
    });
    sock.on("end", () => resolve(data));
    sock.on("error", reject);
  });
  assert.match(got, /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 OK/);
  assert.match(got, /"object":"text_completion"/);
});

test("metrics and health", async () => {
  const r = await request(srv, "GET", "/metrics");
  assert.equal(r.status, 200);
  assert.match(r.headers["content-type"], /^text\/plain/);
  for (const name of ["cmf_requests_total", "cmf_generated_tokens_total", "cmf_prompt_tokens_total", "cmf_queue_depth",
    "cmf_batch_size", "cmf_prefill_tokens_per_second", "cmf_decode_tokens_per_second", "cmf_http_responses_total"])
    assert.match(r.body, new RegExp(`^# TYPE ${name} `, "m"), name);
  assert.ok((await metric(srv, "cmf_generated_tokens_total")) > 100);
  assert.ok((await metric(srv, "cmf_batch_size")) >= 1);
  const h = await request(srv, "GET", "/health");
  assert.equal(h.status, 200);
  assert.deepEqual(JSON.parse(h.body), { status: "ok" });
});

test("401 without or with a wrong API key; the key from a file works", async () => {
  const keyFile = path.join(os.tmpdir(), `cmf-serve-key-${process.pid}`);
  fs.writeFileSync(keyFile, "sesame\n");
  const s = await startServer(["--api-key-file", keyFile]);
  try {
    const body = JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
    for (const headers of [{}, { Authorization: "Bearer wrong" }, { Authorization: "Basic sesame" }, { Authorization: "Bearer sesamE" }]) {
      const r = await request(s, "POST", "/v1/chat/completions", { body, headers });
      assert.equal(r.status, 401, JSON.stringify(headers));
      assert.equal(JSON.parse(r.body).error.type, "authentication_error");
      assert.equal(JSON.parse(r.body).error.code, "invalid_api_key");
    }
    assert.equal((await request(s, "GET", "/v1/models")).status, 401);
    assert.equal((await request(s, "GET", "/metrics")).status, 401);
    assert.equal((await request(s, "GET", "/health")).status, 200);  // health and the page need no key
    assert.equal((await request(s, "GET", "/")).status, 200);
    const ok = new OpenAI({ baseURL: s.base + "/v1", apiKey: "sesame", maxRetries: 0 });
    const r = await ok.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
    assert.equal(r.object, "chat.completion");
    const bad = new OpenAI({ baseURL: s.base + "/v1", apiKey: "nope", maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
  } finally {
    fs.rmSync(keyFile, { force: true });
    assert.equal(await stopServer(s), 0);
  }
});

test("429 when the queue is full", async () => {
  const s = await startServer(["--parallel", "1", "--max-queue", "1"]);
  try {
    // One slot and one queue place: of four requests sent at once, one
    // waits and one or two are refused, unless the first finished before
    // the last arrived (this tiny model decodes a request in a few ms on a
    // fast machine): long answers, and a few tries at most.
    const body = JSON.stringify({ messages: [{ role: "user", content: "Speak at length." }], max_tokens: 300, ...greedy });
    let rs = [];
    for (let attempt = 0; attempt < 5; ++attempt) {
      rs = await Promise.all([0, 1, 2, 3].map(() => request(s, "POST", "/v1/chat/completions", { body })));
      if (rs.some((r) => r.status === 429)) break;
    }
    const codes = rs.map((r) => r.status).sort();
    assert.ok(codes.includes(429), codes.join(","));
    assert.ok(codes.includes(200), codes.join(","));
    const busy = rs.find((r) => r.status === 429);
    assert.equal(JSON.parse(busy.body).error.type, "rate_limit_error");
    assert.ok((await metric(s, "cmf_requests_rejected_total")) >= 1);
  } finally {
    assert.equal(await stopServer(s), 0);
  }
});

test("503 while the model loads", async () => {
  const s = await startServer([], { CMF_SERVE_LOAD_DELAY_MS: "3000" }, { waitReady: false });
  try {
    const h = await request(s, "GET", "/health");
    assert.equal(h.status, 503);
    assert.equal(JSON.parse(h.body).error.type, "unavailable_error");
    const r = await request(s, "POST", "/v1/chat/completions", { body: "{}" });
    assert.equal(r.status, 503);
    assert.equal((await request(s, "GET", "/")).status, 200);  // the page is there already
  } finally {
    assert.equal(await stopServer(s), 0);
  }
});

test("SIGTERM: in-flight streams finish, new connections are refused, exit 0", async () => {
  const s = await startServer(["--shutdown-grace", "30"]);
  const c = new OpenAI({ baseURL: s.base + "/v1", apiKey: "x", maxRetries: 0 });
  const stream = await c.chat.completions.create({ model: "m", messages: [{ role: "user", content: "Go on." }], max_tokens: 120, ...greedy, stream: true });
  const it = stream[Symbol.asyncIterator]();
  await it.next();  // generating
  s.proc.kill("SIGTERM");
  await new Promise((r) => setTimeout(r, 200));
  await assert.rejects(request(s, "GET", "/health"));  // no longer accepting
  let finish = null;
  for (;;) {
    const { value, done } = await it.next();
    if (done) break;
    if (value.choices[0]?.finish_reason) finish = value.choices[0].finish_reason;
  }
  assert.ok(["stop", "length"].includes(finish), "the request in flight finished");
  assert.equal(await waitForExit(s), 0);
});

test("SIGTERM past the grace period cancels what is left and still exits 0", async () => {
  const s = await startServer(["--shutdown-grace", "0.3"]);
  const body = JSON.stringify({ messages: [{ role: "user", content: "Go on." }], max_tokens: 240, ...greedy, stream: true });
  const pending = request(s, "POST", "/v1/chat/completions", { body });
  await new Promise((r) => setTimeout(r, 300));
  const t0 = Date.now();
  s.proc.kill("SIGTERM");
  const r = await pending;
  assert.equal(r.status, 200);
  assert.match(r.body, /data: \[DONE\]/);
  assert.equal(await waitForExit(s), 0);
  assert.ok(Date.now() - t0 < 10000, "stopped within its bound");
});
