/*
 * src/core/content.c - the content-loop detector (include/agentguard/
 * content.h; DESIGN.md section 3, mechanism 14; docs/content-loop.md).
 *
 * What it is: Gemini CLI's checkContentLoop / analyzeContentChunksForLoop
 * (the current version: 5000 characters of history, a 5 x chunk-size
 * distance, the period check) over bytes, with fixed memory and O(1) work
 * per byte (the period check compares at most threshold - 1 texts when a
 * chunk passes the distance test).
 *
 * Per piece, in Gemini's order: (1) classify the piece in one pass over its
 * characters (fences, table, list item, heading, blockquote, divider);
 * (2) any of those resets the tracking (history, chunk index, scan
 * position); (3) an odd number of fences toggles the code-block state;
 * (4) a piece inside or entering a code block, or a divider, is not
 * analysed; (5) otherwise the piece is appended to the history, the history
 * is cut to its last max_history bytes (positions that fall off leave the
 * index), and every chunk position not yet analysed is looked up.
 *
 * Data structures. Positions are absolute byte offsets since the last
 * tracking reset (uint64_t), so a cut moves one number (`base`) instead of
 * rewriting every stored index as Gemini does.
 *   - buf: 2 x max_history bytes; the history [base, end) lives at
 *     buf[pos - buf_abs] and is moved to the front when it reaches the end
 *     (at most once per max_history bytes appended), so every chunk is
 *     contiguous.
 *   - the chunk index, Gemini's Map<hash, number[]>: an open-addressing
 *     table (linear probing, backward-shift deletion, at most half full)
 *     of slots {32-bit key from the mixed hash, entry id}; probing and
 *     deletion read only the slots. An entry is one distinct chunk: its
 *     key, the oldest and newest live occurrence, the occurrence
 *     `threshold - 1` before the newest (`wstart`), and the count. Entries
 *     are keyed by content, not by hash: a key match is confirmed with
 *     memcmp against the newest occurrence, so two chunks never share an
 *     entry (Gemini's SHA-256 key plus its content check amount to the
 *     same).
 *   - per position (a ring of a power of two >= max_history slots, indexed
 *     by pos & mask; live positions span less than max_history): the next
 *     occurrence of the same chunk and the entry id. With them, a new
 *     occurrence, a position falling off the history, and the distance test
 *     over the last `threshold` occurrences are all O(1).
 *   - the hash is a polynomial rolling hash over the chunk, advanced by one
 *     byte per position (recomputed in full only after a reset or a gap).
 * Live positions never exceed max_history, so max_history entries always
 * suffice: nothing can fill up, and nothing is allocated after creation.
 * The table alone grows inside its block: it starts at 512 slots and
 * doubles when the entries reach a quarter of it, up to its full size
 * (2 x max_history rounded up to a power of two), so a short text touches
 * a few pages instead of zeroing the full table (128 KiB by default) -
 * the proxy makes a detector per stream.
 *
 * Rejected: SHA-256 per chunk position as Gemini does (about 50 x the cost,
 * and a 256-bit key to store per chunk); Gemini's rewrite of every stored
 * index on each cut (O(history) per piece); counting UTF-16 units or code
 * points (a decoding pass on the hot path for no gain on ASCII prose; see
 * content.h for what bytes change).
 *
 * Threading: none; one detector per stream.
 */
#include "agentguard/content.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define NONE32 UINT32_MAX
#define ROLL_BASE 0x100000001b3ULL /* odd: the FNV-64 prime */

typedef struct entry {
  uint64_t head;   /* oldest live occurrence */
  uint64_t last;   /* newest occurrence */
  uint64_t wstart; /* occurrence threshold-1 before last (count >= thr) */
  uint32_t count;  /* live occurrences; 0 = free */
  uint32_t key;    /* its slot key */
  uint32_t next_free;
} entry;

/* A table slot: the top 32 bits of the mixed hash (the home slot is their
 * top bits, so deletion never looks at entries) and the entry id + 1. */
typedef struct slot {
  uint32_t key;
  uint32_t id; /* 0 = empty */
} slot;

