#!/usr/bin/env node
// scripts/gen-jcs-numbers.mjs - writes tests/fixtures/jcs/numbers.csv, the
// RFC 8785 number vectors that tests/unit/test_jcs.c checks the
// canonicalizer against when ../shared is not beside the project.
//
// Each line is "HEX,TEXT": an IEEE-754 double as 16 hexadecimal digits of
// its bits, and the text ECMAScript writes for it (Number.prototype.toString,
// which is what JSON.stringify and RFC 8785 use; -0 is written "0"). The
// same line format as the RFC's published number file. NaN and the
// infinities are not JSON and are left out.
//
// The doubles: hand-picked edge cases (zeros, the smallest subnormal, the
// largest finite, powers of ten around the 1e-7 and 1e21 switches between
// plain and exponent notation, 2^53 neighbours), then random bit patterns and
// random decimal-looking values from a fixed-seed generator, so the output
// is the same on every run and every machine.
//
//   node scripts/gen-jcs-numbers.mjs > tests/fixtures/jcs/numbers.csv
//   node scripts/gen-jcs-numbers.mjs --count 20000 > numbers.csv

const args = process.argv.slice(2);
let count = 4000;
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--count' && i + 1 < args.length) count = Number(args[++i]);
  else {
    process.stderr.write('usage: node scripts/gen-jcs-numbers.mjs [--count N]\n');
    process.exit(2);
  }
}
if (!Number.isInteger(count) || count < 0 || count > 10000000) {
  process.stderr.write('gen-jcs-numbers: --count must be an integer 0..10000000\n');
  process.exit(2);
}

// xorshift64* with a fixed seed: reproducible without Math.random.
let state = 0x9e3779b97f4a7c15n;
const MASK = (1n << 64n) - 1n;
function next64() {
  state ^= state >> 12n;
  state ^= (state << 25n) & MASK;
  state ^= state >> 27n;
  return (state * 0x2545f4914f6cdd1dn) & MASK;
}

const view = new DataView(new ArrayBuffer(8));
function bitsOf(d) {
  view.setFloat64(0, d);
  return view.getBigUint64(0);
}
function doubleOf(bits) {
  view.setBigUint64(0, bits);
  return view.getFloat64(0);
}

const seen = new Set();
const lines = [];
function add(bits) {
  const d = doubleOf(bits);
  if (!Number.isFinite(d)) return;
  const hex = bits.toString(16);
  if (seen.has(hex)) return;
  seen.add(hex);
  // Number.prototype.toString; -0 prints "0" as JSON.stringify does.
  const text = Object.is(d, -0) ? '0' : d.toString();
  if (JSON.stringify(d) !== text) throw new Error(`toString and JSON disagree on ${hex}`);
  lines.push(`${hex},${text}`);
}

const edges = [
  0, -0, 1, -1, 0.1, 0.2, 0.3, 0.1 + 0.2, 1 / 3, 2 / 3, 10, 100, 1e6,
  Number.MIN_VALUE, -Number.MIN_VALUE, Number.MAX_VALUE, -Number.MAX_VALUE,
  2.2250738585072014e-308, 2.225073858507201e-308, Number.EPSILON,
  Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER + 1, Number.MAX_SAFE_INTEGER + 2,
  -Number.MAX_SAFE_INTEGER, 2 ** 53 - 1, 2 ** 63, 2 ** 64, 2 ** 70,
  4.35, 0.000001, 0.0000001, 1e-7, 1.5e-7, 9.999999999999999e-7,
  1e20, 1e21, 9.999999999999999e20, 123e19, 1e-6, 333333333.3333333,
  5e-324, 1e-323, 1.7976931348623157e308, 1e308, 1e-300, 1e300,
  295147905179352830000, 0.000001234, 12345678901234567890,
  4.940656458412e-324, 9007199254740993, 1e22, 1e23, 5e-7, 5e-6,
];
for (const d of edges) add(bitsOf(d));
for (let e = -325; e <= 309; e++) {
  add(bitsOf(Number(`1e${e}`)));
  add(bitsOf(Number(`-9.87654321e${e}`)));
}
// Random bit patterns (any exponent, any mantissa).
for (let i = 0; i < count; i++) add(next64());
// Decimal-looking values: few significant digits, exponents that cross the
// notation switches.
for (let i = 0; i < count / 2; i++) {
  const r = next64();
  const digits = Number(r % 1000000n);
  const exp = Number((r >> 20n) % 60n) - 30;
  const sign = (r >> 63n) === 1n ? '-' : '';
  add(bitsOf(Number(`${sign}${digits}e${exp}`)));
}

process.stdout.write(lines.join('\n') + '\n');
