/*
 * tests/runtime/test_proxy_replies.c - the proxy's reading of an
 * upstream's whole Chat Completions reply (ag_proxy_read_whole,
 * src/proxy/hooks.h): on its loop a plain chat.completion is read from the
 * JCS tokenizer's tape (src/wire/chat.c, whole_tape), anything else as a
 * jansson tree, and the two readings must agree on every body - the reply
 * read, or the 502 a body that is no reply gets. Each body below sits on
 * one side of a line the tape reader draws; tests/fuzz/fuzz_relay.c
 * checks the same property on fuzzed bytes.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/hooks.h"

/* Both readings of body, compared; returns the tape's (malloc'd). */
static char *read_both(bool anthropic, const char *body, size_t len) {
  char *tape = NULL, *tree = NULL;
  cr_assert_eq(ag_proxy_read_whole(anthropic, body, len, 0, &tape), 0);
  cr_assert_eq(
      ag_proxy_read_whole(anthropic, body, len, AG_PROXY_REPLAY_TREE, &tree),
      0);
  cr_expect_str_eq(tape, tree, "the tape and the tree differ on %.300s", body);
  free(tree);
  return tape;
}

static char *both_ways(const char *body, size_t len) {
  return read_both(false, body, len);
}

Test(proxy_replies, a_plain_reply_reads_the_same_from_the_tape) {
  const char *body =
      "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1,"
      "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
      "\"assistant\",\"content\":\"The file says \\u00e9 \\\"hi\\\".\\n\"},"
      "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":120,"
      "\"completion_tokens\":6,\"total_tokens\":126,"
      "\"prompt_tokens_details\":{\"cached_tokens\":64}}}";
  char *got = both_ways(body, strlen(body));
  /* and it is the reply, not two equal failures */
  cr_expect_str_eq(got, "{\"text\":\"The file says \xc3\xa9 \\\"hi\\\".\\n\","
                        "\"refusal\":null,\"calls\":[],\"finish\":\"stop\","
                        "\"has_usage\":true,\"prompt\":120,\"completion\":6,"
                        "\"cached\":64}");
  free(got);
}

Test(proxy_replies, calls_read_the_same_from_the_tape) {
  const char *body =
      "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
      "\"content\":null,\"refusal\":null,\"tool_calls\":["
      "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
      "\"read_file\",\"arguments\":\"{\\\"path\\\":\\\"a.txt\\\"}\"}},"
      "{\"id\":\"\",\"function\":{\"name\":\"ls\",\"arguments\":null}}]},"
      "\"finish_reason\":\"tool_calls\"}]}";
  char *got = both_ways(body, strlen(body));
  cr_expect(strstr(got, "\"name\":\"read_file\",\"arguments\":"
                        "\"{\\\"path\\\":\\\"a.txt\\\"}\"") != NULL,
            "%s", got);
  free(got);
}

/* Bodies on either side of the tape reader's line: each is read the same
 * both ways, whether the tape takes it or leaves it to the tree. */
Test(proxy_replies, every_near_miss_reads_the_same_both_ways) {
  static const char *const bodies[] = {
      /* usage: reals are no integers; a root "prompt_tokens" is nobody's */
      "{\"choices\":[{\"message\":{\"content\":\"x\"}}],"
      "\"prompt_tokens\":5,\"usage\":{\"prompt_tokens\":1.5,"
      "\"completion_tokens\":-0}}",
      "{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"cached_tokens\":9,"
      "\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":7}}",
      "{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"usage\":"
      "{\"prompt_tokens\":1e2,\"completion_tokens\":2E0}}",
      "{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"usage\":[1,2]}",
      /* a finish reason past its 31 bytes is cut */
      "{\"choices\":[{\"message\":{\"content\":\"\"},\"finish_reason\":"
      "\"a_finish_reason_longer_than_thirty_one_bytes\"}]}",
      "{\"choices\":[{\"message\":{\"content\":\"x\"},\"finish_reason\":7}]}",
      /* refusals, strings or not */
      "{\"choices\":[{\"message\":{\"content\":null,\"refusal\":\"no\"}}]}",
      "{\"choices\":[{\"message\":{\"refusal\":{\"why\":1}}}]}",
      /* what the tree path complains about */
      "{\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}",
      "{\"error\":null,\"choices\":[{\"message\":{\"content\":\"ok\"}}]}",
      "{\"choices\":[]}",
      "{\"choices\":{}}",
      "{\"choices\":[7]}",
      "{\"choices\":[{\"message\":\"hi\"}]}",
      "{\"choices\":[{\"message\":{\"content\":5}}]}",
      "{\"choices\":[{\"message\":{\"content\":[{\"type\":\"text\"}]}}]}",
      "{\"choices\":[{\"message\":{\"tool_calls\":{}}}]}",
      "{\"choices\":[{\"message\":{\"tool_calls\":[1]}}]}",
      "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":3}]}}]}",
      "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":"
      "\"f\",\"arguments\":7}}]}}]}",
      /* arguments as an object: the tree writes them out */
      "{\"choices\":[{\"message\":{\"tool_calls\":[{\"function\":{\"name\":"
      "\"f\",\"arguments\":{\"b\":1,\"a\":[true]}}}]}}]}",
      /* a call without a name (no reply); an id that is no string */
      "{\"choices\":[{\"message\":{\"tool_calls\":[{\"type\":\"function\"}]}}]"
      "}",
      "{\"choices\":[{\"message\":{\"tool_calls\":[{\"id\":7,\"function\":"
      "{\"name\":\"\",\"arguments\":\"{}\"}}]}}]}",
      /* what jansson refuses or reads otherwise */
      "{\"choices\":[{\"message\":{\"content\":\"a\\u0000b\"}}]}",
      "{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"usage\":"
      "{\"prompt_tokens\":123456789012345678901234}}",
      "{\"choices\":[{\"message\":{\"content\":\"x\",\"content\":\"y\"}}]}",
      "{\"choices\":[{\"message\":{\"content\":\"\\ud800\"}}]}",
      "{\"choices\":[{\"message\":{\"content\":\"x\"}}]} trailing",
      "[{\"choices\":[]}]",
      "\"just a string\"",
      "",
      "{\"choices\":[{\"message\":{\"content\":\"\xff\"}}]}",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    free(both_ways(bodies[i], strlen(bodies[i])));
}

