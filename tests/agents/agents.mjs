// tests/agents/agents.mjs AGENTGUARD PREFIX AGENT MODEL SCRATCH - one real
// agent CLI, headless in a scratch directory, against `agentguard proxy` in
// front of the fake model API (upstream.mjs). MODEL loop: the model asks
// for the same harmless call forever; the proxy must stop it and the agent
// must exit by itself (status 0) showing the stop message. MODEL normal: one
// call, then the answer "All done."; the run must end with that answer and
// the proxy must stop nothing. Each agent's quirks (settings files,
// telemetry, trust prompts, its key and base URL variables) are in AGENTS
// below; docs/proxy.md gives the same recipes. Prints one line "ok ...:
// N model requests" and exits 0, or "FAIL: ..." and exits 1.
import { spawn } from "node:child_process";
import { mkdirSync, writeFileSync, readFileSync, existsSync, rmSync } from
  "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const [bin, prefix, agent, model, scratch] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const KEY = "sk-agentguard-test";
const TASK = "List the files in this directory.";

function fail(msg) {
  console.error(`FAIL (${agent} ${model}): ${msg}`);
  process.exit(1);
}

const tool = (name) => path.join(prefix, "node_modules", ".bin", name);
const write = (file, text) => {
  mkdirSync(path.dirname(file), { recursive: true });
  writeFileSync(file, text);
};

// Per agent: the API its requests go to through the proxy (the proxy's
// upstream path), the harmless call the fake model asks for, and how to
// start it against `base` (the proxy's root URL).
const AGENTS = {
  gemini: {
    call: ["list_directory", { dir_path: "." }],
    run: (base, home, work) => {
      write(path.join(home, ".gemini", "settings.json"), JSON.stringify({
        security: { auth: { selectedType: "gemini-api-key" } },
        telemetry: { enabled: false },
        privacy: { usageStatisticsEnabled: false },
        general: { disableAutoUpdate: true, disableUpdateNag: true } }));
      return { cmd: tool("gemini"), args: ["-p", TASK], env: {
        GEMINI_API_KEY: KEY, GOOGLE_GEMINI_BASE_URL: base,
        GEMINI_CLI_TRUST_WORKSPACE: "true" } };
    },
  },
  claude: {
    call: (work) => ["Read", { file_path: path.join(work, "a.txt") }],
    run: (base) => ({ cmd: tool("claude"),
      args: ["-p", TASK, "--output-format", "text"], env: {
        ANTHROPIC_BASE_URL: base, ANTHROPIC_API_KEY: KEY,
        DISABLE_TELEMETRY: "1", DISABLE_AUTOUPDATER: "1",
        DISABLE_ERROR_REPORTING: "1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1" } }),
  },
  codex: {
    call: ["exec_command", { cmd: "cat a.txt" }],
    run: (base, home) => {
      write(path.join(home, ".codex", "config.toml"), [
        'model = "fake"', 'model_provider = "agproxy"',
        "[model_providers.agproxy]", 'name = "agproxy"',
        `base_url = "${base}/v1"`, 'wire_api = "responses"',
        'env_key = "AGPROXY_KEY"', ""].join("\n"));
      return { cmd: tool("codex"),
        args: ["exec", "--skip-git-repo-check", TASK], env: {
          CODEX_HOME: path.join(home, ".codex"), AGPROXY_KEY: KEY } };
    },
  },
  qwen: {
    call: (work) => ["read_file", { file_path: path.join(work, "a.txt") }],
    run: (base, home) => {
      write(path.join(home, ".qwen", "settings.json"), JSON.stringify({
        security: { auth: { selectedType: "openai" } },
        telemetry: { enabled: false },
        privacy: { usageStatisticsEnabled: false },
        general: { disableAutoUpdate: true } }));
      return { cmd: tool("qwen"), args: ["-p", TASK], env: {
        OPENAI_API_KEY: KEY, OPENAI_BASE_URL: `${base}/v1`,
        OPENAI_MODEL: "fake" } };
    },
  },
  opencode: {
    call: (work) => ["read", { filePath: path.join(work, "a.txt") }],
    run: (base, home, work) => {
      write(path.join(work, "opencode.json"), JSON.stringify({
        $schema: "https://opencode.ai/config.json",
        autoupdate: false, share: "disabled",
        provider: { agproxy: { npm: "@ai-sdk/openai-compatible",
          name: "agproxy", options: { baseURL: `${base}/v1`, apiKey: KEY },
          models: { fake: { name: "fake" } } } } }));
      return { cmd: tool("opencode"),
        args: ["run", "--model", "agproxy/fake", TASK], env: {
          OPENCODE_DISABLE_AUTOUPDATE: "1" } };
    },
  },
};