struct ag_content_loop {
  size_t k;   /* chunk size */
  size_t thr; /* threshold */
  size_t cap; /* max history */

  uint8_t *buf; /* 2 * cap bytes */
  uint64_t buf_abs;
  uint64_t base; /* first byte of the history */
  uint64_t end;  /* one past its last byte */
  uint64_t scan; /* next chunk position to analyse */

  bool roll_valid;
  uint64_t roll_pos; /* position whose window hash is roll_hash */
  uint64_t roll_hash;
  uint64_t roll_pow; /* ROLL_BASE^(k-1) */

  slot *table;
  size_t table_mask;
  unsigned table_shift; /* 32 - log2(slots) */
  bool table_dirty;
  entry *entries; /* cap of them */
  uint32_t n_used;
  uint32_t free_head;

  uint64_t *next_occ; /* per position (pos & ring_mask) */
  uint32_t *entry_of;
  size_t ring_mask;

  bool in_code;
  bool found;
  uint8_t carry[4]; /* an incomplete UTF-8 sequence held back */
  size_t carry_len;
  uint8_t *found_chunk; /* k bytes */
  uint64_t *occ;        /* thr positions: the period check's scratch */
  size_t table_max;     /* slots the block holds: the table grows to it */
  uint32_t grow_at;     /* n_used that doubles the table (see grow) */
};

void ag_content_loop_opts_init(ag_content_loop_opts *opts) {
  if (opts == NULL)
    return;
  opts->chunk_size = 50;
  opts->threshold = 10;
  opts->max_history = 5000;
}

static size_t pow2_at_least(size_t n) {
  size_t p = 1;
  while (p < n)
    p <<= 1;
  return p;
}

static size_t home_of(const ag_content_loop *d, uint32_t key);

/* The table's first size: 512 slots, one 4 KiB page. */
#define TABLE_START 512

static void table_size(ag_content_loop *d, size_t slots) {
  d->table_mask = slots - 1;
  unsigned bits = 0;
  while (((size_t)1 << bits) < slots)
    bits++;
  d->table_shift = 32 - bits;
  /* a quarter full; never again at full size */
  d->grow_at = slots < d->table_max ? (uint32_t)(slots / 4) : UINT32_MAX;
}

static void reset_tracking(ag_content_loop *d) {
  d->buf_abs = d->base = d->end = d->scan = 0;
  d->roll_valid = false;
  if (d->table_dirty) {
    size_t slots = d->table_mask + 1;
    if ((size_t)d->n_used * 16 >= slots) {
      memset(d->table, 0, slots * sizeof(*d->table));
    } else {
      /* Few entries (a reset every line of a list): empty their slots
       * only. A slot is found by probing from its home; holes made by
       * this loop are skipped, the slot is always further on. */
      for (uint32_t id = 0; id < d->n_used; id++) {
        if (d->entries[id].count == 0)
          continue;
        size_t i = home_of(d, d->entries[id].key);
        while (d->table[i].id != id + 1)
          i = (i + 1) & d->table_mask;
        d->table[i].id = 0;
      }
    }
    d->table_dirty = false;
  }
  d->n_used = 0;
  d->free_head = NONE32;
}

