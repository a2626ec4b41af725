// tests/proxy/metrics.mjs AGENTGUARD SCRATCH - the proxy as an operator
// runs it: GET /healthz and /readyz answered by the proxy itself, GET
// /metrics checked by `promtool check metrics` and scraped by a real
// Prometheus server, which must store the stop the proxy made.
// (tests/proxy/metrics.sh starts it; it skips without node, prometheus or
// promtool.)
import { spawn, spawnSync } from "node:child_process";
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

try {
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  const up = spawn(process.execPath, [path.join(here, "..", "agents", "upstream.mjs")],
    { env: { ...process.env, MODEL: "loop" }, stdio: ["ignore", "pipe", "inherit"] });
  children.push(up);
  const upPort = await started(up, "stdout", /port (\d+)/, "upstream");
  const px = spawn(bin, ["proxy", "--listen", "127.0.0.1:0", "--upstream",
    `http://127.0.0.1:${upPort}`], { stdio: ["ignore", "ignore", "pipe"] });
  children.push(px);
  const pxPort = await started(px, "stderr",
    /listening on http:\/\/127\.0\.0\.1:(\d+)/, "proxy");
  const base = `http://127.0.0.1:${pxPort}`;

  for (const p of ["/healthz", "/readyz"]) {
    const r = await fetch(base + p);
    if (r.status !== 200 || (await r.text()) !== "ok\n")
      fail(`${p}: ${r.status}`);
  }
  // a conversation whose fifth identical call the proxy stops
  const messages = [{ role: "user", content: "Read a.txt" }];
  for (let i = 0; i < 5; i++) {
    messages.push({ role: "assistant", content: null, tool_calls: [{ id: `c${i}`,
      type: "function", function: { name: "read_file", arguments: '{"path":"a.txt"}' } }] });
    messages.push({ role: "tool", tool_call_id: `c${i}`, content: "hello" });
  }
  const stop = await fetch(base + "/v1/chat/completions", { method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages, tools: [{ type: "function",
      function: { name: "read_file", parameters: { type: "object" } } }] }) });
  if (stop.headers.get("x-agentguard-stop") !== "identical_calls")
    fail("no stop: " + stop.status + " " + (await stop.text()));
  const text = await (await fetch(base + "/metrics")).text();
  for (const want of ['agentguard_proxy_requests_total{api="openai"} 1',
    'agentguard_proxy_stops_total{reason="identical_calls"} 1',
    'agentguard_proxy_decisions_total{decision="final_request_without_tools"} 1'])
    if (!text.includes(want + "\n")) fail(`/metrics lacks "${want}":\n${text}`);
  const lint = spawnSync("promtool", ["check", "metrics"], { input: text });
  if (lint.status !== 0)
    fail("promtool check metrics: " + lint.stdout + lint.stderr);

  // a real Prometheus scrapes it and stores the stop
  const promPort = await freePort();
  writeFileSync(path.join(scratch, "prometheus.yml"),
    "global:\n  scrape_interval: 1s\nscrape_configs:\n" +
    "  - job_name: agentguard\n    static_configs:\n" +
    `      - targets: ['127.0.0.1:${pxPort}']\n`);
  const prom = spawn("prometheus", [
    `--config.file=${path.join(scratch, "prometheus.yml")}`,
    `--storage.tsdb.path=${path.join(scratch, "data")}`,
    `--web.listen-address=127.0.0.1:${promPort}`], { stdio: "ignore" });
  children.push(prom);
  const q = encodeURIComponent('agentguard_proxy_stops_total{reason="identical_calls"}');
  let value = null;
  for (let i = 0; i < 60 && value === null; i++) {
    await new Promise((r) => setTimeout(r, 500));
    try {
      const r = await fetch(`http://127.0.0.1:${promPort}/api/v1/query?query=${q}`);
      const j = await r.json();
      if (j.status === "success" && j.data.result.length > 0)
        value = j.data.result[0].value[1];
    } catch { /* not up yet */ }
  }
  if (value !== "1") fail(`Prometheus stored ${value} for the stop`);
  console.log("ok: /healthz, /readyz, promtool check metrics, and Prometheus " +
    `stored agentguard_proxy_stops_total{reason="identical_calls"} = ${value}`);
  for (const c of children) c.kill("SIGTERM");
  process.exit(0);
} catch (e) {
  fail(e.stack ?? String(e));
}
