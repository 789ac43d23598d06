// Starting and stopping `cmfhost serve` for the tests: a fresh server on a
// free loopback port (--port 0; the port is read from its first line).
import { spawn } from "node:child_process";
import { once } from "node:events";
import http from "node:http";

export const CMFHOST = process.argv[2];
export const MODEL = process.argv[3];

export async function startServer(extraArgs = [], env = {}, { waitReady = true } = {}) {
  const proc = spawn(CMFHOST, ["serve", MODEL, "--port", "0", "--threads", "2", ...extraArgs], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "", err = "";
  proc.stderr.on("data", (d) => { err += d; });
  const port = await new Promise((resolve, reject) => {
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)\//);
      if (m) resolve(Number(m[1]));
    });
    proc.on("exit", (code) => reject(new Error(`cmfhost serve exited (${code}) before listening:\n${out}\n${err}`)));
  });
  const server = { proc, port, base: `http://127.0.0.1:${port}`, output: () => out + err };
  if (waitReady) {
    for (let i = 0; i < 600; i++) {
      const r = await request(server, "GET", "/health").catch(() => null);
      if (r && r.status === 200) break;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return server;
}

// SIGTERM, then the exit code; a server still running 30 s later is killed
// and reported as "hung" (a shutdown that never ends fails the test, it
// does not hang it).
export async function stopServer(server, signal = "SIGTERM") {
  if (server.proc.exitCode !== null) return server.proc.exitCode;
  server.proc.kill(signal);
  return waitForExit(server);
}

// The exit code of a server already told to stop (no second signal: one
// that lands during shutdown would be a different test); SIGKILL after 30 s.
export async function waitForExit(server) {
  if (server.proc.exitCode !== null || server.proc.signalCode !== null) return server.proc.exitCode;
  const exited = once(server.proc, "exit");
  let timer;
  const hung = new Promise((resolve) => { timer = setTimeout(() => resolve("hung"), 30000); });
  const result = await Promise.race([exited.then(([code]) => code), hung]);
  clearTimeout(timer);
  if (result === "hung") {
    server.proc.kill("SIGKILL");
    await exited;
  }
  return result;
}

// A raw HTTP request: { status, headers, body } (body as text).
export function request(server, method, path, { body = null, headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port: server.port, method, path, headers, agent: false }, (res) => {
      let data = "";
      res.setEncoding("utf8");
      res.on("data", (d) => { data += d; });
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
    });
    req.on("error", reject);
    if (body !== null) req.write(body);
    req.end();
  });
}

export async function metric(server, name, headers = {}) {
  const r = await request(server, "GET", "/metrics", { headers });
  const m = r.body.match(new RegExp(`^${name} (\\S+)$`, "m"));
  return m ? Number(m[1]) : NaN;
}
