/* A C client of fuseboxd through libfusebox: starts a private fuseboxd
 * (or uses the one at $FUSEBOX_SERVER), opens a session for a small
 * program, launches kernels, waits for them and reads a field back.
 *
 *   cc saxpy_client.c $(pkg-config --cflags --libs fusebox) -o saxpy_client
 *   ./saxpy_client        # prints "sum(y) = 3072 (expected 3072)", exit 0
 *
 * A launch that fails (here none should) is reported by fb_remote_sync with
 * its sequence number: the n-th launch of the session, from 1. */
#include <fusebox/client.h>
#include <stdio.h>
#include <stdlib.h>

static const char *source = "layout { dense(i: 1024) { place x: f32, y: f32 } }\n"
                            "kernel init() { for i in x { x[i] = 1.0\n y[i] = 0.0 } }\n"
                            "kernel saxpy(a: f32) { for i in x { y[i] = a * x[i] + y[i] } }\n";

int main(void) {
  char err[512];
  fb_daemon d = {0};
  const char *addr = getenv("FUSEBOX_SERVER");
  if (!addr || !*addr) { /* a private fuseboxd: $FUSEBOXD, next to us, or in PATH */
    char exe[1024];
    if (fb_daemon_start(fb_daemon_find(exe, sizeof exe), "127.0.0.1:0", NULL, &d, err,
                        sizeof err)) {
      fprintf(stderr, "cannot start fuseboxd: %s\n", err);
      return 1;
    }
    addr = d.address;
  }
  fb_client *c;
  fb_remote *r;
  int rc = 1;
  if (fb_client_connect(addr, NULL, &c, err, sizeof err)) {
    fprintf(stderr, "cannot connect to %s: %s\n", addr, err);
    goto out_daemon;
  }
  if (fb_remote_open_source(c, NULL, "saxpy.fbk", source, &r)) {
    fprintf(stderr, "cannot open a session: %s\n", fb_client_errmsg(c));
    goto out_client;
  }
  int init = fb_remote_kernel(r, "init", NULL, 0), saxpy = fb_remote_kernel(r, "saxpy", NULL, 0);
  if (init < 0 || saxpy < 0) {
    fprintf(stderr, "cannot register the kernels: %s\n", fb_remote_errmsg(r));
    goto out_session;
  }
  fb_value two = fb_value_f32(2.0f), one = fb_value_f32(1.0f);
  fb_remote_launch(r, init, NULL, 0);
  fb_remote_launch(r, saxpy, &two, 1); /* y = 2 */
  fb_remote_launch(r, saxpy, &one, 1); /* y = 3 */
  fb_sync_result res;
  if (fb_remote_sync(r, &res)) { /* every launch failure, each with its seq */
    for (int i = 0; i < res.nerrors; i++)
      fprintf(stderr, "launch #%llu failed: %s\n", (unsigned long long)res.errors[i].seq,
              res.errors[i].msg);
    fprintf(stderr, "%s\n", fb_remote_errmsg(r));
    goto out_session;
  }
  float y[1024];
  int fy = fb_remote_find_field(r, "y", 0);
  if (fy < 0 || fb_remote_field_read(r, fy, y, sizeof y)) {
    fprintf(stderr, "cannot read y: %s\n", fb_remote_errmsg(r));
    goto out_session;
  }
  double sum = 0;
  for (int i = 0; i < 1024; i++) sum += y[i];
  printf("sum(y) = %g (expected 3072)\n", sum);
  rc = sum == 3072.0 ? 0 : 1;
out_session:
  if (fb_remote_close(r) && !rc) rc = 1;
out_client:
  fb_client_close(c);
out_daemon:
  if (d.pid > 0) fb_daemon_stop(&d, 10.0, NULL);
  return rc;
}
