/* The `fusebox` command line: internal header of client/. The commands
 * (check, ir, run, and later bench/stats/ping) share the session-file
 * runner and the NumPy .npy reader/writer declared here. */
#ifndef FB_CLI_H
#define FB_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "fusebox/common.h"
#include "fusebox/counters.h"

struct json_t; /* jansson's */

/* Every counter of FB_COUNTERS (fusebox/counters.h) as one JSON object,
 * keyed by its name (cli_server.c): what `stats --json` and `run --json`
 * print. */
struct json_t *fb_cli_counters_json(const fb_counters *c);

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
/* Write a .npy array to f (opened by fb_out_open; not closed here); path
 * names it in errors. */
int fb_npy_write(FILE *f, const char *path, const fb_npy *a, char *err, size_t errlen);
void fb_npy_free(fb_npy *a);
int64_t fb_npy_numel(const fb_npy *a);

/* ---------------------------------------------------------------- .png */

/* How values become colours: a colour map ("viridis", the default, or
 * "gray") over [lo, hi] (has_range) or the field's finite min..max; and
 * how indices become pixels (taichi: 0, "matrix", row i of the field is
 * picture row i from the top; 1, "taichi", v[i][j] is i along x, j up). */
typedef struct fb_png_opts {
  int has_range;
  double lo, hi;
  const char *colormap; /* NULL: viridis */
  int taichi;
} fb_png_opts;

/* A 2-D field (n0 x n1 values, row-major) as an 8-bit RGB PNG: n0 rows of
 * n1 pixels, row 0 on top, or with o->taichi n1 rows of n0 pixels, v[i][j]
 * at column i, row n1-1-j; out-of-range values clamped, NaN magenta,
 * written to f (not closed here; path names it in errors). 0 or FB_E*
 * with err. */
int fb_png_write(FILE *f, const char *path, const double *v, int64_t n0, int64_t n1,
                 const fb_png_opts *o, char *err, size_t errlen);

/* Particles as discs on a w x h picture, as Taichi's gui.circles: n
 * positions (x, y pairs in xy) over [0, 1]^2, x from the left and y from
 * the bottom; a pixel is painted when its centre lies within radius
 * pixels of a particle's centre (the pixel under the centre always is),
 * later particles over earlier ones, no antialiasing. */
#define FB_PNG_MAX_SIDE 16384
typedef struct fb_png_particles {
  int64_t w, h;
  double radius;
  uint8_t color[3], background[3];
} fb_png_particles;
/* A position that is not finite is an error naming the particle (its
 * flat index; field names the field). 0 or FB_E* with err. */
int fb_png_write_particles(FILE *f, const char *path, const char *field, const double *xy,
                           int64_t n, const fb_png_particles *p, char *err, size_t errlen);
/* The range fb_png_write maps over. */
void fb_png_range(const double *v, int64_t n, const fb_png_opts *o, double *lo, double *hi);
int fb_png_colormap_known(const char *name);
/* Whether a file name ends in .png (any case). */
int fb_png_is_name(const char *file);

/* ---------------------------------------------------------------- outputs */

/* Files a session writes (cli_outfile.c) stay inside the output directory.
 * Why name cannot be an output name ("is an absolute path", "has a '..'
 * component", ...), or NULL when it is a relative name of a file that
 * stays beneath the directory. */
const char *fb_out_name_problem(const char *name);
/* The rule, for messages: "output names must stay inside ..." */
const char *fb_out_rule(void);
/* Open dir/name ("" or NULL dir: the current folder) for writing: name must
 * pass fb_out_name_problem; it is resolved beneath dir following no
 * symbolic link (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or an
 * O_NOFOLLOW openat walk), missing folders on the way are made, and the
 * file is created or, when it is a regular file with one link, truncated.
 * NULL with err naming the problem ("'a/x.npy': 'a' is a symbolic link; ..."). */
FILE *fb_out_open(const char *dir, const char *name, char *err, size_t errlen);
/* 1 (default): use openat2 when the kernel has it; 0: the walk only (tests). */
extern int fb_out_try_openat2;

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
/* Ctrl-C / SIGTERM (cli_interrupt.c): from now on a signal prints
 * "fusebox CMD: interrupted", stops the registered private fuseboxd, removes
 * its socket and folder and exits 128 + the signal (130 for Ctrl-C); a
 * second signal exits at once. progress_line: clear a progress line first. */
void fb_cli_on_interrupt(const char *cmd, int progress_line);
/* The private daemon to stop on a signal: *pid is read when the signal
 * comes (fb_daemon.pid, set as soon as it is forked); sock and dir (may be
 * NULL) are removed. fb_cli_interrupt_forget() before *pid goes away. */
void fb_cli_interrupt_daemon(volatile int *pid, const char *sock, const char *dir);
void fb_cli_interrupt_forget(void);
/* $FUSEBOX_SERVER (the default of --server) or NULL when unset or empty. */
const char *fb_cli_env_server(void);

#endif
