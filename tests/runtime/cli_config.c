/*
 * cli_config.c - where the program's settings come from: the proxy's options
 * from a config and the environment, and the default config file (test_cli's
 * cases; the directory, the files and the runs are cli_fixture.h's).
 */
#include "cli_fixture.h"

/* The proxy's options from a config's "proxy" section and from
 * AGENTGUARD_PROXY_*: a flag wins over the variable, the variable over the
 * file. */
Test(cli, proxy_options_from_the_config_and_the_environment) {
  const char *c =
      put("p.json", "{\"preset\": \"hpd\", \"proxy\": {\"upstream\": "
                    "\"http://127.0.0.1:9\", \"listen\": "
                    "\"127.0.0.1:0\", \"drain_timeout\": 0}}");
  result r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "listening on http://127.0.0.1:") != NULL &&
                strstr(r.err, "(upstream http://127.0.0.1:9, preset hpd)") !=
                    NULL,
            "%s", r.err);
  result_free(&r);
  setenv("AGENTGUARD_PROXY_UPSTREAM", "http://127.0.0.1:7", 1);
  r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "(upstream http://127.0.0.1:7,") != NULL,
            "the variable wins over the file: %s", r.err);
  result_free(&r);
  r = run_sig(ARGS("proxy", "--config", c, "--upstream", "http://127.0.0.1:5"),
              700);
  cr_expect(strstr(r.err, "(upstream http://127.0.0.1:5,") != NULL,
            "the flag wins: %s", r.err);
  result_free(&r);
  unsetenv("AGENTGUARD_PROXY_UPSTREAM");
  r = run(ARGS("proxy", "--config",
               put("p2.json", "{\"proxy\": {\"listne\": \"127.0.0.1:0\"}}")));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "proxy.listne: unknown key; did you mean listen?") !=
                NULL,
            "%s", r.err);
  result_free(&r);
  r = run(ARGS("proxy", "--config",
               put("p3.json", "{\"proxy\": {\"max_body\": [1]}}")));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "proxy.max_body: expected a string or a whole "
                          "number") != NULL,
            "%s", r.err);
  result_free(&r);
  r = run(ARGS("proxy"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "--upstream URL is required") != NULL, "%s", r.err);
  result_free(&r);
  /* traces: the standard variables, as the OpenTelemetry SDKs read them */
  setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9/", 1);
  r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "traces to http://127.0.0.1:9/v1/traces (OTLP/HTTP, "
                          "JSON)") != NULL,
            "%s", r.err);
  result_free(&r);
  setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:8/t", 1);
  r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "traces to http://127.0.0.1:8/t (") != NULL, "%s",
            r.err);
  result_free(&r);
  r = run_sig(ARGS("proxy", "--config", c, "--otlp-endpoint",
                   "http://127.0.0.1:7/v1/traces"),
              700);
  cr_expect(strstr(r.err, "traces to http://127.0.0.1:7/v1/traces (") != NULL,
            "the flag wins, /v1/traces not added twice: %s", r.err);
  result_free(&r);
  setenv("OTEL_SDK_DISABLED", "true", 1);
  r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "listening on") != NULL &&
                strstr(r.err, "traces to") == NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("OTEL_SDK_DISABLED");
  setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", 1);
  r = run(ARGS("proxy", "--config", c));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: agentguard "
                          "exports traces over OTLP/HTTP") != NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("OTEL_EXPORTER_OTLP_PROTOCOL");
  setenv("OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign", 1);
  r = run(ARGS("proxy", "--config", c));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "OTLP headers: expected name=value pairs") != NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("OTEL_EXPORTER_OTLP_HEADERS");
  unsetenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
  unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT");
  setenv("AGENTGUARD_PROXY_LOG_FORMAT", "yaml", 1);
  r = run(ARGS("proxy", "--config", c));
  unsetenv("AGENTGUARD_PROXY_LOG_FORMAT");
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "--log-format yaml: expected text or json") != NULL,
            "%s", r.err);
  result_free(&r);
}

/* No --config: ./agentguard.json, then $XDG_CONFIG_HOME/agentguard/
 * config.json, each said on stderr; --config wins; AGENTGUARD_NO_CONFIG
 * turns the lookup off. */
Test(cli, a_default_config_file_is_looked_for) {
  const char *here = put("agentguard.json",
                         "{\"preset\": \"hpd\", \"proxy\": {\"upstream\": "
                         "\"http://127.0.0.1:9\", \"listen\": \"127.0.0.1:0\", "
                         "\"drain_timeout\": 0}}");
  result r = run_sig(ARGS("proxy"), 700);
  cr_expect(
      strstr(r.err, "agentguard proxy: config from agentguard.json") != NULL &&
          strstr(r.err, "(upstream http://127.0.0.1:9, preset hpd)") != NULL,
      "%s", r.err);
  result_free(&r);
  r = run_sig(
      ARGS("proxy", "--config",
           put("other.json", "{\"proxy\": {\"upstream\": "
                             "\"http://127.0.0.1:8\", \"listen\": "
                             "\"127.0.0.1:0\", \"drain_timeout\": 0}}")),
      700);
  cr_expect(strstr(r.err, "config from") == NULL &&
                strstr(r.err, "(upstream http://127.0.0.1:8,") != NULL,
            "--config wins over the default file: %s", r.err);
  result_free(&r);

  char xdg[256], sub[300], moved[320];
  snprintf(xdg, sizeof xdg, "%s/xdg", dir);
  snprintf(sub, sizeof sub, "%s/agentguard", xdg);
  snprintf(moved, sizeof moved, "%s/config.json", sub);
  cr_assert_eq(mkdir(xdg, 0700), 0);
  cr_assert_eq(mkdir(sub, 0700), 0);
  cr_assert_eq(rename(here, moved), 0);
  setenv("XDG_CONFIG_HOME", xdg, 1);
  r = run_sig(ARGS("proxy"), 700);
  cr_expect(strstr(r.err, "config from ") != NULL &&
                strstr(r.err, "/xdg/agentguard/config.json") != NULL &&
                strstr(r.err, "(upstream http://127.0.0.1:9, preset hpd)") !=
                    NULL,
            "%s", r.err);
  result_free(&r);
  setenv("AGENTGUARD_NO_CONFIG", "1", 1);
  r = run(ARGS("proxy"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "config from") == NULL &&
                strstr(r.err, "--upstream URL is required") != NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("AGENTGUARD_NO_CONFIG");
  /* a default file that is broken is named, not skipped */
  FILE *f = fopen(moved, "w");
  cr_assert_not_null(f);
  fputs("preset: hpd\n", f);
  fclose(f);
  put("x.json", "{\"messages\": []}");
  r = run(ARGS("audit", "x.json"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "/xdg/agentguard/config.json") != NULL &&
                strstr(r.err, "YAML") != NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("XDG_CONFIG_HOME");
}