// Continue's CLI (cn): a config file naming the proxy as an OpenAI
// provider; --auto lets its tools run headless.
AGENTS.cn = {
  call: ["Read", { filepath: "a.txt" }],
  run: (base, home) => {
    write(path.join(home, "cn.yaml"), [
      "name: agproxy", "version: 1.0.0", "schema: v1", "models:",
      "  - name: fake", "    provider: openai", "    model: fake",
      `    apiBase: ${base}/v1`, `    apiKey: ${KEY}`,
      "    roles: [chat, edit, apply]", ""].join("\n"));
    return { cmd: tool("cn"), args: ["-p", TASK, "--config",
      path.join(home, "cn.yaml"), "--auto"], env: {} };
  },
};
// Cline's CLI: `cline auth` stores an OpenAI-compatible provider (in the
// scratch HOME), then the task runs headless with its tools approved.
AGENTS.cline = {
  call: (work) => ["read_files",
    { files: [{ path: path.join(work, "a.txt") }] }],
  run: (base) => ({ cmd: "sh", args: ["-c",
    '"$CLINE" auth -p openai -k "$KEY" -m fake -b "$BASE" >/dev/null && ' +
    'exec "$CLINE" "$TASK"'], env: {
    CLINE: tool("cline"), KEY, TASK, BASE: `${base}/v1` } }),
};
// Grok CLI: its base URL and key variables (Chat Completions).
AGENTS.grok = {
  call: ["view_file", { path: "a.txt" }],
  run: (base) => ({ cmd: tool("grok"), args: ["-p", TASK], env: {
    GROK_API_KEY: KEY, GROK_BASE_URL: `${base}/v1`, GROK_MODEL: "fake" } }),
};
// GitHub Copilot CLI with a provider of one's own (BYOK: no GitHub sign-in),
// once per API it speaks: Chat Completions, Responses, Anthropic Messages.
for (const [suffix, type, wire, sub] of [
  ["chat", "openai", "completions", "/v1"],
  ["responses", "openai", "responses", "/v1"],
  ["anthropic", "anthropic", "", ""]]) {
  AGENTS["copilot-" + suffix] = {
    call: ["view", { path: "a.txt" }],
    run: (base) => ({ cmd: tool("copilot"), args: ["-p", TASK,
      "--allow-all-tools", "--disable-client-telemetry"], env: {
      COPILOT_PROVIDER_BASE_URL: base + sub, COPILOT_PROVIDER_TYPE: type,
      ...(wire ? { COPILOT_PROVIDER_WIRE_API: wire } : {}),
      COPILOT_PROVIDER_API_KEY: KEY, COPILOT_MODEL: "fake" } }),
  };
}
// pi (pi-coding-agent), once per API it speaks: a provider in
// ~/.pi/agent/models.json whose base URL is the proxy.
for (const [suffix, api, sub] of [["chat", "openai-completions", "/v1"],
  ["responses", "openai-responses", "/v1"],
  ["anthropic", "anthropic-messages", ""],
  ["google", "google-generative-ai", "/v1beta"]]) {
  AGENTS["pi-" + suffix] = {
    call: ["read", { path: "a.txt" }],
    run: (base, home) => {
      write(path.join(home, ".pi", "agent", "models.json"), JSON.stringify({
        providers: { agproxy: { baseUrl: base + sub, api, apiKey: KEY,
          models: [{ id: "fake" }] } } }));
      return { cmd: tool("pi"), args: ["-p", TASK, "--provider", "agproxy",
        "--model", "fake"], env: {} };
    },
  };
}