ag_err_t ag_content_loop_new(ag_content_loop **out,
                             const ag_content_loop_opts *opts,
                             ag_error_t *err) {
  if (out == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_content_loop_new: out is NULL");
  *out = NULL;
  ag_content_loop_opts o;
  ag_content_loop_opts_init(&o);
  if (opts != NULL)
    o = *opts;
  if (o.max_history < 1 || o.max_history > AG_CONTENT_MAX_HISTORY_LIMIT)
    return ag__set_error(err, AG_EINVAL, -1,
                         "content loop option max_history: %zu is out of "
                         "range (1 to %d)",
                         o.max_history, AG_CONTENT_MAX_HISTORY_LIMIT);
  if (o.chunk_size < 1 || o.chunk_size > o.max_history)
    return ag__set_error(err, AG_EINVAL, -1,
                         "content loop option chunk_size: %zu is out of "
                         "range (1 to max_history, %zu)",
                         o.chunk_size, o.max_history);
  if (o.threshold < 2 || o.threshold > o.max_history)
    return ag__set_error(err, AG_EINVAL, -1,
                         "content loop option threshold: %zu is out of "
                         "range (2 to max_history, %zu)",
                         o.threshold, o.max_history);

  ag_content_loop *d = calloc(1, sizeof(*d));
  if (d == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "content loop detector: %s",
                         ag_strerror(AG_ENOMEM));
  d->k = o.chunk_size;
  d->thr = o.threshold;
  d->cap = o.max_history;
  size_t ring = pow2_at_least(d->cap);
  /* at most cap live chunks: a table of 2 x cap slots or more is at most
   * half full (31% with the default 5000) */
  size_t slots = pow2_at_least(2 * d->cap);
  d->ring_mask = ring - 1;
  d->table_max = slots;
  /* One block for everything (fewer calls, and one size for the
   * allocator: a guard made and freed per proxy request then reuses the
   * same memory instead of mapping and trimming six blocks each time).
   * Only the table must start empty: entries past n_used, the links of
   * positions not yet recorded and the scratch are written before they
   * are read. The table starts small and doubles with the chunks it
   * holds (see grow), so a short text touches a few pages of the block,
   * not all of it: the proxy makes a detector per stream. */
  size_t sz_table = slots * sizeof(*d->table);
  size_t sz_entries = d->cap * sizeof(*d->entries);
  size_t sz_next = ring * sizeof(*d->next_occ);
  size_t sz_occ = d->thr * sizeof(*d->occ);
  size_t sz_of = ring * sizeof(*d->entry_of);
  size_t total =
      sz_table + sz_entries + sz_next + sz_occ + sz_of + 2 * d->cap + d->k;
  uint8_t *block = malloc(total);
  if (block == NULL) {
    free(d);
    return ag__set_error(err, AG_ENOMEM, -1, "content loop detector: %s",
                         ag_strerror(AG_ENOMEM));
  }
  /* in order of alignment: 8-byte arrays first, then 4, then bytes */
  d->entries = (entry *)(void *)block;
  d->next_occ = (uint64_t *)(void *)(block + sz_entries);
  d->occ = (uint64_t *)(void *)(block + sz_entries + sz_next);
  d->table = (slot *)(void *)(block + sz_entries + sz_next + sz_occ);
  d->entry_of = (uint32_t *)(void *)((uint8_t *)d->table + sz_table);
  d->buf = (uint8_t *)d->entry_of + sz_of;
  d->found_chunk = d->buf + 2 * d->cap;
  table_size(d, slots < TABLE_START ? slots : TABLE_START);
  memset(d->table, 0, (d->table_mask + 1) * sizeof(*d->table));
  uint64_t p = 1;
  for (size_t i = 1; i < d->k; i++)
    p *= ROLL_BASE;
  d->roll_pow = p;
  reset_tracking(d);
  *out = d;
  return AG_OK;
}

void ag_content_loop_free(ag_content_loop *d) {
  if (d == NULL)
    return;
  free(d->entries); /* the one block (see _new) */
  free(d);
}

void ag_content_loop_reset(ag_content_loop *d) {
  if (d == NULL)
    return;
  reset_tracking(d);
  d->in_code = false;
  d->found = false;
  d->carry_len = 0;
}

bool ag_content_loop_found(const ag_content_loop *d) {
  return d != NULL && d->found;
}

/* ------------------------------------------------------------------------ */
/* The chunk index                                                          */
/* ------------------------------------------------------------------------ */

/* The slot key of a chunk hash: its top 32 bits after a full mix. */
static uint32_t key_of(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return (uint32_t)(h >> 32);
}

static size_t home_of(const ag_content_loop *d, uint32_t key) {
  return (size_t)(key >> d->table_shift);
}

static const uint8_t *at(const ag_content_loop *d, uint64_t pos) {
  return d->buf + (size_t)(pos - d->buf_abs);
}

/* Removes entry `id` (count already 0), whose slot key is `key`, from the
 * table: backward-shift deletion. */
static void table_delete(ag_content_loop *d, uint32_t id, uint32_t key) {
  size_t mask = d->table_mask;
  size_t i = home_of(d, key);
  while (d->table[i].id != id + 1)
    i = (i + 1) & mask;
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    slot s = d->table[j];
    if (s.id == 0)
      break;
    size_t h = home_of(d, s.key);
    /* The slot at j may move to the hole at i unless its home lies
     * cyclically in (i, j]. */
    bool stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
    if (!stays) {
      d->table[i] = s;
      i = j;
    }
  }
  d->table[i].id = 0;
  d->entries[id].next_free = d->free_head;
  d->free_head = id;
}

