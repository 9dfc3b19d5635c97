/* The `fusebox` command line: internal header of client/. The commands
 * (check, ir, run, and later bench/stats/ping) share the session-file
 * runner and the NumPy .npy reader/writer declared here. */
#ifndef FB_CLI_H
#define FB_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "fusebox/common.h"

/* ---------------------------------------------------------------- .npy */

typedef struct fb_npy {
  fb_type type;         /* element type */
  int ndim;
  int64_t shape[8];
  void *data;           /* C order, little-endian, malloc'd */
  size_t nbytes;
} fb_npy;

/* Read a .npy file (format 1.0-3.0; C order; <f4 <f8 <i4 <i8 <u4 <u8 |b1).
 * Returns 0 or FB_EIO / FB_EPARSE / FB_EUNSUPPORTED with err filled. */
int fb_npy_read(const char *path, fb_npy *out, char *err, size_t errlen);
int fb_npy_write(const char *path, const fb_npy *a, char *err, size_t errlen);
void fb_npy_free(fb_npy *a);
int64_t fb_npy_numel(const fb_npy *a);

/* ---------------------------------------------------------------- commands */

int fb_cli_check(int argc, char **argv);
int fb_cli_ir(int argc, char **argv);
int fb_cli_run(int argc, char **argv);
int fb_cli_bench(int argc, char **argv);
int fb_cli_graph(int argc, char **argv);
int fb_cli_ping(int argc, char **argv);
int fb_cli_stats(int argc, char **argv);

/* Read a whole file (malloc'd, NUL-terminated) or NULL with errno set. */
char *fb_cli_read_file(const char *path, size_t *len);
/* Whether argv has -h or --help. */
int fb_cli_wants_help(int argc, char **argv);
/* $FUSEBOX_SERVER (the default of --server) or NULL when unset or empty. */
const char *fb_cli_env_server(void);

#endif
