// tests/proxy/nginx.mjs AGENTGUARD SCRATCH - replicas behind a real load
// balancer: Debian's nginx round-robins one looping conversation's requests
// over two `agentguard proxy` processes. The proxy keeps nothing between
// requests, so the loop must be stopped at the same request as through one
// process, and both replicas must have served it. (tests/proxy/nginx.sh
// starts it; it skips without node or nginx.)
import { spawn } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

const [bin, scratch] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const children = [];
const fail = (msg) => {
  console.error("FAIL: " + msg);
  for (const c of children) c.kill("SIGKILL");
  process.exit(1);
};

function started(child, stream, re, what) {
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`${what}: ${out}`)), 15000);
    child[stream].on("data", (c) => {
      out += c;
      const m = re.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.on("exit", (code) => reject(new Error(`${what} exited ${code}: ${out}`)));
  });
}

const freePort = () => new Promise((resolve) => {
  const s = createServer();
  s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
});

// The client's loop (Chat Completions, not streamed): ask, run the call,
// ask again, until a reply without calls; returns the number of requests.
async function loop(base) {
  const tools = [{ type: "function", function: { name: "read_file",
    parameters: { type: "object", properties: { path: { type: "string" } } } } }];
  const messages = [{ role: "user", content: "Summarise a.txt" }];
  for (let n = 1; n <= 20; n++) {
    const r = await fetch(base + "/v1/chat/completions", { method: "POST",
      headers: { "content-type": "application/json",
        authorization: "Bearer sk-test" },
      body: JSON.stringify({ model: "m", messages, tools }) });
    if (r.status !== 200) fail(`request ${n}: ${r.status} ${await r.text()}`);
    const msg = (await r.json()).choices[0].message;
    messages.push(msg);
    if (!msg.tool_calls || msg.tool_calls.length === 0) {
      if (!/agentguard stopped this turn/.test(msg.content ?? ""))
        fail("the loop ended without the stop: " + msg.content);
      return n;
    }
    for (const tc of msg.tool_calls)
      messages.push({ role: "tool", tool_call_id: tc.id, content: "hello" });
  }
  fail("never stopped");
}

try {
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(path.join(scratch, "tmp"), { recursive: true });
  const up = spawn(process.execPath, [path.join(here, "..", "agents", "upstream.mjs")],
    { env: { ...process.env, MODEL: "loop", CALL_NAME: "read_file",
      CALL_ARGS: '{"path":"a.txt"}' }, stdio: ["ignore", "pipe", "inherit"] });
  children.push(up);
  const upPort = await started(up, "stdout", /port (\d+)/, "upstream");
  const ports = [];
  for (let i = 0; i < 2; i++) {
    const px = spawn(bin, ["proxy", "--listen", "127.0.0.1:0", "--upstream",
      `http://127.0.0.1:${upPort}`, "--drain-timeout", "0"],
    { stdio: ["ignore", "ignore", "pipe"] });
    children.push(px);
    ports.push(await started(px, "stderr",
      /listening on http:\/\/127\.0\.0\.1:(\d+)/, "proxy " + i));
  }
  const lbPort = await freePort();
  const tmp = path.join(scratch, "tmp");
  writeFileSync(path.join(scratch, "nginx.conf"), [
    process.getuid && process.getuid() === 0 ? "user root;" : "",
    "worker_processes 1;", "daemon off;", "master_process off;",
    `pid ${path.join(scratch, "nginx.pid")};`,
    `error_log ${path.join(scratch, "error.log")};`,
    "events { worker_connections 64; }",
    "http {", "  access_log off;",
    `  client_body_temp_path ${tmp}/body;`, `  proxy_temp_path ${tmp}/proxy;`,
    `  fastcgi_temp_path ${tmp}/fcgi;`, `  uwsgi_temp_path ${tmp}/uwsgi;`,
    `  scgi_temp_path ${tmp}/scgi;`,
    "  upstream agentguard {",
    ...ports.map((p) => `    server 127.0.0.1:${p};`),
    "  }",
    "  server {", `    listen 127.0.0.1:${lbPort};`,
    "    location / { proxy_pass http://agentguard; proxy_http_version 1.1;",
    "      proxy_set_header Connection \"\"; proxy_buffering off; }",
    "  }", "}", ""].join("\n"));
  const lb = spawn("nginx", ["-c", path.join(scratch, "nginx.conf"), "-p", scratch],
    { stdio: ["ignore", "ignore", "pipe"] });
  children.push(lb);
  let ready = false;
  for (let i = 0; i < 100 && !ready; i++) {
    await new Promise((r) => setTimeout(r, 100));
    try { ready = (await fetch(`http://127.0.0.1:${lbPort}/healthz`)).status === 200; }
    catch { /* not up yet */ }
  }
  if (!ready) fail("nginx did not come up");

  const one = await loop(`http://127.0.0.1:${ports[0]}`);
  const served0 = async (p) => {
    const t = await (await fetch(`http://127.0.0.1:${p}/metrics`)).text();
    return Number(/agentguard_proxy_requests_total\{api="openai"\} (\d+)/.exec(t)[1]);
  };
  const before = [await served0(ports[0]), await served0(ports[1])];
  const balanced = await loop(`http://127.0.0.1:${lbPort}`);
  const after = [await served0(ports[0]), await served0(ports[1])];
  const each = [after[0] - before[0], after[1] - before[1]];
  if (balanced !== one)
    fail(`stopped at request ${balanced} behind nginx, ${one} through one proxy`);
  if (each[0] === 0 || each[1] === 0)
    fail(`nginx did not spread the requests: ${each}`);
  console.log(`ok: stopped at request ${one} through one proxy and at ` +
    `${balanced} behind nginx round-robin (${each[0]} + ${each[1]} requests)`);
  for (const c of children) c.kill("SIGTERM");
  process.exit(0);
} catch (e) {
  fail(e.stack ?? String(e));
}
