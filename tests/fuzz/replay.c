/*
 * tests/fuzz/replay.c - a main() for the libFuzzer targets without libFuzzer:
 * `fuzz_NAME_replay PATH...` feeds every file (and every file of every
 * folder) named to LLVMFuzzerTestOneInput once, in name order. CMake builds
 * one per target with the project's compiler and `make test` replays each
 * target's seed corpus (tests/fuzz/corpus/NAME/; CTest `fuzz_NAME_corpus`),
 * so every target compiles in every build - not only with clang - and
 * every input that once broke a property stays a regression test. A broken
 * property aborts, which fails the test.
 *
 * Inputs are read whole, up to REPLAY_MAX bytes (a larger file is an
 * error: libFuzzer's own inputs stay far below it).
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define REPLAY_MAX (4u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path, size_t *count) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  uint8_t *buf = malloc(REPLAY_MAX + 1);
  if (buf == NULL) {
    fclose(f);
    fprintf(stderr, "replay: out of memory\n");
    return -1;
  }
  size_t n = fread(buf, 1, REPLAY_MAX + 1, f);
  int bad = ferror(f);
  fclose(f);
  if (bad || n > REPLAY_MAX) {
    fprintf(stderr, "replay: %s: %s\n", path,
            bad ? "read error" : "larger than 4 MiB");
    free(buf);
    return -1;
  }
  /* a copy of exactly n bytes, so AddressSanitizer sees any read past it */
  uint8_t *data = malloc(n > 0 ? n : 1);
  if (data == NULL) {
    free(buf);
    fprintf(stderr, "replay: out of memory\n");
    return -1;
  }
  memcpy(data, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(data, n);
  free(data);
  (*count)++;
  return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

static int replay_path(const char *path, size_t *count) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode))
    return replay_file(path, count);
  struct dirent **names = NULL;
  int n = scandir(path, &names, NULL, by_name);
  if (n < 0) {
    fprintf(stderr, "replay: cannot read %s: %s\n", path, strerror(errno));
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < n; i++) {
    if (rc == 0 && names[i]->d_name[0] != '.') {
      size_t len = strlen(path) + strlen(names[i]->d_name) + 2;
      char *child = malloc(len);
      if (child == NULL) {
        rc = -1;
      } else {
        snprintf(child, len, "%s/%s", path, names[i]->d_name);
        rc = replay_path(child, count);
        free(child);
      }
    }
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
    return 2;
  }
  size_t count = 0;
  for (int i = 1; i < argc; i++)
    if (replay_path(argv[i], &count) != 0)
      return 1;
  if (count == 0) {
    fprintf(stderr, "replay: no input found\n");
    return 1;
  }
  printf("replayed %zu inputs\n", count);
  return 0;
}