/* Position `pos` falls off the history: it is the oldest occurrence of its
 * chunk (positions leave in increasing order). */
static void drop_position(ag_content_loop *d, uint64_t pos) {
  uint32_t id = d->entry_of[pos & d->ring_mask];
  entry *e = &d->entries[id];
  if (--e->count == 0) {
    table_delete(d, id, e->key);
    return;
  }
  e->head = d->next_occ[pos & d->ring_mask];
}

/* Gemini's period check: the texts between the last `thr` occurrences of
 * a chunk (from `first`) are a loop only when they repeat themselves - at
 * most thr / 2 distinct ones. Prose that comes back to the same phrase
 * with different text in between each time is no loop. No allocation:
 * the periods are compared in place in the history. */
static bool few_periods(ag_content_loop *d, uint64_t first) {
  size_t n = d->thr;
  uint64_t p = first;
  for (size_t i = 0; i < n; i++) {
    d->occ[i] = p;
    if (i + 1 < n)
      p = d->next_occ[p & d->ring_mask];
  }
  size_t distinct = 0;
  for (size_t i = 0; i + 1 < n; i++) {
    uint64_t len = d->occ[i + 1] - d->occ[i];
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++)
      seen = d->occ[j + 1] - d->occ[j] == len &&
             memcmp(at(d, d->occ[j]), at(d, d->occ[i]), (size_t)len) == 0;
    if (!seen && ++distinct > n / 2)
      return false;
  }
  return true;
}

/* Doubles the table (up to table_max, where it is at most a third full)
 * and puts every live entry back: the entries hold their keys, so no
 * second table is needed. Called when entries reach a quarter of the
 * slots, so probes stay as short as in a table made at full size; each
 * entry is moved at most once per doubling, O(1) amortised. */
#if defined(__GNUC__)
__attribute__((noinline, cold))
#endif
static void
grow(ag_content_loop *d) {
  size_t slots = (d->table_mask + 1) * 2;
  table_size(d, slots);
  memset(d->table, 0, slots * sizeof(*d->table));
  for (uint32_t id = 0; id < d->n_used; id++) {
    if (d->entries[id].count == 0)
      continue; /* on the free list */
    size_t i = home_of(d, d->entries[id].key);
    while (d->table[i].id != 0)
      i = (i + 1) & d->table_mask;
    d->table[i].key = d->entries[id].key;
    d->table[i].id = id + 1;
  }
}

/* Gemini's isLoopDetectedForChunk for the chunk at `pos` with hash `h`:
 * records the occurrence; true when it completes a loop. */
