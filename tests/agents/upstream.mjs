// tests/agents/upstream.mjs - the fake model API the real agent CLIs talk
// to through `agentguard proxy` (tests/agents/run.sh). One server speaks
// Chat Completions, Anthropic Messages, OpenAI Responses and the Gemini
// API, plain and streamed the way each real API streams.
//
// MODEL=loop: every reply asks for the same harmless tool call (CALL_NAME
// with CALL_ARGS, a JSON object), forever. MODEL=normal: the first reply of
// a conversation asks for that call, the reply after its result is the
// answer "All done." (a conversation is told by its tool results: none
// yet, ask; one or more, answer). A request that offers no tools (a title,
// a routing or a summary request) is answered with plain text - for
// Gemini's JSON-output requests, the JSON Gemini CLI's router expects.
//
// Listens on 127.0.0.1, port PORT (default: any free one). Prints "port N"
// on stdout once listening; appends one line per request
// (method, path, API, whether tools were offered) to LOG, and the body of
// each request that offers tools to DUMP, when they are set (agents.mjs
// keeps both in the agent's scratch folder: what the agent sent).
import { createServer } from "node:http";
import { appendFileSync } from "node:fs";

const MODE = process.env.MODEL ?? "loop";
const NAME = process.env.CALL_NAME ?? "read_file";
const ARGS = JSON.parse(process.env.CALL_ARGS ?? '{"path":"a.txt"}');
const LOG = process.env.LOG;
let n = 0;

// Whether the conversation already holds a tool result.
function answered(api, b) {
  const list = api === "gemini" ? b.contents ?? []
    : api === "responses" ? (Array.isArray(b.input) ? b.input : [])
    : b.messages ?? [];
  return list.some((m) =>
    m.role === "tool" ||
    m.type === "function_call_output" || m.type === "custom_tool_call_output" ||
    (Array.isArray(m.content) && m.content.some((c) => c.type === "tool_result")) ||
    (Array.isArray(m.parts) && m.parts.some((p) => p.functionResponse)));
}

function hasTools(api, b) {
  const t = b.tools;
  if (!Array.isArray(t) || t.length === 0) return false;
  if (api === "gemini")
    return t.some((x) => (x.functionDeclarations ?? []).length > 0);
  return true;
}

const sse = (res) => res.setHeader("content-type", "text/event-stream");
const json = (res, o) => {
  res.setHeader("content-type", "application/json");
  res.end(JSON.stringify(o));
};

function chat(res, b, text, call) {
  const id = "chatcmpl-" + n;
  const tc = call && { id: "call_" + n, type: "function",
    function: { name: NAME, arguments: JSON.stringify(ARGS) } };
  const usage = { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 };
  if (!b.stream)
    return json(res, { id, object: "chat.completion", created: 1, model: "fake",
      choices: [{ index: 0, finish_reason: tc ? "tool_calls" : "stop",
        message: { role: "assistant", content: text,
          ...(tc ? { tool_calls: [tc] } : {}) } }], usage });
  sse(res);
  const chunk = (delta, finish, u) => "data: " + JSON.stringify({ id,
    object: "chat.completion.chunk", created: 1, model: "fake",
    choices: [{ index: 0, delta, finish_reason: finish }],
    ...(u ? { usage: u } : {}) }) + "\n\n";
  res.write(chunk({ role: "assistant", content: text ?? "" }, null));
  if (tc) res.write(chunk({ tool_calls: [{ index: 0, ...tc }] }, null));
  res.write(chunk({}, tc ? "tool_calls" : "stop"));
  res.end(chunk({}, null, usage).replace('"choices":[{"index":0,"delta":{},' +
    '"finish_reason":null}]', '"choices":[]') + "data: [DONE]\n\n");
}

function messages(res, b, text, call) {
  const id = "toolu_" + n;
  const content = [{ type: "text", text }];
  if (call) content.push({ type: "tool_use", id, name: NAME, input: ARGS });
  const stop = call ? "tool_use" : "end_turn";
  if (!b.stream)
    return json(res, { id: "msg_" + n, type: "message", role: "assistant",
      model: b.model, content, stop_reason: stop, stop_sequence: null,
      usage: { input_tokens: 10, output_tokens: 5 } });
  sse(res);
  const ev = (o) => `event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`;
  res.write(ev({ type: "message_start", message: { id: "msg_" + n,
    type: "message", role: "assistant", model: b.model, content: [],
    stop_reason: null, stop_sequence: null,
    usage: { input_tokens: 10, output_tokens: 1 } } }));
  res.write(ev({ type: "content_block_start", index: 0,
    content_block: { type: "text", text: "" } }));
  res.write(ev({ type: "content_block_delta", index: 0,
    delta: { type: "text_delta", text } }));
  res.write(ev({ type: "content_block_stop", index: 0 }));
  if (call) {
    res.write(ev({ type: "content_block_start", index: 1,
      content_block: { type: "tool_use", id, name: NAME, input: {} } }));
    res.write(ev({ type: "content_block_delta", index: 1,
      delta: { type: "input_json_delta", partial_json: JSON.stringify(ARGS) } }));
    res.write(ev({ type: "content_block_stop", index: 1 }));
  }
  res.write(ev({ type: "message_delta", delta: { stop_reason: stop,
    stop_sequence: null }, usage: { output_tokens: 9 } }));
  res.end(ev({ type: "message_stop" }));
}