const spec = AGENTS[agent];
if (!spec) fail("unknown agent " + agent);
rmSync(scratch, { recursive: true, force: true });
const home = path.join(scratch, "home"), work = path.join(scratch, "work");
mkdirSync(home, { recursive: true });
mkdirSync(work, { recursive: true });
writeFileSync(path.join(work, "a.txt"), "hello\n");
const upLog = path.join(scratch, "upstream.log");
const events = path.join(scratch, "events.jsonl");

// Starts a child and resolves with the first match of `re` in its output.
function started(child, stream, re, what) {
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`${what}: no start: ${out}`)),
      15000);
    child[stream].on("data", (c) => {
      out += c;
      const m = re.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.on("exit", (code) => reject(new Error(`${what} exited ${code}: ${out}`)));
  });
}

const call = typeof spec.call === "function" ? spec.call(work) : spec.call;
const upstream = spawn(process.execPath, [path.join(here, "upstream.mjs")], {
  env: { ...process.env, MODEL: model, CALL_NAME: call[0],
    CALL_ARGS: JSON.stringify(call[1]), LOG: upLog,
    DUMP: path.join(scratch, "requests.jsonl") },
  stdio: ["ignore", "pipe", "inherit"] });
let proxy, child;
const cleanup = () => {
  for (const c of [child, proxy, upstream])
    if (c && c.exitCode === null) c.kill("SIGKILL");
};
process.on("exit", cleanup);
try {
  const upPort = await started(upstream, "stdout", /port (\d+)/, "upstream");
  proxy = spawn(bin, ["proxy", "--listen", "127.0.0.1:0", "--upstream",
    `http://127.0.0.1:${upPort}`, "--events", events],
  { stdio: ["ignore", "ignore", "pipe"] });
  const pxPort = await started(proxy, "stderr",
    /listening on http:\/\/127\.0\.0\.1:(\d+)/, "proxy");
  const base = `http://127.0.0.1:${pxPort}`;
  const { cmd, args, env } = spec.run(base, home, work);
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) =>
    !/^(OPENAI|ANTHROPIC|GEMINI|GOOGLE|CODEX|QWEN|CLAUDE|OPENCODE|COPILOT|GROK)/
      .test(k)));
  let out = "", err = "";
  child = spawn(cmd, args, { cwd: work, stdio: ["ignore", "pipe", "pipe"],
    env: { ...clean, HOME: home, PWD: work, CI: "1", NO_COLOR: "1", TERM: "dumb",
      ...env } });
  child.stdout.on("data", (c) => (out += c));
  child.stderr.on("data", (c) => (err += c));
  const code = await new Promise((resolve) => {
    const timer = setTimeout(() => { child.kill("SIGKILL"); resolve("timeout"); },
      150000);
    child.on("exit", (c) => { clearTimeout(timer); resolve(c); });
  });
  const log = existsSync(upLog) ? readFileSync(upLog, "utf8") : "";
  const modelReqs = log.split("\n").filter((l) => / tools=true$/.test(l)).length;
  const evs = existsSync(events) ? readFileSync(events, "utf8").trim()
    .split("\n").filter(Boolean).map((l) => JSON.parse(l)) : [];
  const stops = evs.filter((e) => e.action === "stop");
  const shown = (out + "\n" + err).replace(/\s+/g, " ").slice(-1500);
  if (code !== 0) fail(`exit ${code}: ${shown}`);
  if (model === "loop") {
    if (stops.length === 0)
      fail(`the proxy did not stop it (${modelReqs} model requests): ${shown}`);
    if (!/agentguard stopped this turn/.test(out + err))
      fail(`the stop message was not shown: ${shown}`);
    console.log(`ok ${agent} loop: stopped (${stops[0].reason}, ` +
      `${stops[0].decision}) at model request ${modelReqs + 1 -
        (stops[0].decision === "reply_replaced" ? 1 : 0)}, exit 0`);
  } else {
    if (stops.length > 0)
      fail(`the proxy stopped a normal run: ${JSON.stringify(stops[0])}`);
    if (!/All done\./.test(out + err))
      fail(`the answer was not shown: ${shown}`);
    console.log(`ok ${agent} normal: answered after ${modelReqs} model ` +
      "requests, nothing stopped, exit 0");
  }
} catch (e) {
  fail(e.stack ?? String(e));
}
process.exit(0);
