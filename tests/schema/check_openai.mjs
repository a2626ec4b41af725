// tests/schema/check_openai.mjs - validates what the OpenAI provider sends and
// what the fake server answers against OpenAI's own schemas
// (../shared/data/api/chat_completions.openapi.json):
//   - every request body the fake server received (openai-*.json in
//     REQUESTS_DIR) against CreateChatCompletionRequest;
//   - tests/fixtures/openai/chat_*.json against CreateChatCompletionResponse;
//   - every chunk of tests/fixtures/openai/stream_*.sse against
//     CreateChatCompletionStreamResponse (fault_* fixtures are deliberately
//     not what the API sends).
// The file is OpenAPI 3.1 (JSON Schema 2020-12) with OpenAPI 3.0's
// `nullable` mixed in: `nullable: true` is read as "null is allowed too".
//
// Usage: node check_openai.mjs SPEC REQUESTS_DIR FIXTURES_DIR
// Exit 0: all valid; 1: something is invalid (each error printed).
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { createRequire } from "node:module";

const require = createRequire(process.env.AJV_PREFIX + "/node_modules/");
const Ajv2020 = require("ajv/dist/2020").default;

const [spec, reqDir, fixDir] = process.argv.slice(2);
const doc = JSON.parse(readFileSync(spec, "utf8"));

function nullable(node) {
  if (Array.isArray(node)) return node.map(nullable);
  if (node === null || typeof node !== "object") return node;
  const out = {};
  for (const [k, v] of Object.entries(node)) out[k] = nullable(v);
  if (out.nullable === true) {
    delete out.nullable;
    if (Array.isArray(out.enum) && !out.enum.includes(null))
      out.enum = [...out.enum, null];
    if (typeof out.type === "string") out.type = [out.type, "null"];
    else if (Array.isArray(out.type)) {
      if (!out.type.includes("null")) out.type = [...out.type, "null"];
    } else return { anyOf: [out, { type: "null" }] };
  } else if (out.nullable === false) delete out.nullable;
  return out;
}

const schemas = nullable(doc.components.schemas);
const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
ajv.addSchema({ $id: "openai", components: { schemas } });
const check = (name) => ajv.getSchema(`openai#/components/schemas/${name}`);
const request = check("CreateChatCompletionRequest");
const response = check("CreateChatCompletionResponse");
const chunk = check("CreateChatCompletionStreamResponse");

let bad = 0, good = 0;
function validate(v, what, value) {
  if (v(value)) { good++; return; }
  bad++;
  console.log(`INVALID ${what}:`);
  for (const e of v.errors.slice(0, 8))
    console.log(`  ${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params)}`);
}

const reqs = readdirSync(reqDir).filter((f) => f.startsWith("openai-") && f.endsWith(".json"));
if (reqs.length === 0) {
  console.log(`no request bodies in ${reqDir}: run test_http_provider first`);
  process.exit(1);
}
for (const f of reqs)
  validate(request, `request ${f}`, JSON.parse(readFileSync(join(reqDir, f), "utf8")));

const odir = join(fixDir, "openai");
for (const f of readdirSync(odir)) {
  if (f.startsWith("chat_") && f.endsWith(".json"))
    validate(response, `response fixture ${f}`, JSON.parse(readFileSync(join(odir, f), "utf8")));
  if (f.startsWith("stream_") && f.endsWith(".sse")) {
    const lines = readFileSync(join(odir, f), "utf8").split("\n");
    lines.forEach((l, i) => {
      if (!l.startsWith("data: ") || l === "data: [DONE]") return;
      validate(chunk, `chunk fixture ${f}:${i + 1}`, JSON.parse(l.slice(6)));
    });
  }
}
console.log(`${good} valid, ${bad} invalid (${reqs.length} requests the client sent)`);
process.exit(bad === 0 ? 0 : 1);
