/*
 * src/base/rand.c - the one PRNG (xorshift64*) and the one backoff
 * calculation, shared by the retry executor (exec) and the model request
 * retries (agent). No global state: the caller owns the generator's state.
 */
#include "internal.h"

/* xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift
 * generators, scrambled", 2016). A zero state would stay zero: reseed. */
uint64_t ag__rand_next(uint64_t *state) {
  uint64_t x = *state;
  if (x == 0)
    x = 0x9E3779B97F4A7C15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

int64_t ag__backoff(int64_t base_ms, int attempt, ag__backoff_kind kind,
                    int64_t cap_ms, ag__jitter_kind jitter, uint64_t *rng) {
  int64_t base = base_ms > 0 ? base_ms : 0;
  if (attempt < 0)
    attempt = 0;
  int64_t d;
  switch (kind) {
  case AG__BACKOFF_EXPONENTIAL:
    if (base == 0)
      d = 0;
    else if (attempt >= 62 || base > (INT64_MAX >> attempt))
      d = INT64_MAX;
    else
      d = base << attempt;
    break;
  case AG__BACKOFF_CONSTANT:
    d = base;
    break;
  case AG__BACKOFF_LINEAR:
  default: {
    int64_t k = (int64_t)attempt + 1;
    d = base != 0 && k > INT64_MAX / base ? INT64_MAX : base * k;
    break;
  }
  }
  if (cap_ms > 0 && d > cap_ms)
    d = cap_ms;
  if (jitter == AG__JITTER_EQUAL && d > 1) {
    int64_t half = d / 2;
    uint64_t span = (uint64_t)(d - half) + 1; /* 0 .. d - half inclusive */
    d = half + (int64_t)(ag__rand_next(rng) % span);
  } else if (jitter == AG__JITTER_FULL && d > 0) {
    d = (int64_t)(ag__rand_next(rng) % ((uint64_t)d + 1));
  }
  return d;
}