static bool record(ag_content_loop *d, uint64_t pos, const uint8_t *chunk,
                   uint64_t h) {
  size_t mask = d->table_mask;
  uint32_t key = key_of(h);
  size_t i = home_of(d, key);
  for (; d->table[i].id != 0; i = (i + 1) & mask) {
    if (d->table[i].key != key)
      continue;
    uint32_t id = d->table[i].id - 1;
    entry *e = &d->entries[id];
    if (memcmp(at(d, e->last), chunk, d->k) != 0)
      continue; /* same key, other content */
    d->next_occ[e->last & d->ring_mask] = pos;
    d->entry_of[pos & d->ring_mask] = id;
    e->last = pos;
    e->count++;
    if (e->count < d->thr)
      return false;
    if (e->count == d->thr)
      e->wstart = e->head;
    else
      e->wstart = d->next_occ[e->wstart & d->ring_mask];
    /* average distance <= 5 x chunk size, in integers:
     * (last - first) / (thr - 1) <= 5k */
    uint64_t total = pos - e->wstart;
    if (total > 5 * (uint64_t)d->k * (uint64_t)(d->thr - 1))
      return false;
    return few_periods(d, e->wstart);
  }
  uint32_t id;
  if (d->free_head != NONE32) {
    id = d->free_head;
    d->free_head = d->entries[id].next_free;
  } else {
    if (d->n_used >= d->grow_at) {
      grow(d); /* before the new entry is counted: its fields are stale */
      for (i = home_of(d, key); d->table[i].id != 0;
           i = (i + 1) & d->table_mask)
        ; /* the key is not in the table: its first empty slot */
    }
    id = d->n_used++; /* < cap: live chunks never exceed max_history */
  }
  entry *e = &d->entries[id];
  e->key = key;
  e->head = e->last = pos;
  e->count = 1;
  d->entry_of[pos & d->ring_mask] = id;
  d->table[i].key = key;
  d->table[i].id = id + 1;
  d->table_dirty = true;
  return false;
}

/* ------------------------------------------------------------------------ */
/* History and analysis                                                     */
/* ------------------------------------------------------------------------ */

/* Appends a[0..na) b[0..nb) to the history and cuts it to its last cap
 * bytes (Gemini's truncateAndUpdate). */
static void append(ag_content_loop *d, const uint8_t *a, size_t na,
                   const uint8_t *b, size_t nb) {
  uint64_t n = (uint64_t)na + nb;
  if (n == 0)
    return;
  uint64_t new_end = d->end + n;
  uint64_t new_base = d->base;
  if (new_end - d->base > d->cap)
    new_base = new_end - d->cap;
  /* Recorded positions that fall off leave the index. */
  uint64_t drop_to = new_base < d->scan ? new_base : d->scan;
  for (uint64_t p = d->base; p < drop_to; p++)
    drop_position(d, p);
  if (d->scan < new_base)
    d->scan = new_base; /* Gemini: lastContentIndex = max(0, ... - cut) */
  /* Bytes of the piece before new_base are never stored. */
  uint64_t skip = new_base > d->end ? new_base - d->end : 0;
  if (new_base >= d->end) {
    d->buf_abs = new_base; /* nothing of the old history survives */
  } else if (new_end - d->buf_abs > 2 * (uint64_t)d->cap) {
    size_t keep = (size_t)(d->end - new_base);
    memmove(d->buf, at(d, new_base), keep);
    d->buf_abs = new_base;
  }
  uint8_t *dst = d->buf + (size_t)(d->end + skip - d->buf_abs);
  if (skip < na) {
    memcpy(dst, a + skip, na - (size_t)skip);
    dst += na - (size_t)skip;
    memcpy(dst, b, nb);
  } else {
    size_t sb = (size_t)(skip - na);
    memcpy(dst, b + sb, nb - sb);
  }
  d->base = new_base;
  d->end = new_end;
}

static uint64_t hash_full(const uint8_t *c, size_t k) {
  uint64_t h = 0;
  for (size_t i = 0; i < k; i++)
    h = h * ROLL_BASE + c[i];
  return h;
}

/* Gemini's analyzeContentChunksForLoop. */
static bool analyse(ag_content_loop *d) {
  size_t k = d->k;
  while (d->scan + k <= d->end) {
    uint64_t pos = d->scan;
    const uint8_t *c = at(d, pos);
    uint64_t h;
    if (d->roll_valid && d->roll_pos + 1 == pos && d->roll_pos >= d->buf_abs) {
      h = (d->roll_hash - (uint64_t)c[-1] * d->roll_pow) * ROLL_BASE + c[k - 1];
    } else {
      h = hash_full(c, k);
    }
    d->roll_valid = true;
    d->roll_pos = pos;
    d->roll_hash = h;
    if (record(d, pos, c, h)) {
      memcpy(d->found_chunk, c, k);
      return true;
    }
    d->scan++;
  }
  return false;
}

