// bench/gemini/bench.mjs - Gemini CLI's loop detector on the guard bench's
// call stream, for comparison with bench/bench_guard.c.
//
// usage: node bench/gemini/bench.mjs --prefix DIR --stream FILE
//                                    [--rounds N] [--warmup N]
//   DIR   the npm prefix where @google/gemini-cli-core is installed
//         (bench/run.sh installs it into bench/.gemini/)
//   FILE  JSON Lines written by `bench_guard --write-stream FILE`:
//         {"set":"64"|"1k","name":...,"args":{...}}
//
// What is timed: LoopDetectionService.addAndCheck() on one ToolCallRequest
// event per call, the event Gemini CLI's turn loop feeds it for every tool
// call the model asks for. That covers its signature (SHA-256 over
// name ":" JSON.stringify(args), hex) and its tool-call loop check (the last
// 25 keys: a block of 1..5 calls repeated 5 times). Its content-chanting
// detector only sees Content events and its LLM check only runs from
// turnStarted(); neither is reached by tool calls.
//
// The arguments are parsed to objects before timing: in Gemini CLI the SDK
// hands the detector `args` already parsed, while the guard is handed the
// JSON text and parses it itself. So this side is spared the parse.
//
// Method, as the C side: one pass = the whole stream after reset(promptId);
// warm-up passes (also for the JIT), then rounds of one pass each; the median
// ns/call over rounds is reported, for every stream ("set") in the file.
// bench/run.sh runs this and bench_guard in turn several times (C, Node, C,
// Node, ...) and reports the median and range over those runs. When the detector reports a loop it would
// keep answering "loop" cheaply until reset, so it is reset at once and the
// reset is counted, as the C side begins a new turn after a stop.
//
// Offline: it is constructed with a stub config that has only
// getDisableLoopDetection, getUsageStatisticsEnabled and getDebugMode (all
// false, so ClearcutLogger is never created); any other property it reads is
// an error. Sockets, DNS and fetch are disabled before the package loads;
// any attempt is an error too.

import { readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import net from 'node:net';
import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';

function fail(msg) {
  console.error(`gemini bench: error: ${msg}`);
  process.exit(1);
}

// ---- arguments ----
const opts = { prefix: null, stream: null, rounds: 15, warmup: 5 };
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = argv[i + 1];
    if (a === '--prefix' && v) opts.prefix = argv[++i];
    else if (a === '--stream' && v) opts.stream = argv[++i];
    else if (a === '--rounds' && v) opts.rounds = Number(argv[++i]);
    else if (a === '--warmup' && v) opts.warmup = Number(argv[++i]);
    else fail(`unknown argument ${a}; usage: bench.mjs --prefix DIR --stream FILE [--rounds N] [--warmup N]`);
  }
  if (!opts.prefix || !opts.stream) fail('--prefix DIR and --stream FILE are required');
  if (!(opts.rounds >= 1 && opts.warmup >= 0)) fail('bad --rounds/--warmup');
}

// ---- no network: any attempt fails the bench ----
const netAttempts = [];
function blocked(what) {
  return function () {
    netAttempts.push(what);
    throw new Error(`gemini bench: network disabled (${what})`);
  };
}
net.Socket.prototype.connect = blocked('net.Socket.connect');
net.connect = net.createConnection = blocked('net.connect');
dns.lookup = blocked('dns.lookup');
dns.promises.lookup = blocked('dns.promises.lookup');
http.request = http.get = blocked('http.request');
https.request = https.get = blocked('https.request');
globalThis.fetch = blocked('fetch');

// ---- load the package ----
const pkgDir = join(opts.prefix, 'node_modules', '@google', 'gemini-cli-core');
const pkgJson = join(pkgDir, 'package.json');
if (!existsSync(pkgJson)) fail(`@google/gemini-cli-core is not installed under ${opts.prefix}`);
const pkgVersion = JSON.parse(readFileSync(pkgJson, 'utf8')).version;

// LoopDetectionService is not re-exported from the package index, and the
// package has no "exports" map, so its module is imported directly (this
// also avoids loading the whole CLI core).
async function load(rel) {
  const file = join(pkgDir, rel);
  if (!existsSync(file)) fail(`${rel} not found in @google/gemini-cli-core ${pkgVersion}`);
  return import(pathToFileURL(file).href);
}
const { LoopDetectionService } = await load('dist/src/services/loopDetectionService.js');
const { GeminiEventType } = await load('dist/src/core/turn.js');
if (typeof LoopDetectionService !== 'function') fail('LoopDetectionService export not found');
if (!GeminiEventType || !GeminiEventType.ToolCallRequest) fail('GeminiEventType.ToolCallRequest not found');