/* Sizes around the tape's 16 KiB, and more calls than a reply may hold. */
Test(proxy_replies, long_replies_and_many_calls_read_the_same_both_ways) {
  size_t sizes[] = {16000, 16384 - 60, 16384 - 59, 16384, 20000};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    const char *head = "{\"choices\":[{\"message\":{\"content\":\"";
    const char *tail = "\"}}]}";
    size_t fill = sizes[k] - strlen(head) - strlen(tail);
    char *b = malloc(sizes[k] + 1);
    cr_assert_not_null(b);
    strcpy(b, head);
    memset(b + strlen(head), 'a', fill);
    strcpy(b + strlen(head) + fill, tail);
    cr_assert_eq(strlen(b), sizes[k]);
    free(both_ways(b, sizes[k]));
    free(b);
  }
  char *b = malloc(64 * 1024);
  cr_assert_not_null(b);
  size_t n = (size_t)sprintf(b, "{\"choices\":[{\"message\":{\"tool_calls\":[");
  for (int i = 0; i < 200; i++)
    n += (size_t)sprintf(b + n,
                         "%s{\"id\":\"c%d\",\"function\":{\"name\":\"f\","
                         "\"arguments\":\"{}\"}}",
                         i ? "," : "", i);
  n += (size_t)sprintf(b + n, "]}}]}");
  free(both_ways(b, n));
  free(b);
}

/* Messages: a plain reply from the tape, and the bodies on either side of
 * its line (an input jansson would write otherwise, a block the tree path
 * complains about, an error). */
Test(proxy_replies, messages_replies_read_the_same_both_ways) {
  const char *plain =
      "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\","
      "\"content\":[{\"type\":\"text\",\"text\":\"Reading \\\"a\\\".\"},"
      "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"read_file\","
      "\"input\":{\"path\":\"a.txt\",\"opts\":{\"all\":true,\"x\":null}}},"
      "{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"ls\",\"input\":{}},"
      "{\"type\":\"thinking\",\"thinking\":\"...\"}],"
      "\"stop_reason\":\"tool_use\",\"usage\":{\"input_tokens\":10,"
      "\"cache_creation_input_tokens\":2,\"cache_read_input_tokens\":5,"
      "\"output_tokens\":7}}";
  char *got = read_both(true, plain, strlen(plain));
  cr_expect_str_eq(
      got, "{\"text\":\"Reading \\\"a\\\".\",\"refusal\":null,\"calls\":["
           "{\"id\":\"toolu_1\",\"name\":\"read_file\",\"arguments\":"
           "\"{\\\"path\\\":\\\"a.txt\\\",\\\"opts\\\":{\\\"all\\\":true,"
           "\\\"x\\\":null}}\"},{\"id\":\"toolu_2\",\"name\":\"ls\","
           "\"arguments\":\"{}\"}],\"finish\":\"tool_use\",\"has_usage\":true,"
           "\"prompt\":17,\"completion\":7,\"cached\":5}");
  free(got);
  static const char *const bodies[] = {
      /* inputs jansson writes otherwise: numbers, spaces, an escape */
      "{\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\","
      "\"input\":{\"n\":1.50,\"m\":7}}]}",
      "{\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\","
      "\"input\":{ \"a\" : \"b\" }}]}",
      "{\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\","
      "\"input\":{\"a\":\"x\\/y\\u00e9\"}}]}",
      /* what the tree path complains about */
      "{\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"input\":{}}]}",
      "{\"content\":[{\"type\":\"tool_use\",\"name\":\"f\",\"input\":null}]}",
      "{\"content\":[{\"type\":\"tool_use\",\"name\":\"f\",\"input\":[1]}]}",
      "{\"content\":[{\"type\":\"text\",\"text\":7}]}",
      "{\"content\":[{\"text\":\"no type\"}]}",
      "{\"content\":[\"text\"]}",
      "{\"content\":{}}",
      "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
      "\"message\":\"Overloaded\"}}",
      "{\"type\":7,\"content\":[],\"stop_reason\":5}",
      /* ids that are no strings, usage of every kind */
      "{\"content\":[{\"type\":\"tool_use\",\"id\":7,\"name\":\"\","
      "\"input\":{}}],\"usage\":{\"output_tokens\":3}}",
      "{\"content\":[],\"usage\":{\"cache_read_input_tokens\":4,"
      "\"input_tokens\":1.5}}",
      "{\"content\":[],\"stop_reason\":\"a_stop_reason_longer_than_thirty_one"
      "_bytes\",\"usage\":[]}",
      "{\"content\":[{\"type\":\"text\",\"text\":\"a\\u0000b\"}]}",
      "{\"content\":[]} x",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    free(read_both(true, bodies[i], strlen(bodies[i])));
}