/* ------------------------------------------------------------------------ */
/* The markdown checks                                                      */
/* ------------------------------------------------------------------------ */

/* JavaScript's \s: WhiteSpace and LineTerminator. */
static bool js_space(uint32_t c) {
  if (c < 0x80)
    return c == ' ' || (c >= 0x09 && c <= 0x0d);
  return c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000 || c == 0xfeff;
}

/* What JavaScript's `.` does not match. */
static bool js_line_end(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x2028 || c == 0x2029;
}

static bool divider_char(uint32_t c) {
  return c == '-' || c == '_' || c == '=' || c == '*' || c == '+' ||
         (c >= 0x2500 && c <= 0x257f);
}

static bool is_digit(uint32_t c) {
  return c >= '0' && c <= '9';
}

/*
 * One pass over a piece's characters answering Gemini's six regular
 * expressions (content.h and docs/content-loop.md give them):
 *   fences   /```/g count
 *   table    /(^|\n)\s*(\|.*\||[|+-]{3,})/
 *   list     /(^|\n)\s*[*+-]\s/ or /(^|\n)\s*\d+\.\s/
 *   heading  /(^|\n)#+\s/
 *   quote    /(^|\n)>\s/
 *   divider  /^[-_=*+\u2500-\u257F]+$/
 * `ls`: at a point reached from the piece start or a newline through
 * whitespace only (the `(^|\n)\s*` prefix); `nl`: right at the piece start
 * or right after a newline (the `(^|\n)` prefix).
 */
typedef struct scan_state {
  bool ls, nl;
  bool table, list, heading, quote, divider, any;
  unsigned fences, tick_run;
  bool pipe_open;   /* line-start '|' seen, waiting for another on the line */
  unsigned sym_run; /* run of [|+-] from a line start; 0 = none */
  bool marker;      /* line-start [*+-] seen, waiting for \s */
  int digits;       /* 1: in line-start \d+, 2: after the '.' */
  bool hashes;      /* in a '#' run at a line start */
  bool gt;          /* '>' at a line start, waiting for \s */
} scan_state;

static void scan_init(scan_state *s) {
  memset(s, 0, sizeof(*s));
  s->ls = s->nl = true;
  s->divider = true;
}

static void scan_char(scan_state *s, uint32_t c) {
  bool ws = js_space(c);
  /* Candidates opened by earlier characters. */
  if (s->marker) {
    s->list |= ws;
    s->marker = false;
  }
  if (s->digits == 1) {
    if (c == '.')
      s->digits = 2;
    else if (!is_digit(c))
      s->digits = 0;
  } else if (s->digits == 2) {
    s->list |= ws;
    s->digits = 0;
  }
  if (s->hashes && c != '#') {
    s->heading |= ws;
    s->hashes = false;
  }
  if (s->gt) {
    s->quote |= ws;
    s->gt = false;
  }
  if (s->pipe_open) {
    if (c == '|')
      s->table = true;
    if (c == '|' || js_line_end(c))
      s->pipe_open = false;
  }
  if (s->sym_run > 0) {
    if (c == '|' || c == '+' || c == '-') {
      if (++s->sym_run >= 3)
        s->table = true;
    } else {
      s->sym_run = 0;
    }
  }
  /* Candidates this character opens. */
  if (s->ls && !ws) {
    if (c == '|')
      s->pipe_open = true;
    if (c == '|' || c == '+' || c == '-')
      s->sym_run = 1;
    if (c == '*' || c == '+' || c == '-')
      s->marker = true;
    if (is_digit(c))
      s->digits = 1;
  }
  if (s->nl) {
    if (c == '#')
      s->hashes = true;
    if (c == '>')
      s->gt = true;
  }
  if (c == '`') {
    if (++s->tick_run == 3) {
      s->fences++;
      s->tick_run = 0;
    }
  } else {
    s->tick_run = 0;
  }
  s->any = true;
  if (!divider_char(c))
    s->divider = false;
  if (c == '\n') {
    s->ls = s->nl = true;
  } else {
    s->nl = false;
    if (!ws)
      s->ls = false;
  }
}