// ---- the stub config ----
// Recent versions take an agent context and read `context.config`; older
// ones took the config itself. The stub serves both shapes and records any
// other property read, which would mean it is incomplete.
const unknownReads = new Set();
const stubMethods = {
  getDisableLoopDetection: () => false,
  getUsageStatisticsEnabled: () => false,
  getDebugMode: () => false,
};
function strict(target, name) {
  return new Proxy(target, {
    get(t, p) {
      if (p in t) return t[p];
      if (typeof p === 'symbol' || p === 'then' || p === 'toJSON') return undefined;
      unknownReads.add(`${name}.${String(p)}`);
      return undefined;
    },
  });
}
const config = strict({ ...stubMethods }, 'config');
const context = strict({ ...stubMethods, config }, 'context');

// ---- the stream ----
let lines;
try {
  lines = readFileSync(opts.stream, 'utf8').split('\n').filter((l) => l.length > 0);
} catch (e) {
  fail(`cannot read stream ${opts.stream}: ${e.message}`);
}
const sets = new Map();
for (const [i, line] of lines.entries()) {
  let rec;
  try {
    rec = JSON.parse(line);
  } catch (e) {
    fail(`stream line ${i + 1}: ${e.message}`);
  }
  if (!sets.has(rec.set)) sets.set(rec.set, []);
  const list = sets.get(rec.set);
  list.push({
    type: GeminiEventType.ToolCallRequest,
    value: {
      callId: `call-${rec.set}-${list.length}`,
      name: rec.name,
      args: rec.args,
      isClientInitiated: false,
      prompt_id: 'bench-prompt',
    },
  });
}
if (sets.size === 0) fail(`stream ${opts.stream} is empty`);

// ---- measure ----
const svc = new LoopDetectionService(context);
const promptId = 'bench-prompt';

function pass(events, counter) {
  const t0 = process.hrtime.bigint();
  svc.reset(promptId);
  for (let i = 0; i < events.length; i++) {
    const r = svc.addAndCheck(events[i]);
    if (r.count > 0) {
      counter.loops++;
      svc.reset(promptId);
    }
  }
  return Number(process.hrtime.bigint() - t0);
}

// Its signature alone (getToolCallKey: JSON.stringify + SHA-256 hex), to
// show where the time goes; not part of the comparison.
let keySink = 0;
function keyPass(events) {
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < events.length; i++) keySink += svc.getToolCallKey(events[i].value).length;
  return Number(process.hrtime.bigint() - t0);
}
const haveKey = typeof svc.getToolCallKey === 'function';

function median(v) {
  const s = [...v].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

console.log(
  `@google/gemini-cli-core ${pkgVersion} LoopDetectionService.addAndCheck ` +
    `(one ToolCallRequest event per call), node ${process.version}`,
);
console.log(`medians of ${opts.rounds} rounds after ${opts.warmup} warm-up passes`);
console.log(`gemini_version value=${pkgVersion}`);

for (const [label, events] of sets) {
  const warm = { loops: 0 };
  for (let i = 0; i < opts.warmup; i++) {
    pass(events, warm);
    if (haveKey) keyPass(events);
  }
  const counter = { loops: 0 };
  const per = [];
  const perKey = [];
  for (let i = 0; i < opts.rounds; i++) {
    per.push(pass(events, counter) / events.length);
    if (haveKey) perKey.push(keyPass(events) / events.length);
  }
  const med = median(per);
  const loopsPerPass = counter.loops / opts.rounds;
  console.log(`\nstream ${label}: ${events.length} calls`);
  console.log(
    `  gemini addAndCheck: ${med.toFixed(1).padStart(8)} ns/call ` +
      `(min ${Math.min(...per).toFixed(1)}, max ${Math.max(...per).toFixed(1)} over ${opts.rounds} rounds)`,
  );
  if (haveKey) {
    console.log(`  of which its signature alone (JSON.stringify + SHA-256 hex): ${median(perKey).toFixed(1)} ns/call`);
  }
  console.log(`  loops detected (and reset) per pass: ${loopsPerPass}`);
  console.log(`gemini_ns_per_call size=${label} value=${med.toFixed(1)}`);
  if (haveKey) console.log(`gemini_key_ns_per_call size=${label} value=${median(perKey).toFixed(1)}`);
  console.log(`gemini_loops_per_pass size=${label} value=${loopsPerPass}`);
}

if (unknownReads.size > 0) {
  fail(`the stub config is incomplete; the detector read: ${[...unknownReads].join(', ')}`);
}
if (keySink === 0 && haveKey) fail('no signature was computed');
if (netAttempts.length > 0) {
  fail(`the detector attempted network access: ${netAttempts.join(', ')}`);
}
