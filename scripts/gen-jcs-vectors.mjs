#!/usr/bin/env node
// scripts/gen-jcs-vectors.mjs - writes the expected canonical form of each
// tests/fixtures/jcs/input/*.json to tests/fixtures/jcs/output/ (same name),
// the reference vectors tests/unit/test_jcs.c checks when ../shared is not
// beside the project. The inputs are written by hand; this script is the
// independent implementation of RFC 8785 that produces the outputs:
// JSON.parse, then object members sorted by their names' UTF-16 code units
// (JavaScript's default string order) and every primitive written by
// JSON.stringify (ECMAScript number and string serialization), no
// whitespace, no trailing newline. Inputs must not repeat a key or hold a
// lone surrogate (JCS rejects both; JSON.parse would not).
//
//   node scripts/gen-jcs-vectors.mjs [DIR]    (default tests/fixtures/jcs)

import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const dir = process.argv[2] ?? join(root, 'tests/fixtures/jcs');

function canonical(v) {
  if (v === null || typeof v !== 'object') return JSON.stringify(v);
  if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']';
  const keys = Object.keys(v).sort();
  return '{' + keys.map((k) => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}';
}

let n = 0;
for (const name of readdirSync(join(dir, 'input')).sort()) {
  if (!name.endsWith('.json')) continue;
  const text = readFileSync(join(dir, 'input', name), 'utf8');
  writeFileSync(join(dir, 'output', name), canonical(JSON.parse(text)));
  n++;
}
process.stderr.write(`gen-jcs-vectors: ${n} outputs written to ${join(dir, 'output')}\n`);