/* True when an ordinary character changes nothing: no candidate is open,
 * the scan is not at a line start, the piece is already not a divider. */
static bool quiet(const scan_state *s) {
  return !s->ls && !s->nl && !s->marker && s->digits == 0 && !s->hashes &&
         !s->gt && s->sym_run == 0 && s->tick_run == 0 && !s->divider && s->any;
}

/* Decodes the characters of p[0..n) into the scan; a byte that is not part
 * of a well-formed sequence counts as one character of its own (U+FFFD,
 * which no check matches). */
static void scan_bytes(scan_state *s, const uint8_t *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (quiet(s)) {
      /* Prose between line starts: only these bytes can change the state
       * (a newline, a backtick, a pipe closing a table row, '\r' or a
       * non-ASCII character ending the row). */
      while (i < n && p[i] < 0x80 && p[i] != '\n' && p[i] != '`' &&
             p[i] != '|' && p[i] != '\r')
        i++;
      if (i == n)
        break;
    }
    uint8_t b = p[i];
    if (b < 0x80) {
      scan_char(s, b);
      i++;
      continue;
    }
    size_t len = ag__utf8_lead_len(b);
    bool ok = len > 1 && i + len <= n;
    for (size_t j = 1; ok && j < len; j++)
      ok = ag__utf8_is_cont(p[i + j]);
    if (!ok) {
      scan_char(s, 0xfffd);
      i++;
      continue;
    }
    uint32_t c = b & (0x7f >> len);
    for (size_t j = 1; j < len; j++)
      c = (c << 6) | (p[i + j] & 0x3f);
    scan_char(s, c);
    i += len;
  }
}

/* Gemini's checkContentLoop for the piece a[0..na) b[0..nb). */
static bool check_piece(ag_content_loop *d, const uint8_t *a, size_t na,
                        const uint8_t *b, size_t nb) {
  scan_state s;
  scan_init(&s);
  scan_bytes(&s, a, na);
  scan_bytes(&s, b, nb);
  bool divider = s.any && s.divider;
  if (s.fences > 0 || s.table || s.list || s.heading || s.quote || divider)
    reset_tracking(d);
  bool was_in_code = d->in_code;
  if (s.fences % 2 == 1)
    d->in_code = !d->in_code;
  if (was_in_code || d->in_code || divider)
    return false;
  append(d, a, na, b, nb);
  return analyse(d);
}

/* Bytes at the end of p[0..n) that begin a UTF-8 sequence but do not finish
 * it (0 to 3). */
static size_t incomplete_tail(const uint8_t *p, size_t n) {
  for (size_t back = 1; back <= 3 && back <= n; back++) {
    uint8_t b = p[n - back];
    if (ag__utf8_is_cont(b))
      continue;
    size_t len = ag__utf8_lead_len(b);
    return (len > back) ? back : 0;
  }
  return 0;
}

bool ag_content_loop_feed(ag_content_loop *d, const char *text, size_t len) {
  if (d == NULL)
    return false;
  if (d->found)
    return true;
  const uint8_t *t = (const uint8_t *)text;
  if (t == NULL) {
    t = (const uint8_t *)""; /* never NULL into memcpy or arithmetic */
    len = 0;
  }
  uint8_t head[8];
  size_t nhead = 0, start = 0;
  if (d->carry_len > 0) {
    /* Finish the held-back sequence with the piece's first bytes. */
    size_t need = ag__utf8_lead_len(d->carry[0]) - d->carry_len;
    size_t take = 0;
    while (take < need && take < len && ag__utf8_is_cont(t[take]))
      take++;
    if (take < need && take == len) {
      memcpy(d->carry + d->carry_len, t, take);
      d->carry_len += take;
      return false; /* still incomplete: an empty piece so far */
    }
    memcpy(head, d->carry, d->carry_len);
    memcpy(head + d->carry_len, t, take);
    nhead = d->carry_len + take; /* whole, or invalid bytes if take < need */
    start = take;
    d->carry_len = 0;
  }
  size_t stop = len - incomplete_tail(t + start, len - start);
  bool loop = check_piece(d, head, nhead, t + start, stop - start);
  memcpy(d->carry, t + stop, len - stop);
  d->carry_len = len - stop;
  if (loop)
    d->found = true;
  return d->found;
}

