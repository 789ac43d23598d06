#include "serve/chat_page.hpp"

namespace cmfhost::serve {

// Kept plain: no framework, no build step. The conversation lives in the
// page (sent whole with every turn, as the OpenAI API expects).
const char kChatPage[] = R"page(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>cmf chat</title>
<style>
  :root { --bg: #f6f5f1; --fg: #1d1d1f; --muted: #6b6b70; --user: #dbe8ff; --bot: #ffffff; --line: #d9d6cf; --accent: #2f5fd0; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; background: var(--bg); color: var(--fg);
         display: flex; flex-direction: column; height: 100vh; }
  header { display: flex; gap: 12px; align-items: center; padding: 10px 16px; border-bottom: 1px solid var(--line); flex-wrap: wrap; }
  header h1 { font-size: 16px; margin: 0 8px 0 0; }
  header label { color: var(--muted); font-size: 13px; display: flex; gap: 4px; align-items: center; }
  header input { width: 70px; padding: 3px 5px; border: 1px solid var(--line); border-radius: 4px; font: inherit; }
  header input#key { width: 140px; }
  #model { color: var(--muted); font-size: 13px; margin-left: auto; }
  #log { flex: 1; overflow-y: auto; padding: 16px; display: flex; flex-direction: column; gap: 10px; }
  .msg { max-width: 760px; padding: 9px 13px; border-radius: 10px; white-space: pre-wrap; word-wrap: break-word; border: 1px solid var(--line); }
  .user { align-self: flex-end; background: var(--user); }
  .assistant { align-self: flex-start; background: var(--bot); }
  .error { align-self: center; background: #ffe3e0; border-color: #e3a29a; }
  .meta { font-size: 12px; color: var(--muted); margin-top: 4px; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid var(--line); }
  textarea { flex: 1; resize: none; height: 58px; padding: 8px; font: inherit; border: 1px solid var(--line); border-radius: 8px; }
  button { padding: 0 18px; border: 0; border-radius: 8px; background: var(--accent); color: #fff; font: inherit; cursor: pointer; }
  button.secondary { background: #8a8a90; }
  button:disabled { opacity: .5; cursor: default; }
</style>
</head>
<body>
<header>
  <h1>cmf chat</h1>
  <label>temperature <input id="temp" type="number" min="0" max="2" step="0.1" value="0.7"></label>
  <label>max tokens <input id="max" type="number" min="1" step="1" value="256"></label>
  <label>API key <input id="key" type="password" placeholder="(none)"></label>
  <button id="clear" class="secondary" type="button">New chat</button>
  <span id="model"></span>
</header>
<main id="log"></main>
<form id="form">
  <textarea id="input" placeholder="Type a message (Enter sends, Shift+Enter for a new line)" autofocus></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" class="secondary" type="button" disabled>Stop</button>
</form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const log = $("log"), input = $("input"), send = $("send"), stop = $("stop");
let history = [];
let controller = null;
$("key").value = localStorage.getItem("cmf-api-key") || "";
$("key").addEventListener("change", () => localStorage.setItem("cmf-api-key", $("key").value));

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}

async function loadModel() {
  try {
    const r = await fetch("v1/models", { headers: headers() });
    const j = await r.json();
    if (r.ok && j.data && j.data.length) $("model").textContent = "model: " + j.data[0].id;
  } catch (e) { /* the model line is only informative */ }
}

async function ask(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  out.classList.add("streaming");
  send.disabled = true; stop.disabled = false;
  controller = new AbortController();
  let answer = "", finish = null, usage = null;
  try {
    const r = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({ messages: history, stream: true, temperature: Number($("temp").value),
                             max_tokens: Number($("max").value) }),
    });
    if (!r.ok) {
      let msg = r.status + " " + r.statusText;
      try { msg = (await r.json()).error.message; } catch (e) { /* keep the status line */ }
      throw new Error(msg);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, nl);
        buf = buf.slice(nl + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.usage) usage = j.usage;
        const c = j.choices && j.choices[0];
        if (!c) continue;
        if (c.delta && c.delta.content) { answer += c.delta.content; out.textContent = answer; log.scrollTop = log.scrollHeight; }
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    history.push({ role: "assistant", content: answer });
  } catch (e) {
    if (e.name === "AbortError") history.push({ role: "assistant", content: answer });
    else { bubble("error", "Error: " + e.message); history.pop(); }
  } finally {
    out.classList.remove("streaming");
    out.classList.add("done");
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.textContent = (finish ? "finish: " + finish : "stopped") + (usage ? " · " + usage.completion_tokens + " tokens" : "");
    out.appendChild(meta);
    send.disabled = false; stop.disabled = true; controller = null;
    input.focus();
  }
}

$("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = "";
  ask(text);
});
input.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("form").requestSubmit(); }
});
stop.addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => { if (controller) controller.abort(); history = []; log.textContent = ""; });
loadModel();
</script>
</body>
</html>
)page";

}  // namespace cmfhost::serve