function responses(res, b, text, call) {
  const msg = { type: "message", id: "msg_" + n, status: "completed",
    role: "assistant", content: [{ type: "output_text", text,
      annotations: [] }] };
  const fc = call && { type: "function_call", id: "fc_" + n,
    call_id: "call_" + n, name: NAME, arguments: JSON.stringify(ARGS),
    status: "completed" };
  const output = fc ? [msg, fc] : [msg];
  const response = (status, out) => ({ id: "resp_" + n, object: "response",
    created_at: 1, status, model: "fake", output: out, error: null,
    incomplete_details: null, instructions: null, parallel_tool_calls: true,
    tool_choice: "auto", tools: [],
    usage: { input_tokens: 10, output_tokens: 5, total_tokens: 15,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens_details: { reasoning_tokens: 0 } } });
  if (!b.stream) return json(res, response("completed", output));
  sse(res);
  let seq = 0;
  const ev = (o) => `event: ${o.type}\ndata: ${JSON.stringify(
    { ...o, sequence_number: seq++ })}\n\n`;
  res.write(ev({ type: "response.created", response: response("in_progress", []) }));
  res.write(ev({ type: "response.output_item.added", output_index: 0,
    item: { ...msg, status: "in_progress", content: [] } }));
  res.write(ev({ type: "response.content_part.added", item_id: msg.id,
    output_index: 0, content_index: 0,
    part: { type: "output_text", text: "", annotations: [] } }));
  res.write(ev({ type: "response.output_text.delta", item_id: msg.id,
    output_index: 0, content_index: 0, delta: text }));
  res.write(ev({ type: "response.output_text.done", item_id: msg.id,
    output_index: 0, content_index: 0, text }));
  res.write(ev({ type: "response.content_part.done", item_id: msg.id,
    output_index: 0, content_index: 0, part: msg.content[0] }));
  res.write(ev({ type: "response.output_item.done", output_index: 0, item: msg }));
  if (fc) {
    res.write(ev({ type: "response.output_item.added", output_index: 1,
      item: { ...fc, arguments: "", status: "in_progress" } }));
    res.write(ev({ type: "response.function_call_arguments.delta",
      item_id: fc.id, output_index: 1, delta: fc.arguments }));
    res.write(ev({ type: "response.function_call_arguments.done",
      item_id: fc.id, output_index: 1, arguments: fc.arguments }));
    res.write(ev({ type: "response.output_item.done", output_index: 1, item: fc }));
  }
  res.end(ev({ type: "response.completed", response: response("completed", output) }));
}

function gemini(res, url, text, call) {
  const chunk = (parts, finish) => ({ candidates: [{ content: { role: "model",
    parts }, index: 0, ...(finish ? { finishReason: "STOP" } : {}) }],
    usageMetadata: { promptTokenCount: 10, candidatesTokenCount: 5,
      totalTokenCount: 15 }, modelVersion: "fake", responseId: "r" + n });
  const parts = [{ text }];
  if (call) parts.push({ functionCall: { name: NAME, args: ARGS } });
  if (!url.includes(":streamGenerateContent"))
    return json(res, chunk(parts, true));
  if (url.includes("alt=sse")) {
    sse(res);
    res.write(`data: ${JSON.stringify(chunk([{ text }], false))}\r\n\r\n`);
    return res.end(`data: ${JSON.stringify(chunk(parts.slice(1).length ?
      parts.slice(1) : [{ text: "" }], true))}\r\n\r\n`);
  }
  json(res, [chunk(parts, true)]);
}

const server = createServer((req, res) => {
  let body = "";
  req.on("data", (c) => (body += c));
  req.on("end", () => {
    n++;
    const url = req.url;
    const api = url.includes("/messages") ? "messages"
      : url.includes("/responses") ? "responses"
      : url.includes(":generateContent") || url.includes(":streamGenerateContent")
        ? "gemini"
      : url.includes("/chat/completions") ? "chat" : "other";
    let b = {};
    try { b = body ? JSON.parse(body) : {}; } catch { b = {}; }
    const tools = api !== "other" && hasTools(api, b);
    if (LOG) appendFileSync(LOG, `${req.method} ${url} ${api} tools=${tools}\n`);
    if (process.env.DUMP && tools) appendFileSync(process.env.DUMP, body + "\n");
    if (url.includes("/count_tokens"))
      return json(res, { input_tokens: 10 });
    if (api === "other") {
      if (url.includes("/models"))
        return json(res, { object: "list", data: [{ id: "fake",
          object: "model", created: 1, owned_by: "fake" }], models: [] });
      res.statusCode = 404;
      return json(res, { error: { message: "not found: " + url } });
    }
    const call = tools && (MODE === "loop" || !answered(api, b));
    let text = call ? "Let me look." : "All done.";
    if (!tools && api === "gemini" && b.generationConfig?.responseMimeType ===
        "application/json")
      text = JSON.stringify({ reasoning: "simple", model_choice: "flash",
        next_speaker: "user" });
    if (api === "chat") return chat(res, b, text, call);
    if (api === "messages") return messages(res, b, text, call);
    if (api === "responses") return responses(res, b, text, call);
    return gemini(res, url, text, call);
  });
});
server.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () =>
  console.log("port " + server.address().port));
