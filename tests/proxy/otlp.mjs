// tests/proxy/otlp.mjs AGENTGUARD PREFIX - the proxy's traces as an
// OpenTelemetry user gets them. One node server is both the model API
// (Chat Completions, usage in each reply) and the collector (POST
// /v1/traces). Through `agentguard proxy --otlp-endpoint` go a request
// that carries the client's W3C traceparent and a looping conversation the
// proxy stops; SIGTERM sends the queued spans. The export is then held
// against what the official packages make of the same spans: the same
// attributes, kind, parent and names recorded with @opentelemetry/sdk-trace
// and encoded by @opentelemetry/otlp-transformer's JsonTraceSerializer.
// Every field agentguard writes must be one the official encoding has at
// the same place, with the same JSON type, and every attribute value of
// the same kind (stringValue, intValue). (tests/proxy/otlp.sh installs the
// pinned packages.)
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import path from "node:path";

const [bin, prefix] = process.argv.slice(2);
const require = createRequire(path.resolve(prefix, "node_modules", "x.js"));
const { JsonTraceSerializer } = require("@opentelemetry/otlp-transformer");
const { TracerProvider, InMemorySpanExporter, SimpleSpanProcessor } =
  require("@opentelemetry/sdk-trace");
const { resourceFromAttributes } = require("@opentelemetry/resources");
const api = require("@opentelemetry/api");

let px = null;
const fail = (msg) => {
  console.error("FAIL: " + msg);
  if (px) px.kill("SIGKILL");
  process.exit(1);
};

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736", PARENT = "00f067aa0ba902b7";
const exports = [];
const server = createServer((req, res) => {
  let body = "";
  req.on("data", (c) => (body += c));
  req.on("end", () => {
    if (req.url === "/v1/traces") {
      exports.push({ type: req.headers["content-type"], team: req.headers["x-team"], body });
      res.writeHead(200, { "content-type": "application/json" });
      res.end("{}");
      return;
    }
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ id: "chatcmpl-1", object: "chat.completion", created: 1,
      model: "m", choices: [{ index: 0, finish_reason: "stop",
        message: { role: "assistant", content: "done" } }],
      usage: { prompt_tokens: 12, completion_tokens: 3, total_tokens: 15 } }));
  });
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const port = server.address().port;

