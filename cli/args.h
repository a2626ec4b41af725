/*
 * cli/args.h - what the commands share: options with a value, exit codes,
 * the events file.
 */
#ifndef AG_CLI_ARGS_H
#define AG_CLI_ARGS_H

#include <stddef.h>
#include <stdio.h>

#include "agentguard.h"

/*
 * Options that take a value, "--name VALUE" or "--name=VALUE". When argv[*i]
 * is one of names[0..n), stores its value in *slots[k] (moving *i past a
 * separate value) and returns 1; returns 0 when it is none of them; returns
 * -1 with a message in msg[0..cap) when the value is missing or empty, or
 * the option was given before.
 */
int cli_value_option(int argc, char **argv, int *i, const char *const *names,
                     const char **const *slots, size_t n, char *msg,
                     size_t cap);

/* A bad invocation, answered the same way by every command: "agentguard
 * CMD: <message>" and "(see 'agentguard help CMD')" on stderr. Returns
 * AG_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/*
 * The config file a command reads when it was given no --config: the first
 * of ./agentguard.json and $XDG_CONFIG_HOME/agentguard/config.json
 * (~/.config/agentguard/config.json when XDG_CONFIG_HOME is unset or not
 * absolute) that exists, written into buf[0..cap); NULL when there is none
 * or AGENTGUARD_NO_CONFIG is set to anything but "" or "0". `run`, `proxy`
 * and `audit` read it and say so on stderr; `simulate` never does (a
 * scenario carries its config). docs/configuration.md, "Where the config
 * comes from".
 */
const char *cli_default_config(char *buf, size_t cap);

/* When *config is NULL (no --config), points it at cli_default_config's
 * file, if any, and says "agentguard CMD: config from PATH" on stderr. */
void cli_use_default_config(const char *cmd, const char **config, char *buf,
                            size_t cap);

/*
 * Where OpenTelemetry traces go (docs/proxy.md, "Traces"): `endpoint` (a
 * command's --otlp-endpoint, or NULL) is a base URL, as
 * OTEL_EXPORTER_OTLP_ENDPOINT is, to which /v1/traces is added (unless it
 * ends so); without it OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, else
 * OTEL_EXPORTER_OTLP_ENDPOINT, unless OTEL_SDK_DISABLED=true or
 * OTEL_TRACES_EXPORTER=none. The whole URL goes to url (cap bytes), the
 * headers (OTEL_EXPORTER_OTLP_[TRACES_]HEADERS) and OTEL_SERVICE_NAME to
 * *headers and *service (NULL when unset). Returns 0 (traces on), -1 (no
 * traces), or 1 with msg filled (OTEL_EXPORTER_OTLP_PROTOCOL=grpc, a URL
 * too long).
 */
int cli_otlp(const char *endpoint, char *url, size_t cap, const char **headers,
             const char **service, char *msg, size_t msgcap);

/* The exit code (docs/cli.md) for a turn's status. */
int cli_exit_code(ag_turn_status s);

/* Opens an events file for writing (created or truncated, close-on-exec,
 * append mode: every line cli_write_event writes lands whole at the end,
 * even beside another writer); "-" is stdout. NULL with errno set when it
 * cannot be opened. Write to it only with cli_write_event. */
FILE *cli_open_events(const char *path);

/* Writes `ev` to `f` as one line of JSON Lines (compact, then '\n') with
 * one write(2) on its descriptor, not through stdio's buffer, after
 * flushing what stdio holds for `f` (stdout may carry the timeline too).
 * A process killed meanwhile loses at most the line being written, never a
 * line before it; only a short write, which a full disk can cause, splits
 * the line into more write calls. Returns 0, or the errno value of the
 * failure (ENOMEM when the line cannot be built). */
int cli_write_event(FILE *f, const json_t *ev);

#endif /* AG_CLI_ARGS_H */
