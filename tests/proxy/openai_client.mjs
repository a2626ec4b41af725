// tests/proxy/openai_client.mjs AGENTGUARD PREFIX - a tool loop written the
// way OpenAI's docs write it, with the official `openai` package, through
// `agentguard proxy`. The fake upstream's model asks for read_file({"path":
// "a.txt"}) on every request; the proxy must end the loop: the client gets
// an ordinary reply without tool calls whose text says why, and the header
// x-agentguard-stop. Exits 0 on success, 1 with a message otherwise.
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import path from "node:path";

const [bin, prefix] = process.argv.slice(2);
const require = createRequire(path.resolve(prefix, "node_modules", "x.js"));
const OpenAI = require("openai").default ?? require("openai");

function fail(msg) {
  console.error("FAIL: " + msg);
  process.exit(1);
}

let upstreamRequests = 0;
const upstream = createServer((req, res) => {
  let body = "";
  req.on("data", (c) => (body += c));
  req.on("end", () => {
    upstreamRequests++;
    if (req.headers.authorization !== "Bearer sk-node-test")
      fail("the client's key did not reach the upstream as it came");
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify({
      id: "chatcmpl-" + upstreamRequests, object: "chat.completion",
      created: 1, model: "fake",
      choices: [{ index: 0, finish_reason: "tool_calls", message: {
        role: "assistant", content: null,
        tool_calls: [{ id: "call_" + upstreamRequests, type: "function",
          function: { name: "read_file", arguments: '{"path":"a.txt"}' } }] } }],
      usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
    }));
  });
});
await new Promise((r) => upstream.listen(0, "127.0.0.1", r));
const upPort = upstream.address().port;

const proxy = spawn(bin, ["proxy", "--listen", "127.0.0.1:0", "--upstream",
  `http://127.0.0.1:${upPort}/v1`], { stdio: ["ignore", "ignore", "pipe"] });
const proxyPort = await new Promise((resolve, reject) => {
  let err = "";
  const timer = setTimeout(() => reject(new Error("no port: " + err)), 10000);
  proxy.stderr.on("data", (c) => {
    err += c;
    const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
    if (m) { clearTimeout(timer); resolve(Number(m[1])); }
  });
  proxy.on("exit", (code) => reject(new Error(`proxy exited ${code}: ${err}`)));
}).catch((e) => fail(e.message));

try {
  const client = new OpenAI({ apiKey: "sk-node-test",
    baseURL: `http://127.0.0.1:${proxyPort}/v1`, maxRetries: 0 });
  const tools = [{ type: "function", function: { name: "read_file",
    parameters: { type: "object", properties: { path: { type: "string" } } } } }];
  const messages = [{ role: "user", content: "Summarise a.txt" }];
  let final = null, stop = null, steps = 0;
  while (steps++ < 20) {
    const { data, response } = await client.chat.completions
      .create({ model: "fake", messages, tools }).withResponse();
    const msg = data.choices[0].message;
    messages.push(msg);
    if (!msg.tool_calls || msg.tool_calls.length === 0) {
      final = msg.content;
      stop = response.headers.get("x-agentguard-stop");
      break;
    }
    for (const tc of msg.tool_calls)
      messages.push({ role: "tool", tool_call_id: tc.id, content: "hello" });
  }
  if (final === null) fail("the loop was never stopped");
  if (stop !== "identical_calls") fail("x-agentguard-stop: " + stop);
  if (!/agentguard stopped this turn \(identical_calls\)/.test(final))
    fail("final message: " + final);
  console.log(`ok: stopped after ${steps} requests (${upstreamRequests} ` +
    `upstream): ${final}`);
} catch (e) {
  fail(e.stack ?? String(e));
} finally {
  proxy.kill("SIGTERM");
  upstream.close();
}
