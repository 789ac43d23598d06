// The chat page in a real browser: Debian's chromium, headless, driven by
// puppeteer-core. It types a message, sends it and waits for the streamed
// answer; the answer must grow over several frames (streamed, not dumped at
// the end) and equal what the API gives for the same conversation.
// Run: node chat_page_test.mjs CMFHOST MODEL SCREENSHOT_PATH
// (skipped, exit 77, without /usr/bin/chromium).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startServer, stopServer, request } from "./serve_util.mjs";

const CHROMIUM = "/usr/bin/chromium";
if (!fs.existsSync(CHROMIUM)) {
  console.log(`# SKIP: ${CHROMIUM} is not installed (scripts/setup.sh --tests installs it)`);
  process.exit(77);
}
const puppeteer = (await import("puppeteer-core")).default;
const SCREENSHOT = process.argv[4];

let srv, browser, profile;
before(async () => {
  srv = await startServer(["--ctx", "256"]);
  profile = fs.mkdtempSync(path.join(os.tmpdir(), "cmf-chromium-"));
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync", `--user-data-dir=${profile}`],
  });
});
after(async () => {
  if (browser) await browser.close();
  fs.rmSync(profile, { recursive: true, force: true });
  assert.equal(await stopServer(srv), 0);
});

test("the page is self-contained", async () => {
  const r = await request(srv, "GET", "/");
  assert.equal(r.status, 200);
  assert.match(r.headers["content-type"], /^text\/html/);
  assert.doesNotMatch(r.body, /(src|href)="(https?:)?\/\//, "no external resources");
});

test("typing a message streams an answer", async () => {
  const page = await browser.newPage();
  const external = [];
  page.on("request", (req) => { if (!req.url().startsWith(srv.base)) external.push(req.url()); });
  await page.setViewport({ width: 900, height: 640 });
  await page.goto(srv.base + "/", { waitUntil: "load" });
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("austen"));
  // Greedy, so the answer can be compared with the API's.
  await page.evaluate(() => { document.getElementById("temp").value = "0"; document.getElementById("max").value = "60"; });
  await page.type("#input", "Who is Mr. Darcy?");
  // Record every text the answer bubble shows (each streamed delta replaces
  // its text node), until the page marks it done.
  const watching = page.evaluate(() => new Promise((resolve) => {
    const seen = [];
    const watch = (a) => {
      new MutationObserver((records) => {
        for (const r of records) for (const n of r.addedNodes) if (n.nodeType === Node.TEXT_NODE) seen.push(n.data.length);
        if (a.classList.contains("done")) resolve(seen);
      }).observe(a, { childList: true, attributes: true });
    };
    const a = document.querySelector(".msg.assistant");
    if (a) watch(a);
    else new MutationObserver((_, obs) => {
      const b = document.querySelector(".msg.assistant");
      if (b) { obs.disconnect(); watch(b); }
    }).observe(document.getElementById("log"), { childList: true });
  }));
  await page.keyboard.press("Enter");
  const lengths = await watching;
  const answer = await page.$eval(".msg.assistant", (el) => el.firstChild.textContent);
  const meta = await page.$eval(".msg.assistant .meta", (el) => el.textContent);
  await page.screenshot({ path: SCREENSHOT });
  assert.ok(answer.length > 0, "an answer appeared");
  assert.match(meta, /finish: (stop|length)/);
  assert.ok(new Set(lengths.filter((n) => n > 0)).size > 1, `the answer was shown in pieces as they streamed (${lengths.join(",")})`);
  const api = await fetch(srv.base + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "Who is Mr. Darcy?" }], temperature: 0, max_tokens: 60 }),
  }).then((r) => r.json());
  assert.equal(answer, api.choices[0].message.content);
  assert.deepEqual(external, [], "the page fetched nothing from elsewhere");
  await page.close();
});