static bool ascii_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9');
}

/* Whether line[i..end), inside a line, begins a markdown element that a
 * stream would have sent as a piece of its own ("...the end" then
 * "| a | b |"), which a whole reply glues to the text before it: after a
 * letter, a digit or a blank, a table row (a '|' with another later on
 * the line), two or more '#' and a blank, '>' and a blank, or a single
 * '*' and a blank. ('-' and '+', common as a dash and a plus in prose,
 * count only at a line start.) A cut here resets the tracking as the
 * element would as a delta: a whole reply is then judged as the same text
 * streamed element by element. */
static bool glued_element(const char *t, size_t i, size_t end) {
  char b = t[i - 1];
  if (!ascii_alnum(b) && b != ' ' && b != '\t')
    return false;
  char c = t[i];
  bool blank = i + 1 < end && (t[i + 1] == ' ' || t[i + 1] == '\t');
  if (c == '|')
    return memchr(t + i + 1, '|', end - i - 1) != NULL;
  if (c == '>')
    return blank;
  if (c == '*')
    return blank && b != '*';
  if (c == '#') {
    size_t j = i;
    while (j < end && t[j] == '#')
      j++;
    return j - i >= 2 && j < end && (t[j] == ' ' || t[j] == '\t');
  }
  return false;
}

bool ag_content_loop_check_text(ag_content_loop *d, const char *text,
                                size_t len) {
  if (d == NULL)
    return false;
  ag_content_loop_reset(d);
  if (text == NULL)
    return false;
  size_t i = 0;
  while (i < len && !d->found) {
    const char *nl = memchr(text + i, '\n', len - i);
    size_t line_end = nl != NULL ? (size_t)(nl - text) : len;
    /* a line is one piece, cut again before each glued element */
    size_t start = i;
    for (size_t j = i + 1; j < line_end && !d->found; j++) {
      if (!glued_element(text, j, line_end))
        continue;
      ag_content_loop_feed(d, text + start, j - start);
      start = j;
    }
    if (line_end > start && !d->found)
      ag_content_loop_feed(d, text + start, line_end - start);
    if (nl == NULL)
      break;
    ag_content_loop_feed(d, "\n", 1);
    i = line_end + 1;
  }
  return d->found;
}

size_t ag_content_loop_chunk(const ag_content_loop *d, char *buf, size_t cap) {
  if (cap == 0 || buf == NULL)
    return 0;
  buf[0] = '\0';
  if (d == NULL || !d->found)
    return 0;
  const uint8_t *c = d->found_chunk;
  size_t lo = 0, hi = d->k;
  while (lo < hi && ag__utf8_is_cont(c[lo]))
    lo++; /* the chunk began inside a character */
  hi -= incomplete_tail(c + lo, hi - lo);
  size_t n = 0;
  bool pending_space = false;
  size_t i = lo;
  while (i < hi) {
    uint8_t b = c[i];
    if (b <= 0x20 || b == 0x7f) {
      pending_space = n > 0;
      i++;
      continue;
    }
    size_t len = ag__utf8_lead_len(b);
    bool ok = len > 0 && i + len <= hi;
    for (size_t j = 1; ok && j < len; j++)
      ok = ag__utf8_is_cont(c[i + j]);
    size_t out = ok ? len : 1; /* an invalid byte is written as '?' */
    if (n + (pending_space ? 1 : 0) + out > cap - 1)
      break;
    if (pending_space)
      buf[n++] = ' ';
    pending_space = false;
    if (ok)
      memcpy(buf + n, c + i, len);
    else
      buf[n] = '?';
    n += out;
    i += ok ? len : 1;
  }
  buf[n] = '\0';
  return n;
}
