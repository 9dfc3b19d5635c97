/* `fusebox ping` and `fusebox stats`: the health check and the server's
 * counters, sessions and memory, from a running fuseboxd. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "fusebox/client.h"

static int connect_to(int argc, char **argv, const char *usage, int *json, fb_client **c) {
  const char *server = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--server") && i + 1 < argc) server = argv[++i];
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      fputs(usage, stdout);
      return 0;
    } else if (json && !strcmp(argv[i], "--json")) *json = 1;
    else {
      fprintf(stderr, "fusebox %s: unexpected argument '%s'\n", argv[0], argv[i]);
      fputs(usage, stderr);
      return 2;
    }
  }
  if (!server) server = fb_cli_env_server();
  if (!server) {
    fprintf(stderr, "fusebox %s: no server: give --server ADDR or set FUSEBOX_SERVER\n", argv[0]);
    fputs(usage, stderr);
    return 2;
  }
  char err[512];
  if (fb_client_connect(server, NULL, c, err, sizeof err)) {
    fprintf(stderr, "fusebox: cannot connect to %s: %s\n", server, err);
    return 1;
  }
  return -1;
}

int fb_cli_ping(int argc, char **argv) {
  static const char usage[] =
      "usage: fusebox ping [--server ADDR]\n"
      "  Sends the standard gRPC health check (grpc.health.v1.Health/Check) and\n"
      "  prints the status and the round trip. Exit 0 when the server is SERVING.\n"
      "  --server defaults to $FUSEBOX_SERVER.\n"
      "example: fusebox ping --server unix:/run/fuseboxd.sock\n";
  fb_client *c;
  int rc = connect_to(argc, argv, usage, NULL, &c);
  if (rc >= 0) return rc;
  int status = 0;
  double rtt = 0;
  rc = fb_client_ping(c, &status, &rtt);
  if (rc && status == 0)
    fprintf(stderr, "fusebox ping: %s: %s\n", fb_client_target(c), fb_client_errmsg(c));
  else
    printf("%s: %s (%.0f us)\n", fb_client_target(c), status == 1 ? "SERVING" : "NOT_SERVING",
           rtt * 1e6);
  fb_client_close(c);
  return rc ? 1 : 0;
}

/* Every counter of FB_COUNTERS under its own name: integers as JSON
 * integers, seconds as reals. */
