// tests/proxy/clients.mjs AGENTGUARD PREFIX MODE - a tool loop through
// `agentguard proxy`, written the way the clients' docs write it. MODE:
//   plain   the official `openai` package, chat.completions.create
//   stream  the same with stream: true, tool calls gathered from the chunks
//   agents  the OpenAI Agents SDK (@openai/agents) running its own loop
//           over Chat Completions with a read_file tool
//   anthropic, anthropic-stream  the official @anthropic-ai/sdk against
//           /v1/messages (streaming: messages.stream and finalMessage)
//   responses, responses-stream  the `openai` package's responses.create
//           against /v1/responses, the conversation in `input` (store false)
//   agents-responses  the Agents SDK on its default API (Responses)
//   responses-stored  the `openai` package's responses.create with
//           store: true, each request only its newest items and the
//           previous_response_id: the proxy reads the chain back (GET
//           /v1/responses/{id}/input_items and /v1/responses/{id})
//   agents-conversation  the Agents SDK's loop with a conversationId: the
//           upstream keeps the conversation (GET
//           /v1/conversations/{id}/items)
//   gemini, gemini-stream  the official @google/genai package's
//           models.generateContent / generateContentStream against
//           /v1beta/models/fake:generateContent (streamed: ?alt=sse)
//   gemini-vertex, gemini-vertex-stream  the same on Vertex AI (express
//           mode, an API key): /v1beta1/publishers/google/models/fake:...
//   anthropic-vertex, anthropic-vertex-stream  @anthropic-ai/vertex-sdk's
//           AnthropicVertex (its auth client given):
//           /v1/projects/p1/locations/us-east5/publishers/anthropic/models/
//           fake:rawPredict and :streamRawPredict
//   ollama, ollama-stream  the official `ollama` package's chat against
//           Ollama's own /api/chat (stream: false, and its default stream
//           of JSON lines)
//   azure, azure-stream  the `openai` package's AzureOpenAI client:
//           /openai/deployments/fake/chat/completions?api-version=...,
//           its key in an api-key header
// The fake upstream's model asks for read_file({"path":"a.txt"}) on every
// request; the proxy must end the loop: the client gets an ordinary reply
// without tool calls whose text says why (and, plain, the header
// x-agentguard-stop). Exits 0 on success, 1 with a message otherwise.
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import path from "node:path";

const [bin, prefix, mode = "plain"] = process.argv.slice(2);
const require = createRequire(path.resolve(prefix, "node_modules", "x.js"));
const OpenAI = mode.startsWith("anthropic") || mode.startsWith("gemini") ||
  mode.startsWith("ollama")
  ? null : (require("openai").default ?? require("openai"));
const STOP = mode.includes("responses") || mode === "agents-conversation" ||
  mode.startsWith("gemini")
  ? /agentguard stopped this turn \((identical_calls|repeated_results)\)/
  : /agentguard stopped this turn \(identical_calls\)/;

function fail(msg) {
  console.error("FAIL: " + msg);
  process.exit(1);
}

/* What the fake upstream keeps (store: true, conversations), as the
 * Responses API keeps it: a response's input items (for a chained one, the
 * chain's earlier items too) and its output; a conversation's items. */
const storedResponses = new Map();
const conversations = new Map();
let storedReads = 0;
function listPage(res, items, url) {
  const q = new URL(url, "http://x").searchParams;
  const all = q.get("order") === "asc" ? items : [...items].reverse();
  const after = q.get("after");
  const from = after ? all.findIndex((i) => i.id === after) + 1 : 0;
  const data = all.slice(from, from + Number(q.get("limit") ?? 20));
  res.setHeader("content-type", "application/json");
  res.end(JSON.stringify({ object: "list", data,
    first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null,
    has_more: from + data.length < all.length }));
}
function withIds(items, tag) {
  return items.map((it, k) => ({ id: `${tag}_${k}`, ...(it.role && !it.type
    ? { type: "message" } : {}), ...it }));
}