try {
  px = spawn(bin, ["proxy", "--listen", "127.0.0.1:0", "--upstream",
    `http://127.0.0.1:${port}/v1`, "--otlp-endpoint", `http://127.0.0.1:${port}`,
    "--drain-timeout", "0", "--quiet"],
  { env: { ...process.env, AGENTGUARD_NO_CONFIG: "1", OTEL_SERVICE_NAME: "gateway-test",
    OTEL_EXPORTER_OTLP_HEADERS: "x-team=blue" }, stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  const pxPort = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("proxy did not start: " + err)), 15000);
    px.stderr.on("data", (c) => {
      err += c;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    px.on("exit", (code) => reject(new Error(`proxy exited ${code}: ${err}`)));
  });
  const base = `http://127.0.0.1:${pxPort}/v1/chat/completions`;
  const tools = [{ type: "function", function: { name: "read_file", parameters: { type: "object" } } }];
  const post = (messages, headers) => fetch(base, { method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ model: "m", messages, tools }) });
  const first = await post([{ role: "user", content: "Say done" }],
    { traceparent: `00-${TRACE}-${PARENT}-01` });
  if (first.status !== 200) fail("first request: " + first.status);
  await first.text();
  const messages = [{ role: "user", content: "Read a.txt" }];
  for (let i = 0; i < 5; i++) {
    messages.push({ role: "assistant", content: null, tool_calls: [{ id: `c${i}`,
      type: "function", function: { name: "read_file", arguments: '{"path":"a.txt"}' } }] });
    messages.push({ role: "tool", tool_call_id: `c${i}`, content: "hello" });
  }
  const stop = await post(messages, {});
  if (stop.headers.get("x-agentguard-stop") !== "identical_calls")
    fail("no stop: " + stop.status);
  await stop.text();
  px.kill("SIGTERM");
  const code = await new Promise((r) => px.on("exit", r));
  if (code !== 0) fail(`proxy exited ${code}: ${err}`);
  px = null;
  server.close();

  const spans = [];
  let resource = null;
  for (const e of exports) {
    if (e.type !== "application/json") fail("content-type " + e.type);
    if (e.team !== "blue") fail("OTEL_EXPORTER_OTLP_HEADERS not sent: " + e.team);
    const j = JSON.parse(e.body);
    for (const rs of j.resourceSpans) {
      resource = rs.resource;
      for (const ss of rs.scopeSpans) spans.push(...ss.spans.map((s) => ({ s, scope: ss.scope })));
    }
  }
  if (spans.length !== 2) fail(`${spans.length} spans exported: ${JSON.stringify(exports)}`);
  const svc = resource.attributes.find((a) => a.key === "service.name");
  if (svc?.value?.stringValue !== "gateway-test") fail("service.name " + JSON.stringify(svc));
  const attr = (s, k) => { const v = s.attributes.find((x) => x.key === k)?.value;
    return v === undefined ? undefined : (v.stringValue ?? v.intValue); };
  // spans are queued as their requests complete, each on its own loop: the
  // second request's may come first - the one that passed is "a"
  const [a, b] = spans.map((x) => x.s)
    .sort((x, y) => (attr(y, "agentguard.decision") === "passed") - (attr(x, "agentguard.decision") === "passed"));
  // the first: a child of the client's span, in the client's trace
  if (a.traceId !== TRACE || a.parentSpanId !== PARENT) fail("not in the client's trace: " + JSON.stringify(a));
  if (!/^[0-9a-f]{16}$/.test(a.spanId)) fail("spanId " + a.spanId);
  const checks = [[a, "gen_ai.request.model", "m"], [a, "gen_ai.usage.input_tokens", 12],
    [a, "gen_ai.usage.output_tokens", 3], [a, "agentguard.decision", "passed"],
    [b, "agentguard.decision", "final_request_without_tools"], [b, "agentguard.reason", "identical_calls"],
    [a, "gen_ai.operation.name", "chat"], [a, "gen_ai.provider.name", "openai"]];
  for (const [s, k, want] of checks)
    if (attr(s, k) !== want) fail(`${k}: ${JSON.stringify(attr(s, k))}, want ${JSON.stringify(want)}`);
  if (b.traceId === TRACE || b.parentSpanId !== undefined) fail("the second span is no new trace");
  if (BigInt(a.endTimeUnixNano) < BigInt(a.startTimeUnixNano)) fail("end before start");

  // the same spans recorded with the official SDK, encoded by the official
  // JSON serializer: the reference for every field's place and type
  const exp = new InMemorySpanExporter();
  const resAttrs = {};
  for (const x of resource.attributes) resAttrs[x.key] = x.value.stringValue;
  const tp = new TracerProvider({ resource: resourceFromAttributes(resAttrs),
    spanProcessors: [new SimpleSpanProcessor({ exporter: exp })] });
  const tracer = tp.getTracer(spans[0].scope.name, spans[0].scope.version);
  for (const s of [a, b]) {
    const attributes = {};
    for (const x of s.attributes)
      attributes[x.key] = x.value.stringValue ?? Number(x.value.intValue);
    const ctx = s.parentSpanId ? api.trace.setSpanContext(api.ROOT_CONTEXT, { traceId: s.traceId,
      spanId: s.parentSpanId, traceFlags: api.TraceFlags.SAMPLED, isRemote: true }) : api.ROOT_CONTEXT;
    const span = tracer.startSpan(s.name, { kind: s.kind === 3 ? api.SpanKind.CLIENT : api.SpanKind.INTERNAL,
      attributes, startTime: new Date(Number(BigInt(s.startTimeUnixNano) / 1000000n)) }, ctx);
    if (s.status?.code === 2) span.setStatus({ code: api.SpanStatusCode.ERROR, message: s.status.message });
    span.end(new Date(Number(BigInt(s.endTimeUnixNano) / 1000000n)));
  }
  await tp.forceFlush();
  const ref = JSON.parse(new TextDecoder().decode(
    JsonTraceSerializer.serializeRequest(exp.getFinishedSpans())));
  const refSpans = ref.resourceSpans[0].scopeSpans[0].spans;
  if (refSpans.length !== 2) fail("the reference has " + refSpans.length + " spans");
  const type = (v) => Array.isArray(v) ? "array" : v === null ? "null" : typeof v;
  // every field of ours exists in the reference, at the same place, with
  // the same JSON type; attribute values of the same kind
  const same = (ours, theirs, where) => {
    if (type(ours) !== type(theirs)) fail(`${where}: ${type(ours)} here, ${type(theirs)} in the official encoding`);
    if (type(ours) === "array") {
      if (where.endsWith(".attributes")) {
        for (const x of ours) {
          const t = theirs.find((y) => y.key === x.key);
          if (!t) fail(`${where}: ${x.key} is not in the official encoding`);
          same(x, t, `${where}[${x.key}]`);
        }
      } else if (ours.length > 0) {
        same(ours[0], theirs[0], where + "[0]");
      }
    } else if (type(ours) === "object") {
      for (const k of Object.keys(ours)) {
        if (!(k in theirs)) fail(`${where}.${k} is not in the official encoding`);
        same(ours[k], theirs[k], `${where}.${k}`);
      }
    }
  };
  const ourFirst = JSON.parse(exports[0].body);
  same(ourFirst.resourceSpans[0].resource, ref.resourceSpans[0].resource, "resource");
  same(ourFirst.resourceSpans[0].scopeSpans[0].scope, ref.resourceSpans[0].scopeSpans[0].scope, "scope");
  for (let i = 0; i < 2; i++) {
    const r = refSpans.find((x) => x.spanId !== undefined && x.name === [a, b][i].name &&
      (x.parentSpanId ?? null) === ([a, b][i].parentSpanId ?? null));
    if (!r) fail("no reference span for " + [a, b][i].name);
    same([a, b][i], r, `spans[${i}]`);
    if (r.traceId.length !== [a, b][i].traceId.length || r.kind !== [a, b][i].kind)
      fail(`spans[${i}]: ids or kind differ from the official encoding`);
  }
  console.log("ok: 2 spans (one in the client's trace, one a stop), every field " +
    "where and as the official OpenTelemetry JSON encoding has it");
  process.exit(0);
} catch (e) {
  fail(e.stack ?? String(e));
}
