// tests/schema/mcp.mjs AGENTGUARD PREFIX SCRATCH - a real MCP server's tool
// schemas (@modelcontextprotocol/server-filesystem, pinned in mcp.sh)
// through agentguard's schema compiler and validator: every tool the
// server lists (tools/list over stdio, JSON-RPC) is registered with its
// inputSchema in a scenario, and a scripted model calls them with valid
// and invalid arguments. Each call must be judged as JSON Schema says.
import { spawn, spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";

const [bin, prefix, scratch] = process.argv.slice(2);
const fail = (msg) => { console.error("FAIL: " + msg); process.exit(1); };

rmSync(scratch, { recursive: true, force: true });
mkdirSync(path.join(scratch, "root"), { recursive: true });
const server = spawn(process.execPath, [path.join(prefix, "node_modules",
  "@modelcontextprotocol", "server-filesystem", "dist", "index.js"),
  path.join(scratch, "root")], { stdio: ["pipe", "pipe", "ignore"] });
let buf = "";
const pending = new Map();
server.stdout.on("data", (c) => {
  buf += c;
  for (let i; (i = buf.indexOf("\n")) >= 0;) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    if (!line.trim()) continue;
    const m = JSON.parse(line);
    if (pending.has(m.id)) { pending.get(m.id)(m); pending.delete(m.id); }
  }
});
let nextId = 1;
const rpc = (method, params) => new Promise((resolve, reject) => {
  const id = nextId++;
  pending.set(id, resolve);
  setTimeout(() => reject(new Error(method + ": no answer")), 20000);
  server.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
});
let tools;
try {
  await rpc("initialize", { protocolVersion: "2025-06-18", capabilities: {},
    clientInfo: { name: "agentguard-test", version: "1" } });
  server.stdin.write(JSON.stringify({ jsonrpc: "2.0",
    method: "notifications/initialized" }) + "\n");
  tools = (await rpc("tools/list", {})).result.tools;
} catch (e) {
  fail(e.message);
} finally {
  server.kill();
}
if (!Array.isArray(tools) || tools.length < 10) fail("tools/list: " + JSON.stringify(tools));

const scenarioTools = {};
for (const t of tools)
  scenarioTools[t.name] = { description: (t.description ?? "").slice(0, 200),
    parameters: t.inputSchema, responses: [{ ok: "done" }] };
// valid and invalid calls, as JSON Schema judges them
const calls = [
  ["read_text_file", { path: "a.txt", head: 2 }, true],
  ["edit_file", { path: "a.txt", edits: [{ oldText: "a", newText: "b" }] }, true],
  ["edit_file", { path: "a.txt", edits: [{ oldText: "a" }] }, false],
  ["list_directory_with_sizes", { path: ".", sortBy: "size" }, true],
  ["list_directory_with_sizes", { path: ".", sortBy: "date" }, false],
  ["read_multiple_files", { paths: [] }, false],
  ["move_file", { source: "a", destination: 7 }, false],
];
const scenario = { description: "MCP filesystem tools", preset: "none",
  tools: scenarioTools, turns: [{ user: "go", model: [
    ...calls.map(([name, args]) => ({ tool_calls: [{ name, arguments: args }] })),
    { text: "done" }] }] };
const file = path.join(scratch, "scenario.json");
const events = path.join(scratch, "events.jsonl");
writeFileSync(file, JSON.stringify(scenario));
const run = spawnSync(bin, ["simulate", file, "--events", events],
  { encoding: "utf8" });
if (run.status !== 0) fail(`simulate exit ${run.status}: ${run.stderr}`);
const results = readFileSync(events, "utf8").trim().split("\n")
  .map((l) => JSON.parse(l)).filter((e) => e.event === "tool_result");
if (results.length !== calls.length)
  fail(`${results.length} results for ${calls.length} calls`);
calls.forEach(([name, args, valid], i) => {
  const r = results[i];
  if (r.name !== name) fail(`result ${i} is ${r.name}, want ${name}`);
  const ok = r.ok === true;
  if (ok !== valid)
    fail(`${name} ${JSON.stringify(args)}: ${JSON.stringify(r)}, want ${valid ? "valid" : "invalid"}`);
});
console.log(`ok: ${tools.length} MCP filesystem tools registered, ` +
  `${calls.length} calls judged as JSON Schema says`);
