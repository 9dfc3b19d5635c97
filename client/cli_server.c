/* `fusebox ping` and `fusebox stats`: the health check and the server's
 * counters, sessions and memory, from a running fuseboxd. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"
#include "fusebox/client.h"

static int connect_to(int argc, char **argv, const char *usage, fb_client **c) {
  const char *server = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--server") && i + 1 < argc) server = argv[++i];
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { fputs(usage, stdout); return 0; }
    else { fputs(usage, stderr); return 2; }
  }
  if (!server) { fputs(usage, stderr); return 2; }
  char err[512];
  if (fb_client_connect(server, NULL, c, err, sizeof err)) {
    fprintf(stderr, "fusebox: cannot connect to %s: %s\n", server, err);
    return 1;
  }
  return -1;
}

int fb_cli_ping(int argc, char **argv) {
  static const char usage[] =
      "usage: fusebox ping --server ADDR\n"
      "  Sends the standard gRPC health check (grpc.health.v1.Health/Check) and\n"
      "  prints the status and the round trip. Exit 0 when the server is SERVING.\n"
      "example: fusebox ping --server unix:/run/fuseboxd.sock\n";
  fb_client *c;
  int rc = connect_to(argc, argv, usage, &c);
  if (rc >= 0) return rc;
  int status = 0;
  double rtt = 0;
  rc = fb_client_ping(c, &status, &rtt);
  if (rc && status == 0) fprintf(stderr, "fusebox ping: %s: %s\n", fb_client_target(c), fb_client_errmsg(c));
  else printf("%s: %s (%.0f us)\n", fb_client_target(c), status == 1 ? "SERVING" : "NOT_SERVING", rtt * 1e6);
  fb_client_close(c);
  return rc ? 1 : 0;
}

int fb_cli_stats(int argc, char **argv) {
  static const char usage[] =
      "usage: fusebox stats --server ADDR\n"
      "  Prints the server (version, backend, uptime), its counters (sessions,\n"
      "  launches, syncs, bad requests, bytes, memory) and one line per session.\n"
      "example: fusebox stats --server 127.0.0.1:7070\n";
  fb_client *c;
  int rc = connect_to(argc, argv, usage, &c);
  if (rc >= 0) return rc;
  fb_server_info info;
  fb_server_stats st;
  if (fb_client_info(c, &info) || fb_client_stats(c, &st)) {
    fprintf(stderr, "fusebox stats: %s: %s\n", fb_client_target(c), fb_client_errmsg(c));
    fb_client_close(c);
    return 1;
  }
  printf("fuseboxd %s on %s, backend %s, %d cores, up %.0f s\n", info.version, info.listen,
         info.backend, info.cores, info.uptime_s);
  printf("sessions: %u active, %llu created, %llu closed, %llu disconnected, %llu reaped, %llu failed\n",
         st.sessions_active, (unsigned long long)st.sessions_created, (unsigned long long)st.sessions_closed,
         (unsigned long long)st.sessions_disconnected, (unsigned long long)st.sessions_reaped,
         (unsigned long long)st.sessions_failed);
  printf("launches %llu, syncs %llu, bad requests %llu, in %llu B, out %llu B\n",
         (unsigned long long)st.launches, (unsigned long long)st.syncs,
         (unsigned long long)st.bad_requests, (unsigned long long)st.bytes_in,
         (unsigned long long)st.bytes_out);
  printf("memory: %llu B now, %llu B peak\n", (unsigned long long)st.memory_bytes,
         (unsigned long long)st.memory_peak_bytes);
  for (int i = 0; i < st.nsessions; i++) {
    const fb_session_stats *s = &st.sessions[i];
    printf("  session %-10s %s idle %6.1f s  %10llu B  launches %llu  tasks %llu  fused %llu\n", s->tag,
           s->attached ? "attached" : "detached", s->idle_s, (unsigned long long)s->memory_bytes,
           (unsigned long long)s->counters.launches, (unsigned long long)s->counters.tasks_launched,
           (unsigned long long)s->counters.tasks_fused);
  }
  fb_server_stats_free(&st);
  fb_client_close(c);
  return 0;
}