let upstreamRequests = 0;
const upstream = createServer((req, res) => {
  let body = "";
  req.on("data", (c) => (body += c));
  req.on("end", () => {
    upstreamRequests++;
    if (req.method === "GET") {
      storedReads++;
      if (req.headers.authorization !== "Bearer sk-node-test")
        fail("the client's key did not reach the stored conversation's read");
      const path = req.url.split("?")[0];
      let m = /^\/v1\/responses\/([^/]+)\/input_items$/.exec(path);
      if (m && storedResponses.has(m[1]))
        return listPage(res, storedResponses.get(m[1]).inputs, req.url);
      m = /^\/v1\/responses\/([^/]+)$/.exec(path);
      if (m && storedResponses.has(m[1])) {
        const r = storedResponses.get(m[1]);
        res.setHeader("content-type", "application/json");
        return res.end(JSON.stringify({ id: m[1], object: "response",
          status: "completed", output: r.output,
          previous_response_id: r.prev ?? null }));
      }
      m = /^\/v1\/conversations\/([^/]+)\/items$/.exec(path);
      if (m && conversations.has(m[1]))
        return listPage(res, conversations.get(m[1]), req.url);
      res.statusCode = 404;
      return res.end(JSON.stringify({ error: { message: "not found: " +
        req.url } }));
    }
    if (req.headers.authorization !== "Bearer sk-node-test" &&
        req.headers["x-api-key"] !== "sk-node-test" &&
        req.headers["x-goog-api-key"] !== "sk-node-test" &&
        req.headers["api-key"] !== "sk-node-test")
      fail("the client's key did not reach the upstream as it came");
    if (mode.startsWith("anthropic-vertex") &&
        !/^\/v1\/projects\/p1\/locations\/us-east5\/publishers\/anthropic\/models\/fake:(stream)?[rR]awPredict$/
          .test(req.url))
      fail("the Vertex path did not reach the upstream as it came: " + req.url);
    if (mode.startsWith("gemini-vertex") &&
        !req.url.startsWith("/v1/v1beta1/publishers/google/models/fake:"))
      fail("the Vertex path did not reach the upstream as it came: " + req.url);
    if (mode.startsWith("azure") &&
        !/^\/v1\/openai\/deployments\/fake\/chat\/completions\?api-version=2024-10-21$/
          .test(req.url))
      fail("the Azure path did not reach the upstream as it came: " + req.url);
    if (req.url.endsWith("/api/chat")) {
      const sent = JSON.parse(body);
      const line = (message, done) => JSON.stringify({ model: "fake",
        created_at: "2026-11-29T10:00:00Z", message, done,
        ...(done ? { done_reason: "stop", prompt_eval_count: 10,
          eval_count: 5 } : {}) }) + "\n";
      const call = { role: "assistant", content: "", tool_calls: [{
        function: { name: "read_file", arguments: { path: "a.txt" } } }] };
      if (sent.stream === false) {
        res.setHeader("content-type", "application/json");
        res.end(line(call, true));
        return;
      }
      res.setHeader("content-type", "application/x-ndjson");
      res.write(line({ role: "assistant", content: "Reading. " }, false));
      res.write(line(call, false));
      res.end(line({ role: "assistant", content: "" }, true));
      return;
    }
    if (req.url.includes(":generateContent") ||
        req.url.includes(":streamGenerateContent")) {
      const chunk = (parts, finish) => ({ candidates: [{ content: {
        role: "model", parts }, index: 0,
        ...(finish ? { finishReason: "STOP" } : {}) }],
        usageMetadata: { promptTokenCount: 10, candidatesTokenCount: 5,
          totalTokenCount: 15 }, modelVersion: "fake" });
      const call = { functionCall: { name: "read_file",
        args: { path: "a.txt" } } };
      if (req.url.includes(":streamGenerateContent")) {
        if (!req.url.includes("alt=sse")) fail("a stream without alt=sse");
        res.setHeader("content-type", "text/event-stream");
        res.write(`data: ${JSON.stringify(chunk([{ text: "Reading. " }]))}` +
          "\r\n\r\n");
        res.end(`data: ${JSON.stringify(chunk([call], true))}\r\n\r\n`);
        return;
      }
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(chunk([call], true)));
      return;
    }
    if (req.url.endsWith("/messages") || /:(stream)?[rR]awPredict$/.test(req.url)) {
      const id = "toolu_" + upstreamRequests;
      if (JSON.parse(body).stream) {
        res.setHeader("content-type", "text/event-stream");
        const ev = (o) => `event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`;
        res.write(ev({ type: "message_start", message: { id: "msg_" +
          upstreamRequests, type: "message", role: "assistant", model: "fake",
          content: [], stop_reason: null, stop_sequence: null,
          usage: { input_tokens: 10, output_tokens: 1 } } }));
        res.write(ev({ type: "content_block_start", index: 0,
          content_block: { type: "text", text: "" } }));
        res.write(ev({ type: "content_block_delta", index: 0,
          delta: { type: "text_delta", text: "Reading. " } }));
        res.write(ev({ type: "content_block_stop", index: 0 }));
        res.write(ev({ type: "content_block_start", index: 1,
          content_block: { type: "tool_use", id, name: "read_file", input: {} } }));
        res.write(ev({ type: "content_block_delta", index: 1,
          delta: { type: "input_json_delta", partial_json: '{"path":' } }));
        res.write(ev({ type: "content_block_delta", index: 1,
          delta: { type: "input_json_delta", partial_json: '"a.txt"}' } }));
        res.write(ev({ type: "content_block_stop", index: 1 }));
        res.write(ev({ type: "message_delta", delta: { stop_reason: "tool_use",
          stop_sequence: null }, usage: { output_tokens: 9 } }));
        res.end(ev({ type: "message_stop" }));
        return;
      }
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify({ id: "msg_" + upstreamRequests, type: "message",
        role: "assistant", model: "fake", stop_reason: "tool_use",
        stop_sequence: null, usage: { input_tokens: 10, output_tokens: 5 },
        content: [{ type: "tool_use", id, name: "read_file",
          input: { path: "a.txt" } }] }));
      return;
    }
    if (req.url.endsWith("/responses")) {
      const item = { type: "function_call", id: "fc_" + upstreamRequests,
        call_id: "call_" + upstreamRequests, name: "read_file",
        arguments: '{"path":"a.txt"}', status: "completed" };
      const response = (status, output) => ({ id: "resp_" + upstreamRequests,
        object: "response", created_at: 1, status, model: "fake", output,
        error: null, incomplete_details: null, instructions: null,
        parallel_tool_calls: true, tool_choice: "auto", tools: [],
        usage: { input_tokens: 10, output_tokens: 5, total_tokens: 15,
          input_tokens_details: { cached_tokens: 0 },
          output_tokens_details: { reasoning_tokens: 0 } } });
      const sent = JSON.parse(body);
      const own = withIds(typeof sent.input === "string"
        ? [{ role: "user", content: sent.input }] : sent.input ?? [],
        "in" + upstreamRequests);
      const prev = storedResponses.get(sent.previous_response_id);
      if (sent.previous_response_id && !prev)
        fail("previous_response_id of no stored response");
      storedResponses.set("resp_" + upstreamRequests, {
        inputs: prev ? [...prev.inputs, ...prev.output, ...own] : own,
        output: [item], prev: sent.previous_response_id });
      const conv = sent.conversation?.id ?? sent.conversation;
      if (conv) {
        if (!conversations.has(conv)) conversations.set(conv, []);
        conversations.get(conv).push(...own, item);
      }
      if (sent.stream) {
        res.setHeader("content-type", "text/event-stream");
        let seq = 0;
        const ev = (o) => `event: ${o.type}\ndata: ${JSON.stringify(
          { ...o, sequence_number: seq++ })}\n\n`;
        res.write(ev({ type: "response.created",
          response: response("in_progress", []) }));
        res.write(ev({ type: "response.output_item.added", output_index: 0,
          item: { ...item, arguments: "", status: "in_progress" } }));
        res.write(ev({ type: "response.function_call_arguments.delta",
          item_id: item.id, output_index: 0, delta: '{"path":' }));
        res.write(ev({ type: "response.function_call_arguments.delta",
          item_id: item.id, output_index: 0, delta: '"a.txt"}' }));
        res.write(ev({ type: "response.function_call_arguments.done",
          item_id: item.id, output_index: 0, arguments: item.arguments }));
        res.write(ev({ type: "response.output_item.done", output_index: 0,
          item }));
        res.end(ev({ type: "response.completed",
          response: response("completed", [item]) }));
        return;
      }
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(response("completed", [item])));
      return;
    }
    const call = { id: "call_" + upstreamRequests, type: "function",
      function: { name: "read_file", arguments: '{"path":"a.txt"}' } };
    if (JSON.parse(body).stream) {
      res.setHeader("content-type", "text/event-stream");
      const chunk = (delta, finish) => "data: " + JSON.stringify({
        id: "chatcmpl-" + upstreamRequests, object: "chat.completion.chunk",
        created: 1, model: "fake",
        choices: [{ index: 0, delta, finish_reason: finish }] }) + "\n\n";
      res.write(chunk({ role: "assistant", content: "Reading. " }, null));
      res.write(chunk({ tool_calls: [{ index: 0, ...call }] }, null));
      res.end(chunk({}, "tool_calls") + "data: [DONE]\n\n");
      return;
    }
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

async function plainLoop(client, stream) {
  const tools = [{ type: "function", function: { name: "read_file",
    parameters: { type: "object", properties: { path: { type: "string" } } } } }];
  const messages = [{ role: "user", content: "Summarise a.txt" }];
  let steps = 0;
  while (steps++ < 20) {
    let msg, stop = null;
    if (stream) {
      const s = await client.chat.completions.create({ model: "fake",
        messages, tools, stream: true });
      msg = { role: "assistant", content: "", tool_calls: [] };
      for await (const ch of s) {
        const d = ch.choices[0]?.delta ?? {};
        if (d.content) msg.content += d.content;
        for (const tc of d.tool_calls ?? []) {
          const t = (msg.tool_calls[tc.index] ??= { id: "", type: "function",
            function: { name: "", arguments: "" } });
          if (tc.id) t.id = tc.id;
          if (tc.function?.name) t.function.name += tc.function.name;
          if (tc.function?.arguments) t.function.arguments += tc.function.arguments;
        }
      }
      if (msg.tool_calls.length === 0) delete msg.tool_calls;
    } else {
      const { data, response } = await client.chat.completions
        .create({ model: "fake", messages, tools }).withResponse();
      msg = data.choices[0].message;
      stop = response.headers.get("x-agentguard-stop");
    }
    messages.push(msg);
    if (!msg.tool_calls || msg.tool_calls.length === 0) {
      if (!stream && stop !== "identical_calls")
        fail("x-agentguard-stop: " + stop);
      return [msg.content, steps];
    }
    for (const tc of msg.tool_calls)
      messages.push({ role: "tool", tool_call_id: tc.id, content: "hello" });
  }
  fail("the loop was never stopped");
}

async function agentsLoop(baseURL) {
  const agents = require("@openai/agents");
  const { z } = require("zod");
  const AgentsOpenAI = require("openai").default ?? require("openai");
  agents.setDefaultOpenAIClient(new AgentsOpenAI({ apiKey: "sk-node-test",
    baseURL, maxRetries: 0 }));
  if (mode === "agents")
    agents.setOpenAIAPI("chat_completions"); /* else its default: Responses */
  agents.setTracingDisabled(true);
  let runs = 0;
  const readFile = agents.tool({ name: "read_file",
    description: "Read a file", parameters: z.object({ path: z.string() }),
    execute: async () => { runs++; return "hello"; } });
  const agent = new agents.Agent({ name: "reader", model: "fake",
    instructions: "Summarise files.", tools: [readFile] });
  const result = await agents.run(agent, "Summarise a.txt", { maxTurns: 30,
    ...(mode === "agents-conversation" ? { conversationId: "conv_1" } : {}) });
  return [result.finalOutput, runs + 1];
}

async function responsesLoop(client, stream, stored) {
  const tools = [{ type: "function", name: "read_file", strict: false,
    parameters: { type: "object", properties: { path: { type: "string" } } } }];
  let input = [{ role: "user", content: "Summarise a.txt" }];
  let steps = 0, previous;
  while (steps++ < 20) {
    /* stored: the upstream keeps the conversation; only the newest items
     * go with the last response's id */
    const params = stored
      ? { model: "fake", input, tools, store: true,
        ...(previous ? { previous_response_id: previous } : {}) }
      : { model: "fake", input, tools, store: false };
    let resp;
    if (stream) {
      let seq = -1;
      for await (const ev of await client.responses.create({ ...params,
        stream: true })) {
        if (ev.sequence_number !== seq + 1)
          fail(`sequence_number ${ev.sequence_number} after ${seq}`);
        seq = ev.sequence_number;
        if (ev.type === "response.completed") resp = ev.response;
      }
      if (!resp) fail("the stream ended without response.completed");
    } else {
      resp = await client.responses.create(params);
    }
    if (stored) {
      previous = resp.id;
      input = [];
    } else {
      input.push(...resp.output);
    }
    const calls = resp.output.filter((i) => i.type === "function_call");
    if (calls.length === 0)
      return [resp.output.filter((i) => i.type === "message")
        .flatMap((m) => m.content).map((p) => p.text ?? "").join(""), steps];
    for (const c of calls)
      input.push({ type: "function_call_output", call_id: c.call_id,
        output: "hello" });
  }
  fail("the loop was never stopped");
}

async function ollamaLoop(stream) {
  const { Ollama } = require("ollama");
  const ol = new Ollama({ host: `http://127.0.0.1:${proxyPort}`,
    headers: { Authorization: "Bearer sk-node-test" } });
  const tools = [{ type: "function", function: { name: "read_file",
    description: "Read a file", parameters: { type: "object",
      properties: { path: { type: "string" } } } } }];
  const messages = [{ role: "user", content: "Summarise a.txt" }];
  let steps = 0;
  while (steps++ < 20) {
    let msg;
    if (stream) {
      msg = { role: "assistant", content: "", tool_calls: [] };
      for await (const part of await ol.chat({ model: "fake", messages, tools,
        stream: true })) {
        msg.content += part.message?.content ?? "";
        msg.tool_calls.push(...(part.message?.tool_calls ?? []));
      }
    } else {
      msg = (await ol.chat({ model: "fake", messages, tools,
        stream: false })).message;
    }
    messages.push(msg);
    if (!msg.tool_calls || msg.tool_calls.length === 0)
      return [msg.content, steps];
    for (const tc of msg.tool_calls)
      messages.push({ role: "tool", content: "hello",
        tool_name: tc.function.name });
  }
  fail("the loop was never stopped");
}

async function geminiLoop(stream, vertexai) {
  const { GoogleGenAI } = require("@google/genai");
  const ai = new GoogleGenAI({ apiKey: "sk-node-test", vertexai,
    httpOptions: { baseUrl: `http://127.0.0.1:${proxyPort}` } });
  const config = { tools: [{ functionDeclarations: [{ name: "read_file",
    description: "Read a file", parametersJsonSchema: { type: "object",
      properties: { path: { type: "string" } } } }] }] };
  const contents = [{ role: "user", parts: [{ text: "Summarise a.txt" }] }];
  let steps = 0;
  while (steps++ < 20) {
    const params = { model: "fake", contents, config };
    let parts = [];
    if (stream) {
      for await (const ch of await ai.models.generateContentStream(params))
        parts.push(...(ch.candidates?.[0]?.content?.parts ?? []));
    } else {
      const resp = await ai.models.generateContent(params);
      parts = resp.candidates?.[0]?.content?.parts ?? [];
    }
    contents.push({ role: "model", parts });
    const calls = parts.filter((p) => p.functionCall);
    if (calls.length === 0)
      return [parts.map((p) => p.text ?? "").join(""), steps];
    contents.push({ role: "user", parts: calls.map((c) => ({
      functionResponse: { id: c.functionCall.id, name: c.functionCall.name,
        response: { output: "hello" } } })) });
  }
  fail("the loop was never stopped");
}

async function anthropicLoop(stream, vertex) {
  const sdk = require("@anthropic-ai/sdk");
  const Anthropic = sdk.default ?? sdk.Anthropic ?? sdk;
  /* on Vertex: an auth client as the SDK takes one (Google's own would
   * ask the metadata server for a token) */
  const client = vertex
    ? new (require("@anthropic-ai/vertex-sdk").AnthropicVertex)({
      region: "us-east5", projectId: "p1", maxRetries: 0,
      baseURL: `http://127.0.0.1:${proxyPort}/v1`,
      authClient: { projectId: "p1", getRequestHeaders: async () =>
        new Headers({ Authorization: "Bearer sk-node-test" }) } })
    : new Anthropic({ apiKey: "sk-node-test", maxRetries: 0,
      baseURL: `http://127.0.0.1:${proxyPort}` });
  const tools = [{ name: "read_file", description: "Read a file",
    input_schema: { type: "object", properties: { path: { type: "string" } } } }];
  const messages = [{ role: "user", content: "Summarise a.txt" }];
  let steps = 0;
  while (steps++ < 20) {
    const params = { model: "fake", max_tokens: 512, messages, tools };
    const msg = stream ? await client.messages.stream(params).finalMessage()
      : await client.messages.create(params);
    messages.push({ role: "assistant", content: msg.content });
    const uses = msg.content.filter((b) => b.type === "tool_use");
    if (uses.length === 0)
      return [msg.content.filter((b) => b.type === "text")
        .map((b) => b.text).join(""), steps];
    messages.push({ role: "user", content: uses.map((u) => ({
      type: "tool_result", tool_use_id: u.id, content: "hello" })) });
  }
  fail("the loop was never stopped");
}

try {
  const baseURL = `http://127.0.0.1:${proxyPort}/v1`;
  const client = mode.startsWith("azure")
    ? new (require("openai").AzureOpenAI)({ apiKey: "sk-node-test",
      endpoint: `http://127.0.0.1:${proxyPort}`, apiVersion: "2024-10-21",
      deployment: "fake", maxRetries: 0 })
    : OpenAI ? new OpenAI({ apiKey: "sk-node-test", baseURL,
      maxRetries: 0 }) : null;
  const [final, steps] = mode.startsWith("agents") ? await agentsLoop(baseURL)
    : mode.startsWith("responses")
      ? await responsesLoop(client, mode === "responses-stream",
        mode === "responses-stored")
    : mode.startsWith("anthropic")
      ? await anthropicLoop(mode.endsWith("-stream"), mode.includes("vertex"))
    : mode.startsWith("gemini")
      ? await geminiLoop(mode.endsWith("-stream"), mode.includes("vertex"))
    : mode.startsWith("ollama") ? await ollamaLoop(mode === "ollama-stream")
      : await plainLoop(client, mode === "stream" || mode === "azure-stream");
  if (typeof final !== "string" || !STOP.test(final))
    fail("final output: " + JSON.stringify(final));
  if ((mode === "responses-stored" || mode === "agents-conversation") &&
      storedReads === 0)
    fail("the proxy never read the stored conversation back");
  console.log(`ok (${mode}): stopped after ${steps} requests ` +
    `(${upstreamRequests} upstream): ${final}`);
} catch (e) {
  fail(e.stack ?? String(e));
} finally {
  proxy.kill("SIGTERM");
  upstream.close();
}