#define FB_CLI_JSON_uint64_t(v) json_integer((json_int_t)(v))
#define FB_CLI_JSON_double(v) json_real(v)
#define FB_CLI_COUNTER_JSON_(name, type, kind, unit, meaning)                                    \
  json_object_set_new(o, #name, FB_CLI_JSON_##type(c->name));

json_t *fb_cli_counters_json(const fb_counters *c) {
  json_t *o = json_object();
  if (o) FB_COUNTERS(FB_CLI_COUNTER_JSON_)
  return o;
}

/* `stats --json`: the server, its counters and its sessions as one object. */
static int print_json(const fb_server_info *info, const fb_server_stats *st) {
  json_t *sessions = json_array();
  for (int i = 0; i < st->nsessions; i++) {
    const fb_session_stats *s = &st->sessions[i];
    json_array_append_new(sessions, json_pack("{s:s, s:b, s:f, s:I, s:o}", "tag", s->tag,
                                              "attached", s->attached, "idle_s", s->idle_s,
                                              "memory_bytes", (json_int_t)s->memory_bytes,
                                              "counters", fb_cli_counters_json(&s->counters)));
  }
  json_t *o = json_pack(
      "{s:{s:s, s:s, s:s, s:i, s:I, s:I, s:f}, s:{s:I, s:I, s:I, s:I, s:I, s:I}, s:I, s:I, s:I, "
      "s:I, "
      "s:I, s:{s:I, s:I}, s:{s:I, s:I}, s:o}",
      "server", "version", info->version, "listen", info->listen, "backend", info->backend, "cores",
      info->cores, "max_sessions", (json_int_t)info->max_sessions, "session_memory_limit",
      (json_int_t)info->session_memory_limit, "uptime_s", info->uptime_s, "sessions", "active",
      (json_int_t)st->sessions_active, "created", (json_int_t)st->sessions_created, "closed",
      (json_int_t)st->sessions_closed, "disconnected", (json_int_t)st->sessions_disconnected,
      "reaped", (json_int_t)st->sessions_reaped, "failed", (json_int_t)st->sessions_failed,
      "launches", (json_int_t)st->launches, "syncs", (json_int_t)st->syncs, "bad_requests",
      (json_int_t)st->bad_requests, "bytes_in", (json_int_t)st->bytes_in, "bytes_out",
      (json_int_t)st->bytes_out, "memory", "bytes", (json_int_t)st->memory_bytes, "peak_bytes",
      (json_int_t)st->memory_peak_bytes, "calls_refused", "max_calls",
      (json_int_t)st->calls_refused, "max_calls_per_tenant", (json_int_t)st->tenant_calls_refused,
      "session_list", sessions);
  if (!o) {
    fprintf(stderr, "fusebox stats: cannot build the JSON output\n");
    return 1;
  }
  int rc = json_dumpf(o, stdout, JSON_INDENT(2)) || fputc('\n', stdout) == EOF;
  json_decref(o);
  return rc ? 1 : 0;
}

int fb_cli_stats(int argc, char **argv) {
  static const char usage[] =
      "usage: fusebox stats [--server ADDR] [--json]\n"
      "  Prints the server (version, backend, uptime), its counters (sessions,\n"
      "  launches, syncs, bad requests, bytes, memory, calls refused past\n"
      "  max_calls / max_calls_per_tenant) and one line per session.\n"
      "  --json prints the same as one JSON object. --server defaults to\n"
      "  $FUSEBOX_SERVER.\n"
      "example: fusebox stats --server 127.0.0.1:7070 --json\n";
  fb_client *c;
  int json = 0;
  int rc = connect_to(argc, argv, usage, &json, &c);
  if (rc >= 0) return rc;
  fb_server_info info;
  fb_server_stats st;
  if (fb_client_info(c, &info) || fb_client_stats(c, &st)) {
    fprintf(stderr, "fusebox stats: %s: %s\n", fb_client_target(c), fb_client_errmsg(c));
    fb_client_close(c);
    return 1;
  }
  if (json) {
    int bad = print_json(&info, &st);
    fb_server_stats_free(&st);
    fb_client_close(c);
    return bad;
  }
  printf("fuseboxd %s on %s, backend %s, %d cores, up %.0f s\n", info.version, info.listen,
         info.backend, info.cores, info.uptime_s);
  printf("sessions: %u active, %llu created, %llu closed, %llu disconnected, %llu reaped, %llu "
         "failed\n",
         st.sessions_active, (unsigned long long)st.sessions_created,
         (unsigned long long)st.sessions_closed, (unsigned long long)st.sessions_disconnected,
         (unsigned long long)st.sessions_reaped, (unsigned long long)st.sessions_failed);
  printf("launches %llu, syncs %llu, bad requests %llu, in %llu B, out %llu B\n",
         (unsigned long long)st.launches, (unsigned long long)st.syncs,
         (unsigned long long)st.bad_requests, (unsigned long long)st.bytes_in,
         (unsigned long long)st.bytes_out);
  printf("memory: %llu B now, %llu B peak\n", (unsigned long long)st.memory_bytes,
         (unsigned long long)st.memory_peak_bytes);
  printf("calls refused at their start: %llu past max_calls, %llu past max_calls_per_tenant\n",
         (unsigned long long)st.calls_refused, (unsigned long long)st.tenant_calls_refused);
  for (int i = 0; i < st.nsessions; i++) {
    const fb_session_stats *s = &st.sessions[i];
    printf("  session %-10s %s idle %6.1f s  %10llu B  launches %llu  tasks %llu  fused %llu  "
           "fuse refused %llu  fuse fallbacks %llu\n",
           s->tag, s->attached ? "attached" : "detached", s->idle_s,
           (unsigned long long)s->memory_bytes, (unsigned long long)s->counters.launches,
           (unsigned long long)s->counters.tasks_launched,
           (unsigned long long)s->counters.tasks_fused,
           (unsigned long long)s->counters.fuse_refused,
           (unsigned long long)s->counters.fuse_fallbacks);
  }
  fb_server_stats_free(&st);
  fb_client_close(c);
  return 0;
}
