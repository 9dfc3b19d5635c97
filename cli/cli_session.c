/* JSON session files: strict schema (unknown keys are errors naming their
 * JSON path), ${param} substitution in the program text and in values, and
 * the runner for setup / step / checks on an engine session. */
#define _GNU_SOURCE
#include "cli/cli_session.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/map.h"
#include "cli/cli.h"
#include "fusebox/client.h"

/* ---------------------------------------------------------------- errors */

static int errf(char **err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *m = NULL;
  if (vasprintf(&m, fmt, ap) < 0) m = NULL;
  va_end(ap);
  free(*err);
  *err = m;
  return code;
}

/* ---------------------------------------------------------------- schema */

typedef struct schema_ctx {
  char **err;
} schema_ctx;

static int only_keys(json_t *obj, const char *path, const char *const *keys, char **err) {
  if (!json_is_object(obj)) return errf(err, FB_EINVAL, "%s: expected an object", path);
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    int ok = 0;
    for (int i = 0; keys[i]; i++) ok |= strcmp(keys[i], k) == 0;
    if (!ok) {
      char allowed[512] = "";
      size_t o = 0;
      for (int i = 0; keys[i] && o < sizeof allowed; i++)
        o += (size_t)snprintf(allowed + o, sizeof allowed - o, "%s%s", i ? ", " : "", keys[i]);
      return errf(err, FB_EINVAL, "%s.%s: unknown key (expected one of: %s)", path, k, allowed);
    }
  }
  return 0;
}

static const char *const top_keys[] = {"name",  "program", "source", "params", "session",
                                       "setup", "step",    "bench",  "checks", NULL};
static const char *const session_keys[] = {
    "backend",         "mode", "passes",       "flush_every", "max_fuse_per_task",
    "compile_threads", "seed", "memory_limit", "resume", NULL};
static const char *const pass_keys[] = {"listgen", "demote", "fusion", "dse", NULL};
static const char *const bench_keys[] = {"warmup", "repeat", "modes", NULL};

static int check_actions(json_t *list, const char *path, char **err);

/* The {step} placeholders of a save's file name: "{step}" or "{step:0Nd}"
 * (zero-padded to N digits, as Python's format); the width, 0 for none,
 * -1 when malformed. *len gets the placeholder's length. */
static int step_placeholder(const char *p, size_t *len) {
  if (!strncmp(p, "{step}", 6)) {
    *len = 6;
    return 0;
  }
  int width = 0, n = 0;
  if (!strncmp(p, "{step:0", 7) && isdigit((unsigned char)p[7]) &&
      sscanf(p, "{step:0%2dd}%n", &width, &n) == 1 && n > 0 && width >= 1 && width <= 20) {
    *len = (size_t)n;
    return width;
  }
  return -1;
}

/* A colour: "#rrggbb" or [r, g, b], integers 0..255. */
static int parse_rgb(json_t *v, uint8_t rgb[3]) {
  if (json_is_string(v)) {
    const char *s = json_string_value(v);
    unsigned c[3];
    int n = 0;
    if (strlen(s) != 7 || s[0] != '#' || strspn(s + 1, "0123456789abcdefABCDEF") != 6 ||
        sscanf(s + 1, "%2x%2x%2x%n", &c[0], &c[1], &c[2], &n) != 3 || n != 6)
      return -1;
    for (int i = 0; i < 3; i++) rgb[i] = (uint8_t)c[i];
    return 0;
  }
  if (!json_is_array(v) || json_array_size(v) != 3) return -1;
  for (size_t i = 0; i < 3; i++) {
    json_t *c = json_array_get(v, i);
    if (!json_is_integer(c) || json_integer_value(c) < 0 || json_integer_value(c) > 255) return -1;
    rgb[i] = (uint8_t)json_integer_value(c);
  }
  return 0;
}

/* "particles" of a save (or a check's "to"): {"size": [w, h], "radius": r,
 * "color": C, "background": C}, all optional; defaults as Taichi's GUI:
 * 512 x 512, radius 1, white on black. */
static int particles_spec(json_t *pt, const char *path, fb_png_particles *out, char **err) {
  static const char *const keys[] = {"size", "radius", "color", "background", NULL};
  char sub[1100];
  snprintf(sub, sizeof sub, "%.1000s.particles", path);
  int rc = only_keys(pt, sub, keys, err);
  if (rc) return rc;
  *out = (fb_png_particles){.w = 512, .h = 512, .radius = 1, .color = {255, 255, 255}};
  json_t *size = json_object_get(pt, "size"), *rad = json_object_get(pt, "radius");
  if (size) {
    json_t *w = json_array_get(size, 0), *h = json_array_get(size, 1);
    if (!json_is_array(size) || json_array_size(size) != 2 || !json_is_integer(w) ||
        !json_is_integer(h) || json_integer_value(w) < 1 || json_integer_value(h) < 1 ||
        json_integer_value(w) > FB_PNG_MAX_SIDE || json_integer_value(h) > FB_PNG_MAX_SIDE)
      return errf(err, FB_EINVAL,
                  "%s.size: expected [width, height] in pixels, each 1 to %d", sub,
                  FB_PNG_MAX_SIDE);
    out->w = json_integer_value(w);
    out->h = json_integer_value(h);
  }
  if (rad) {
    if (!json_is_number(rad) || !(json_number_value(rad) >= 0) ||
        !isfinite(json_number_value(rad)))
      return errf(err, FB_EINVAL, "%s.radius: expected a number of pixels >= 0", sub);
    out->radius = json_number_value(rad);
  }
  static const char *const cols[] = {"color", "background"};
  for (int i = 0; i < 2; i++) {
    json_t *c = json_object_get(pt, cols[i]);
    if (c && parse_rgb(c, i ? out->background : out->color))
      return errf(err, FB_EINVAL, "%s.%s: expected \"#rrggbb\" or [r, g, b] (0 to 255)", sub,
                  cols[i]);
  }
  return 0;
}

/* "orientation": 1 for "taichi", 0 for "matrix" or none, -1 otherwise. */
static int orientation_taichi(json_t *o) {
  if (!o) return 0;
  const char *s = json_string_value(o);
  return s && !strcmp(s, "taichi") ? 1 : s && !strcmp(s, "matrix") ? 0 : -1;
}

/* "to", "range", "colormap", "orientation" and "particles" of a save
 * action or a check's "to". */
static int check_output(json_t *a, const char *path, int require_ext, char **err) {
  json_t *to = json_object_get(a, "to");
  if (!json_is_string(to)) return errf(err, FB_EINVAL, "%s.to: expected a file name", path);
  const char *t = json_string_value(to);
  size_t n = strlen(t);
  int png = fb_png_is_name(t);
  const char *why = fb_out_name_problem(t);
  if (why) /* a shared session file must not write outside -o DIR */
    return errf(err, FB_EINVAL, "%s.to: '%s' %s; %s", path, t, why, fb_out_rule());
  if (require_ext && !png && !(n > 4 && !strcmp(t + n - 4, ".npy")))
    return errf(err, FB_EINVAL, "%s.to: '%s': expected a file name ending in .npy or .png", path,
                t);
  for (const char *p = strchr(t, '{'); require_ext && p; p = strchr(p + 1, '{')) {
    size_t len;
    if (step_placeholder(p, &len) < 0)
      return errf(err, FB_EINVAL,
                  "%s.to: '%s': unknown placeholder (use {step}, or {step:05d} for 00100)", path,
                  t);
  }
  json_t *range = json_object_get(a, "range"), *cmap = json_object_get(a, "colormap");
  json_t *orient = json_object_get(a, "orientation"), *pt = json_object_get(a, "particles");
  if ((range || cmap || orient || pt) && !png)
    return errf(err, FB_EINVAL, "%s.%s: only for a picture (\"to\" ending in .png)", path,
                range ? "range" : cmap ? "colormap" : orient ? "orientation" : "particles");
  if (orient && orientation_taichi(orient) < 0)
    return errf(err, FB_EINVAL,
                "%s.orientation: expected \"matrix\" (first index down the rows, the "
                "default) or \"taichi\" (first index along x, second upward)",
                path);
  if (pt) {
    fb_png_particles spec;
    int rc = particles_spec(pt, path, &spec, err);
    if (rc) return rc;
    if (range || cmap || orient)
      return errf(err, FB_EINVAL,
                  "%s.%s: not for particles (they are drawn in one colour, x from the left and "
                  "y from the bottom)",
                  path, range ? "range" : cmap ? "colormap" : "orientation");
  }
  if (range &&
      (!json_is_array(range) || json_array_size(range) != 2 ||
       !json_is_number(json_array_get(range, 0)) || !json_is_number(json_array_get(range, 1)) ||
       !(json_number_value(json_array_get(range, 0)) <
         json_number_value(json_array_get(range, 1)))))
    return errf(err, FB_EINVAL, "%s.range: expected [lo, hi], two numbers with lo < hi", path);
  if (cmap && (!json_is_string(cmap) || !fb_png_colormap_known(json_string_value(cmap))))
    return errf(err, FB_EINVAL, "%s.colormap: expected \"viridis\" or \"gray\"", path);
  return 0;
}

static int check_action(json_t *a, const char *path, char **err) {
  static const char *const launch_k[] = {"launch", "args", NULL};
  static const char *const write_k[] = {"write", "from", NULL};
  static const char *const repeat_k[] = {"repeat", "do", NULL};
  static const char *const tape_k[] = {"tape", "do", NULL};
  static const char *const flush_k[] = {"flush", NULL};
  static const char *const sync_k[] = {"sync", NULL};
  static const char *const ckpt_k[] = {"checkpoint", NULL};
  static const char *const save_k[] = {"save",     "to",          "every",     "range",
                                       "colormap", "orientation", "particles", NULL};
  static const char *const cells_k[][3] = {{"activate", "cells", NULL},
                                           {"deactivate", "cells", NULL}};
  static const char *const all_k[] = {"deactivate_all", NULL};
  if (!json_is_object(a)) return errf(err, FB_EINVAL, "%s: expected an action object", path);
  for (int op = 0; op < 2; op++) {
    if (!json_object_get(a, cells_k[op][0])) continue;
    int rc = only_keys(a, path, cells_k[op], err);
    if (rc) return rc;
    if (!json_is_string(json_object_get(a, cells_k[op][0])))
      return errf(err, FB_EINVAL, "%s.%s: expected a field or named SNode", path, cells_k[op][0]);
    json_t *cells = json_object_get(a, "cells"), *c;
    size_t i, j;
    if (!json_is_array(cells))
      return errf(err, FB_EINVAL, "%s.cells: expected an array of cells, each an array of indices",
                  path);
    json_array_foreach(cells, i, c) {
      json_t *x;
      if (!json_is_array(c))
        return errf(err, FB_EINVAL, "%s.cells[%zu]: expected an array of indices", path, i);
      json_array_foreach(c, j, x) if (!json_is_integer(x)) return errf(
          err, FB_EINVAL, "%s.cells[%zu][%zu]: an index must be an integer", path, i, j);
    }
    return 0;
  }
  if (json_object_get(a, "deactivate_all")) {
    int rc = only_keys(a, path, all_k, err);
    if (!rc && !json_is_string(json_object_get(a, "deactivate_all")))
      rc = errf(err, FB_EINVAL, "%s.deactivate_all: expected a field or named SNode", path);
    return rc;
  }
  if (json_object_get(a, "save")) {
    int rc = only_keys(a, path, save_k, err);
    if (rc) return rc;
    if (!json_is_string(json_object_get(a, "save")))
      return errf(err, FB_EINVAL, "%s.save: expected a field name", path);
    json_t *every = json_object_get(a, "every");
    if (every && (!json_is_integer(every) || json_integer_value(every) < 1))
      return errf(err, FB_EINVAL, "%s.every: expected a count >= 1 (save every N-th time)", path);
    return check_output(a, path, 1, err);
  }
  if (json_object_get(a, "launch")) {
    int rc = only_keys(a, path, launch_k, err);
    if (rc) return rc;
    if (!json_is_string(json_object_get(a, "launch")))
      return errf(err, FB_EINVAL, "%s.launch: expected a kernel name", path);
    json_t *args = json_object_get(a, "args");
    if (args && !json_is_array(args))
      return errf(err, FB_EINVAL, "%s.args: expected an array", path);
    return 0;
  }
  if (json_object_get(a, "write")) {
    int rc = only_keys(a, path, write_k, err);
    if (rc) return rc;
    if (!json_is_string(json_object_get(a, "write")) || !json_is_string(json_object_get(a, "from")))
      return errf(err, FB_EINVAL, "%s: write needs a field name and \"from\": a .npy path", path);
    return 0;
  }
  if (json_object_get(a, "repeat")) {
    int rc = only_keys(a, path, repeat_k, err);
    if (rc) return rc;
    if (!json_is_integer(json_object_get(a, "repeat")) ||
        json_integer_value(json_object_get(a, "repeat")) < 0)
      return errf(err, FB_EINVAL, "%s.repeat: expected a count >= 0", path);
    char sub[1024];
    snprintf(sub, sizeof sub, "%.1000s.do", path);
    return check_actions(json_object_get(a, "do"), sub, err);
  }
  if (json_object_get(a, "tape")) {
    int rc = only_keys(a, path, tape_k, err);
    if (rc) return rc;
    if (!json_is_string(json_object_get(a, "tape")))
      return errf(err, FB_EINVAL, "%s.tape: expected the loss's field name", path);
    if (!json_is_array(json_object_get(a, "do")))
      return errf(err, FB_EINVAL, "%s.do: a tape needs the actions it records", path);
    char sub[1024];
    snprintf(sub, sizeof sub, "%.1000s.do", path);
    return check_actions(json_object_get(a, "do"), sub, err);
  }
  if (json_object_get(a, "flush")) return only_keys(a, path, flush_k, err);
  if (json_object_get(a, "sync")) return only_keys(a, path, sync_k, err);
  if (json_object_get(a, "checkpoint")) {
    int rc = only_keys(a, path, ckpt_k, err);
    if (!rc && !json_is_string(json_object_get(a, "checkpoint")))
      rc = errf(err, FB_EINVAL, "%s.checkpoint: expected a file name", path);
    return rc;
  }
  const char *k = json_object_iter_key(json_object_iter(a));
  return errf(err, FB_EINVAL,
              "%s%s%s: unknown action (expected launch, write, save, activate, deactivate, "
              "deactivate_all, repeat, tape, flush, sync or checkpoint)",
              path,
              k ? "." : "", k ? k : "");
}

static int check_actions(json_t *list, const char *path, char **err) {
  if (!list) return 0;
  if (!json_is_array(list)) return errf(err, FB_EINVAL, "%s: expected an array of actions", path);
  size_t i;
  json_t *a;
  json_array_foreach(list, i, a) {
    char sub[1024];
    snprintf(sub, sizeof sub, "%s[%zu]", path, i);
    int rc = check_action(a, sub, err);
    if (rc) return rc;
  }
  return 0;
}

static int check_checks(json_t *list, char **err) {
  static const char *const read_k[] = {"read",     "sum",         "equals",    "min", "max",
                                       "rtol",     "atol",        "to",        "range",
                                       "colormap", "orientation", "particles", NULL};
  static const char *const same_k[] = {"same_across_modes", "rtol", "atol", NULL};
  if (!list) return 0;
  if (!json_is_array(list)) return errf(err, FB_EINVAL, "$.checks: expected an array");
  size_t i;
  json_t *c;
  json_array_foreach(list, i, c) {
    char path[64];
    snprintf(path, sizeof path, "$.checks[%zu]", i);
    if (json_object_get(c, "same_across_modes")) {
      int rc = only_keys(c, path, same_k, err);
      if (rc) return rc;
      continue;
    }
    int rc = only_keys(c, path, read_k, err);
    if (rc) return rc;
    if (!json_is_string(json_object_get(c, "read")))
      return errf(err, FB_EINVAL, "%s: a check needs \"read\": FIELD or \"same_across_modes\"",
                  path);
    if ((json_object_get(c, "to") || json_object_get(c, "range") ||
         json_object_get(c, "colormap") || json_object_get(c, "orientation") ||
         json_object_get(c, "particles")) &&
        (rc = check_output(c, path, 0, err)))
      return rc;
  }
  return 0;
}

static int check_schema(json_t *root, char **err) {
  int rc = only_keys(root, "$", top_keys, err);
  if (rc) return rc;
  if (!!json_object_get(root, "program") == !!json_object_get(root, "source"))
    return errf(err, FB_EINVAL, "$: give exactly one of \"program\" (a .fbk path) or \"source\"");
  json_t *s = json_object_get(root, "session");
  if (s && (rc = only_keys(s, "$.session", session_keys, err))) return rc;
  if (s && json_object_get(s, "passes") &&
      (rc = only_keys(json_object_get(s, "passes"), "$.session.passes", pass_keys, err)))
    return rc;
  if (s && json_object_get(s, "resume") && !json_is_string(json_object_get(s, "resume")))
    return errf(err, FB_EINVAL, "$.session.resume: expected the path of a checkpoint file");
  json_t *b = json_object_get(root, "bench");
  if (b && (rc = only_keys(b, "$.bench", bench_keys, err))) return rc;
  if ((rc = check_actions(json_object_get(root, "setup"), "$.setup", err))) return rc;
  if ((rc = check_actions(json_object_get(root, "step"), "$.step", err))) return rc;
  return check_checks(json_object_get(root, "checks"), err);
}

/* ---------------------------------------------------------------- params */

static int param_text(json_t *v, char *buf, size_t n) {
  if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
  else if (json_is_real(v)) snprintf(buf, n, "%.17g", json_real_value(v));
  else if (json_is_string(v)) snprintf(buf, n, "%s", json_string_value(v));
  else if (json_is_boolean(v)) snprintf(buf, n, "%s", json_is_true(v) ? "true" : "false");
  else return -1;
  return 0;
}

/* Replace every ${NAME} in text; NULL with err set on an unknown name. */
char *fb_sess_subst(const char *text, json_t *params, const char *where, char **err) {
  size_t cap = strlen(text) + 64, n = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  for (const char *p = text; *p;) {
    const char *q = p[0] == '$' && p[1] == '{' ? strchr(p, '}') : NULL;
    char val[128];
    const char *piece = p;
    size_t plen = 1;
    if (q) {
      char name[128];
      snprintf(name, sizeof name, "%.*s", (int)(q - p - 2), p + 2);
      json_t *v = params ? json_object_get(params, name) : NULL;
      if (!v || param_text(v, val, sizeof val)) {
        errf(err, FB_EINVAL, "%s: ${%s} is not a parameter (see \"params\")", where, name);
        free(out);
        return NULL;
      }
      piece = val;
      plen = strlen(val);
      p = q + 1;
    } else {
      p++;
    }
    if (n + plen + 1 > cap) {
      cap = (n + plen + 1) * 2;
      char *o = realloc(out, cap);
      if (!o) {
        free(out);
        return NULL;
      }
      out = o;
    }
    memcpy(out + n, piece, plen);
    n += plen;
  }
  out[n] = 0;
  return out;
}

/* Substitute params throughout a JSON value in place: a string that is a
 * single ${NAME} becomes the parameter's value (so numbers can be
 * parameters), other strings are substituted as text. */
static json_t *subst_json(json_t *v, json_t *params, const char *path, char **err) {
  if (json_is_string(v)) {
    const char *s = json_string_value(v);
    if (!strstr(s, "${")) return json_incref(v);
    size_t len = strlen(s);
    if (s[0] == '$' && s[1] == '{' && s[len - 1] == '}' && !memchr(s + 2, '}', len - 3)) {
      char name[128];
      snprintf(name, sizeof name, "%.*s", (int)(len - 3), s + 2);
      json_t *p = params ? json_object_get(params, name) : NULL;
      if (!p) {
        errf(err, FB_EINVAL, "%s: ${%s} is not a parameter (see \"params\")", path, name);
        return NULL;
      }
      return json_deep_copy(p);
    }
    char *t = fb_sess_subst(s, params, path, err);
    if (!t) return NULL;
    json_t *r = json_string(t);
    free(t);
    return r;
  }
  if (json_is_array(v)) {
    json_t *r = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
      char sub[1024];
      snprintf(sub, sizeof sub, "%s[%zu]", path, i);
      json_t *c = subst_json(e, params, sub, err);
      if (!c) {
        json_decref(r);
        return NULL;
      }
      json_array_append_new(r, c);
    }
    return r;
  }
  if (json_is_object(v)) {
    json_t *r = json_object();
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e) {
      char sub[1024];
      snprintf(sub, sizeof sub, "%s.%s", path, k);
      json_t *c = subst_json(e, params, sub, err);
      if (!c) {
        json_decref(r);
        return NULL;
      }
      json_object_set_new(r, k, c);
    }
    return r;
  }
  return json_incref(v);
}

/* ---------------------------------------------------------------- loading */

/* --param NAME=VALUE: VALUE as a JSON number when it reads as one. */
int fb_cli_add_param(json_t *params, const char *arg) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg) {
    fprintf(stderr, "fusebox: --param wants NAME=VALUE, got '%s'\n", arg);
    return -1;
  }
  char *name = strndup(arg, (size_t)(eq - arg)), *end;
  double d = strtod(eq + 1, &end);
  errno = 0;
  long long i = strtoll(eq + 1, NULL, 10);
  /* an integer beyond JSON's (jansson's) range stays a decimal string, which
   * integer parameters accept ("${N}" for a u64 above 2^63-1) */
  json_t *v = *end || end == eq + 1 ? json_string(eq + 1)
              : strchr(eq + 1, '.') || strchr(eq + 1, 'e') || strchr(eq + 1, 'E') ? json_real(d)
              : errno == ERANGE ? json_string(eq + 1)
                                : json_integer(i);
  json_object_set_new(params, name, v);
  free(name);
  return 0;
}

static char *join_path(const char *dir, const char *rel) {
  char *p = NULL;
  if (rel[0] == '/' || !dir[0]) return strdup(rel);
  if (asprintf(&p, "%s/%s", dir, rel) < 0) return NULL;
  return p;
}

static int load_program(fb_sess_file *f, json_t *params, char **err) {
  json_t *prog = json_object_get(f->root, "program");
  char *text;
  if (prog) {
    if (!json_is_string(prog)) return errf(err, FB_EINVAL, "$.program: expected a path");
    f->program_path = join_path(f->dir, json_string_value(prog));
    text = fb_cli_read_file(f->program_path, NULL);
    if (!text)
      return errf(err, FB_EIO, "%s: %s (from $.program)", f->program_path, strerror(errno));
  } else {
    json_t *src = json_object_get(f->root, "source");
    if (!json_is_string(src)) return errf(err, FB_EINVAL, "$.source: expected program text");
    text = strdup(json_string_value(src));
  }
  f->source = fb_sess_subst(text, params, f->program_path ? f->program_path : "$.source", err);
  free(text);
  if (!f->source) return FB_EINVAL;
  fb_diags d;
  fb_diags_init(&d);
  const char *fname = f->program_path ? f->program_path : "<source>";
  int rc = fb_program_parse(fname, f->source, &f->prog, &d);
  if (rc) {
    char *r = fb_diags_render(fname, f->source, &d);
    errf(err, rc, "%s", r ? r : "the program does not parse");
    free(r);
  }
  fb_diags_free(&d);
  return rc;
}

/* What the program must have for an output: the field, and for a .png a
 * 2-D field of scalars. */
static int check_output_field(const fb_program *prog, json_t *a, const char *key, const char *path,
                              char **err) {
  const char *name = json_string_value(json_object_get(a, key));
  json_t *to = json_object_get(a, "to");
  if (!name || !to) return 0;
  int fi = fb_program_find_field(prog, name);
  if (fi < 0)
    return errf(err, FB_ENOENT, "%s.%s: no field named '%s' in the program", path, key, name);
  const fb_lang_field *fld = fb_program_field(prog, fi);
  if (json_object_get(a, "particles")) {
    if (fld->rows != 2 || fld->cols != 0)
      return errf(err, FB_EINVAL,
                  "%s.particles: particles need a field of 2-vectors (x, y); '%s' holds %s", path,
                  name, fld->cols ? "matrices" : fld->rows ? "vectors of another size" : "scalars");
    return 0;
  }
  if (fb_png_is_name(json_string_value(to)) && (fld->ndim != 2 || fld->ncomp != 1))
    return errf(err, FB_EINVAL,
                "%s.to: a picture needs a 2-D field of scalars; '%s' has %d ind%s%s", path, name,
                fld->ndim, fld->ndim == 1 ? "ex" : "ices", fld->ncomp > 1 ? " and components" : "");
  return 0;
}

/* activate / deactivate / deactivate_all: a field or named SNode of the
 * program, and cells of its index count. */
static int check_host_target(const fb_program *prog, json_t *a, const char *path, char **err) {
  static const char *const keys[] = {"activate", "deactivate", "deactivate_all"};
  for (int k = 0; k < 3; k++) {
    const char *name = json_string_value(json_object_get(a, keys[k]));
    if (!name) continue;
    char msg[512];
    int sn, nd, rc = fb_host_target(prog, name, &sn, &nd, msg, sizeof msg);
    if (rc) return errf(err, rc, "%s.%s: %s", path, keys[k], msg);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(a, "cells"), i, c) {
      if (json_array_size(c) != (size_t)nd)
        return errf(err, FB_EINVAL, "%s.cells[%zu]: '%s' takes %d ind%s, %zu given", path, i,
                    name, nd, nd == 1 ? "ex" : "ices", json_array_size(c));
    }
  }
  return 0;
}

static int check_saves(const fb_program *prog, json_t *list, const char *path, char **err) {
  size_t i;
  json_t *a;
  json_array_foreach(list, i, a) {
    char sub[1024];
    snprintf(sub, sizeof sub, "%.1000s[%zu]", path, i);
    int rc = check_output_field(prog, a, "save", sub, err);
    if (!rc) rc = check_host_target(prog, a, sub, err);
    if (!rc && (json_object_get(a, "repeat") || json_object_get(a, "tape"))) {
      snprintf(sub + strlen(sub), sizeof sub - strlen(sub), ".do");
      rc = check_saves(prog, json_object_get(a, "do"), sub, err);
    }
    if (rc) return rc;
  }
  return 0;
}

static int check_outputs(const fb_program *prog, json_t *root, char **err) {
  int rc = check_saves(prog, json_object_get(root, "setup"), "$.setup", err);
  if (!rc) rc = check_saves(prog, json_object_get(root, "step"), "$.step", err);
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(root, "checks"), i, c) {
    char sub[64];
    snprintf(sub, sizeof sub, "$.checks[%zu]", i);
    if (!rc) rc = check_output_field(prog, c, "read", sub, err);
  }
  return rc;
}

int fb_sess_load(const char *path, json_t *overrides, fb_sess_file *f, char **err) {
  memset(f, 0, sizeof *f);
  f->path = strdup(path);
  const char *slash = strrchr(path, '/');
  f->dir = slash ? strndup(path, (size_t)(slash - path)) : strdup("");
  json_error_t je;
  json_t *raw = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!raw)
    return errf(err, je.line > 0 ? FB_EPARSE : FB_EIO, "%s:%d:%d: %s", path, je.line, je.column,
                je.text);
  json_t *params = json_is_object(raw) ? json_object_get(raw, "params") : NULL;
  if (params && !json_is_object(params)) {
    json_decref(raw);
    return errf(err, FB_EINVAL, "%s: $.params: expected an object of name: value", path);
  }
  if (overrides && json_object_size(overrides)) { /* --param NAME=VALUE wins */
    if (!params) json_object_set_new(raw, "params", json_object());
    params = json_object_get(raw, "params");
    json_object_update(params, overrides);
  }
  /* Parameters first, so that "${N}" can stand where a number belongs. */
  f->root = subst_json(raw, params, "$", err);
  if (!f->root) {
    json_decref(raw);
    return errf(err, FB_EINVAL, "%s: %s", path, *err);
  }
  int rc = check_schema(f->root, err);
  if (rc) {
    json_decref(raw);
    return errf(err, rc, "%s: %s", path, *err);
  }
  rc = load_program(f, params, err);
  if (!rc && (rc = check_outputs(f->prog, f->root, err))) errf(err, rc, "%s: %s", path, *err);
  json_decref(raw);
  json_t *name = json_object_get(f->root, "name");
  f->name = strdup(json_is_string(name) ? json_string_value(name) : path);
  return rc;
}

void fb_sess_free(fb_sess_file *f) {
  if (f->prog) fb_program_free(f->prog);
  json_decref(f->root);
  free(f->path);
  free(f->dir);
  free(f->name);
  free(f->program_path);
  free(f->source);
  memset(f, 0, sizeof *f);
}

/* ---------------------------------------------------------------- running */

typedef struct kcache {
  const fb_kernel *ir;
  int id;
} kcache;

/* A running session: in-process (eng, s) or on a fuseboxd (cli, rem),
 * possibly a private one this process started (daemon). */
/* One action of the file, as the runner last resolved it (see acts). */
typedef struct act_memo {
  uint32_t path; /* its path, in r->paths */
  int id;        /* >= 0: an in-process launch of kernel id, resolved: */
  int nv;        /* its scalar arguments */
  fb_value *vals;
  char *kname;  /* the kernel's name in messages */
  fb_type ret;  /* what it returns */
} act_memo;

/* ---------------------------------------------------------------- where a session runs
 * The runner asks the same things of a session in this process (the
 * engine) and of one on a fuseboxd (libfusebox): one table of those
 * operations, with an implementation for each place (local_place,
 * remote_place, below), chosen once in fb_sess_start. Every place the two
 * differ is a line of the table, not an `if` among the actions. */
typedef struct launch_req { /* a "launch" action, its kernel and arguments checked */
  json_t *a;
  uint32_t *ix; /* its memo (r->act), NULL when run outside a list */
  const char *name;
  const fb_lang_kernel *lk;
  const char **binds;
  int nb;
  const fb_value *vals;
  int nv;
  int grad; /* 1: "k.grad", 2: "k.dual" */
} launch_req;

typedef struct sess_place {
  /* the session: new, or from the checkpoint `resume` (a file) */
  int (*open)(fb_sess_run *r, json_t *sc, const char *mode, const fb_session_config *cfg,
              const char *resume, char **err);
  const char *(*errmsg)(const fb_sess_run *r);
  void (*backend)(fb_sess_run *r, char *buf, size_t n);
  void (*device)(fb_sess_run *r, char *buf, size_t n);
  /* register (first time) and launch; a launch the checkpoint holds is noted and passed over */
  int (*launch)(fb_sess_run *r, const launch_req *q, const char *path, char **err);
  /* activate / deactivate / deactivate_all: what the cells' launches need
   * (the local kernel's id), then one cell's launch (after its bounds) */
  int (*host_begin)(fb_sess_run *r, fb_host_op op, const char *target, const char *path,
                    char **err);
  int (*host_cell)(fb_sess_run *r, fb_host_op op, const char *target, int id, const int64_t *idx,
                   const fb_value *vals, int nidx, const char *path, const char *sub, char **err);
  /* {"tape": loss, "do": body}: body's launches recorded, then the gradients */
  int (*tape)(fb_sess_run *r, int loss_place, json_t *body, const char *sub, const char *end,
              const char *path, char **err);
  /* before the host touches fields: a launch before that failed is named */
  int (*settle)(fb_sess_run *r, const char *path, char **err);
  int (*field_read)(fb_sess_run *r, int place, void *dst, size_t bytes);
  int (*field_write)(fb_sess_run *r, int place, const void *src, size_t bytes, const char *name,
                     const char *path, char **err);
  int (*flush)(fb_sess_run *r, const char *path, char **err);
  int (*sync)(fb_sess_run *r, const char *path, char **err);
  void (*counters)(fb_sess_run *r, fb_counters *c);
  /* launches so far for --checkpoint-every; -1 inside a tape (no checkpoint there) */
  int64_t (*ckpt_count)(fb_sess_run *r);
  /* a checkpoint into f (fb_out_open's, may be NULL) or, whole or not at all, into file */
  int (*checkpoint)(fb_sess_run *r, FILE *f, const char *file, const char *what, char **err);
} sess_place;

static const sess_place local_place, remote_place;

struct fb_sess_run {
  fb_sess_file *f;
  fb_sess_opts o;
  const sess_place *at; /* where the session runs */
  fb_engine *eng;
  fb_session *s;
  fb_client *cli;
  fb_remote *rem;
  fb_daemon daemon;
  int have_daemon;
  char sockdir[200], sockpath[256]; /* the private daemon's temp folder and socket */
  kcache *kc;
  int nkc, capkc;
  /* kernels added for activate / deactivate / deactivate_all (host.c),
   * in-process sessions: the programs that hold them, and their ids */
  struct {
    int op, id;
    char *target;
    fb_program *p;
  } *hk;
  int nhk, caphk;
  /* Where each launch came from, so that an error found later (async, or
   * on a server) names the action that launched it: launch n of the
   * session (0-based, the engine's count; a server's seq is n + 1) was
   * made by the action at paths[launch_path[n]]. */
  char **paths;
  uint32_t npaths, cappaths;
  uint32_t *launch_path;
  uint64_t nlaunch, caplaunch;
  /* What the runner keeps of each action it has run (keyed by the
   * action's JSON object, which stays put for the run; acts holds indices
   * into act): its path, interned in paths, and for an in-process launch
   * what the launch resolved to. A step that repeats an action a thousand
   * times then formats no path and looks up no kernel, instance or
   * argument again (bench/overhead/fill_scalar: a third of its CPU time
   * a launch went there, in either mode). */
  fb_map acts;
  struct act_memo *act;
  int nact, capact;
  const char **rnames; /* kernel names by server kernel id (borrowed from the program) */
  int nrnames;
  /* checkpoints: launches still to pass over after a resume (they ran
   * before the checkpoint), the session came from one, the key, the
   * files --checkpoint-dir wrote (the last two are kept) */
  uint64_t skip;
  int restored, have_key;
  uint8_t key[FB_SEAL_KEY_MAX];
  size_t keylen;
  char *ckpt_files[2];
  uint64_t ckpt_at; /* launches at the last checkpoint (or the resume) */
  /* a session on a fuseboxd restored from a checkpoint numbers its
   * launches (seq) from 1 again: launch n of the run is seq n - seq_base */
  uint64_t seq_base;
  int in_tape; /* between fb_remote_tape_begin and _end: no checkpoint */
  /* how many times each save action has come up (its {step}) */
  struct {
    json_t *action;
    uint64_t n;
  } *saves;
  int nsaves, capsaves;
  /* the progress line (o.progress): launches of the running list */
  const char *plist;
  uint64_t pdone, ptotal;
  double pstart, plast;
  int pshown;
};

fb_session *fb_sess_session(fb_sess_run *r) { return r->s; }

void fb_sess_backend(fb_sess_run *r, char *buf, size_t n) { r->at->backend(r, buf, n); }

void fb_sess_device(fb_sess_run *r, char *buf, size_t n) { r->at->device(r, buf, n); }

static const char *sess_errmsg(const fb_sess_run *r) { return r->at->errmsg(r); }

static void local_backend(fb_sess_run *r, char *buf, size_t n) {
  snprintf(buf, n, "%s", r->eng ? fb_engine_backend(r->eng) : "?");
}

static void remote_backend(fb_sess_run *r, char *buf, size_t n) {
  fb_server_info info;
  if (r->cli && fb_client_info(r->cli, &info) == 0) snprintf(buf, n, "%s", info.backend);
  else snprintf(buf, n, "?");
}

static void local_device(fb_sess_run *r, char *buf, size_t n) {
  snprintf(buf, n, "%s", r->eng ? fb_engine_device(r->eng) : "");
}

static void remote_device(fb_sess_run *r, char *buf, size_t n) { snprintf(buf, n, "%s", ""); }

static const char *local_errmsg(const fb_sess_run *r) { return fb_session_errmsg(r->s); }

static const char *remote_errmsg(const fb_sess_run *r) { return fb_remote_errmsg(r->rem); }

/* ---------------------------------------------------------------- launch errors */

/* ---------------------------------------------------------------- progress */

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Launches an action list makes (repeats multiplied out; saturating). */
static uint64_t count_launches(json_t *list) {
  uint64_t n = 0;
  size_t i;
  json_t *a;
  json_array_foreach(list, i, a) {
    uint64_t k = 0;
    if (json_object_get(a, "launch") || json_object_get(a, "deactivate_all")) k = 1;
    else if (json_object_get(a, "tape")) k = count_launches(json_object_get(a, "do"));
    else if (json_object_get(a, "activate") || json_object_get(a, "deactivate"))
      k = json_array_size(json_object_get(a, "cells"));
    else if (json_object_get(a, "repeat")) {
      uint64_t times = (uint64_t)json_integer_value(json_object_get(a, "repeat"));
      uint64_t body = count_launches(json_object_get(a, "do"));
      k = body && times > UINT64_MAX / body ? UINT64_MAX : times * body;
    }
    n = n > UINT64_MAX - k ? UINT64_MAX : n + k;
  }
  return n;
}

/* "step: 1200/5000 launches (24%), 310/s, ETA 12 s" on stderr, redrawn at
 * most 4 times a second, from one second into the list. */
static void progress(fb_sess_run *r) {
  r->pdone++;
  if (!r->o.progress || (r->pdone & 15)) return;
  double t = mono_s();
  if (t - r->pstart < 1.0 || t - r->plast < 0.25) return;
  r->plast = t;
  double rate = (double)r->pdone / (t - r->pstart);
  double left = r->ptotal > r->pdone ? (double)(r->ptotal - r->pdone) / rate : 0;
  fprintf(stderr, "\r\033[K%s: %llu/%llu launches (%.0f%%), %.0f/s, ETA %.0f s", r->plist,
          (unsigned long long)r->pdone, (unsigned long long)r->ptotal,
          r->ptotal ? 100.0 * (double)r->pdone / (double)r->ptotal : 100.0, rate, left);
  r->pshown = 1;
}

/* The index of path in r->paths, added when new; -1 out of memory. */
static int64_t intern_path(fb_sess_run *r, const char *path) {
  for (uint32_t i = r->npaths; i-- > 0;)
    if (!strcmp(r->paths[i], path)) return i;
  if (r->npaths == r->cappaths) {
    uint32_t nc = r->cappaths ? r->cappaths * 2 : 16;
    char **v = realloc(r->paths, sizeof *v * nc);
    if (!v) return -1;
    r->paths = v;
    r->cappaths = nc;
  }
  if (!(r->paths[r->npaths] = strdup(path))) return -1;
  return r->npaths++;
}

/* Note that the next launch (number r->nlaunch) comes from the action
 * whose path is r->paths[p]. */
static int note_launch_at(fb_sess_run *r, uint32_t p) {
  progress(r);
  if (r->nlaunch == r->caplaunch) {
    uint64_t nc = r->caplaunch ? r->caplaunch * 2 : 256;
    uint32_t *v = realloc(r->launch_path, sizeof *v * nc);
    if (!v) return FB_ENOMEM;
    r->launch_path = v;
    r->caplaunch = nc;
  }
  r->launch_path[r->nlaunch++] = p;
  return 0;
}

/* Note that the next launch comes from the action at path. */
static int note_launch(fb_sess_run *r, const char *path) {
  int64_t p = intern_path(r, path);
  return p < 0 ? FB_ENOMEM : note_launch_at(r, (uint32_t)p);
}

/* The memo of action a, item i of the list at path parent; made when new
 * (its path "parent[i]" interned, nothing resolved). NULL out of memory. */
static act_memo *act_of(fb_sess_run *r, json_t *a, const char *parent, size_t i) {
  uint32_t *ix = fb_map_get(&r->acts, (uint64_t)(uintptr_t)a);
  if (ix) return &r->act[*ix];
  char sub[1024];
  snprintf(sub, sizeof sub, "%s[%zu]", parent, i);
  int64_t p = intern_path(r, sub);
  if (p < 0 || FB_GROW(r->act, r->nact, r->capact)) return NULL;
  int added = 0;
  if (!(ix = fb_map_put(&r->acts, (uint64_t)(uintptr_t)a, &added))) return NULL;
  *ix = (uint32_t)r->nact;
  act_memo *m = &r->act[r->nact++];
  *m = (act_memo){(uint32_t)p, -1, 0, NULL, NULL, FB_T_VOID};
  return m;
}

/* The action that made launch n (0-based), or NULL when unknown. */
static const char *launch_action(const fb_sess_run *r, uint64_t n) {
  return n < r->nlaunch ? r->paths[r->launch_path[n]] : NULL;
}

/* The error of launch n (0-based) of kernel kname, said one way on every
 * path: "$.step[1].do[0]: kernel 'drift' (launch #3 of the session) ...",
 * launches counted from 1 (as a server's seq). The engine's own
 * "kernel 'K' (launch N)" opening, counted from 0, is replaced. */
static int launch_error(fb_sess_run *r, int code, uint64_t n, const char *kname, const char *msg,
                        char **err) {
  const char *rest = msg ? msg : fb_strerror(code);
  char head[256], shown[256], what[300];
  snprintf(head, sizeof head, "kernel '%s'", kname);
  if (!strncmp(rest, head, strlen(head))) {
    rest += strlen(head);
    if (!strncmp(rest, " (launch ", 9) && strchr(rest, ')')) rest = strchr(rest, ')') + 1;
  }
  /* a kernel this runner added (activate / deactivate) is named by what it does */
  const char *kn = fb_host_kernel_shown(kname, shown, sizeof shown);
  if (kn != kname) snprintf(what, sizeof what, "%s", kn);
  else snprintf(what, sizeof what, "kernel '%s'", kname);
  const char *path = launch_action(r, n);
  int sep = rest[0] && rest[0] != ':' && rest[0] != ' ';
  return errf(err, code, "%s: %s (launch #%llu of the session)%s%s",
              path ? path : "(unknown action)", what, (unsigned long long)n + 1, sep ? ": " : "",
              rest);
}

/* A kernel's name by its registered id (local sessions). */
static const char *local_kernel_name(const fb_sess_run *r, int id) {
  for (int i = 0; i < r->nkc; i++)
    if (r->kc[i].id == id) return r->kc[i].ir->name;
  for (int i = 0; i < r->nhk; i++)
    if (r->hk[i].id == id) /* the kernel host.c appended: the program's last */
      return fb_program_kernel(r->hk[i].p, fb_program_nkernels(r->hk[i].p) - 1)->name;
  return "?";
}

/* An error of the in-process session: the engine says when it belongs to
 * an earlier launch (async); else it belongs to the action at path. */
static int local_error(fb_sess_run *r, int rc, const char *path, const char *what, char **err) {
  uint64_t n;
  int kernel;
  if (fb_session_error_launch(r->s, &n, &kernel) == 0)
    return launch_error(r, rc, n, local_kernel_name(r, kernel), fb_session_errmsg(r->s), err);
  return errf(err, rc, "%s: %s%s%s", path, what ? what : "", what ? ": " : "",
              fb_session_errmsg(r->s));
}

/* Wait for every launch sent to the server and fail on the first that
 * failed, naming the action that launched it. */
static int remote_sync(fb_sess_run *r, const char *path, uint64_t seq, fb_value *ret, char **err) {
  fb_sync_result res;
  int rc = fb_remote_sync(r->rem, &res);
  if (ret) {
    memset(ret, 0, sizeof *ret);
    for (int i = 0; i < res.nreturns; i++)
      if (res.returns[i].seq == seq) *ret = res.returns[i].value;
  }
  for (int i = 0; i < res.nerrors; i++) {
    const fb_launch_error *e = &res.errors[i];
    if (e->seq == 0) return errf(err, e->code, "%s: %s", path, e->msg);
    /* the kernel's name as the engine's message gives it, else as registered */
    char name[128];
    const char *kn = sscanf(e->msg, "kernel '%127[^']'", name) == 1 ? name
                     : e->kernel >= 0 && e->kernel < r->nrnames && r->rnames[e->kernel]
                         ? r->rnames[e->kernel]
                         : "?";
    return launch_error(r, e->code ? e->code : FB_EINTERNAL, e->seq - 1 + r->seq_base, kn, e->msg,
                        err);
  }
  if (!rc && res.errors_dropped)
    rc =
        errf(err, FB_EINTERNAL, "%s: %llu launch errors (their details were dropped by the server)",
             path, (unsigned long long)res.errors_dropped);
  else if (rc) rc = errf(err, rc, "%s: %s", path, sess_errmsg(r));
  return rc;
}

int fb_sess_sync(fb_sess_run *r, char **err) { return r->at->sync(r, "sync", err); }

void fb_sess_counters(fb_sess_run *r, fb_counters *c) {
  memset(c, 0, sizeof *c);
  r->at->counters(r, c);
}

static int local_sync(fb_sess_run *r, const char *path, char **err) {
  int rc = fb_sync(r->s);
  return rc ? local_error(r, rc, path, NULL, err) : 0;
}

static int remote_sync_all(fb_sess_run *r, const char *path, char **err) {
  return remote_sync(r, path, 0, NULL, err);
}

static int local_settle(fb_sess_run *r, const char *path, char **err) {
  return 0; /* a field read or write waits for the launches itself and names a failed one */
}

static void local_counters(fb_sess_run *r, fb_counters *c) { fb_session_counters(r->s, c); }

static void remote_counters(fb_sess_run *r, fb_counters *c) { fb_remote_counters(r->rem, c); }

static int local_flush(fb_sess_run *r, const char *path, char **err) {
  int rc = fb_flush(r->s);
  return rc ? local_error(r, rc, path, NULL, err) : 0;
}

static int remote_flush(fb_sess_run *r, const char *path, char **err) {
  int rc = fb_remote_flush(r->rem);
  return rc ? errf(err, rc, "%s: %s", path, sess_errmsg(r)) : 0;
}

static int local_field_read(fb_sess_run *r, int place, void *dst, size_t bytes) {
  return fb_field_read(r->s, place, dst, bytes);
}

static int remote_field_read(fb_sess_run *r, int place, void *dst, size_t bytes) {
  return fb_remote_field_read(r->rem, place, dst, bytes);
}

static int local_field_write(fb_sess_run *r, int place, const void *src, size_t bytes,
                             const char *name, const char *path, char **err) {
  int rc = fb_field_write(r->s, place, src, bytes);
  return rc ? local_error(r, rc, path, "writing", err) : 0;
}

static int remote_field_write(fb_sess_run *r, int place, const void *src, size_t bytes,
                              const char *name, const char *path, char **err) {
  int rc = fb_remote_field_write(r->rem, place, src, bytes);
  return rc ? errf(err, rc, "%s: writing %s: %s", path, name, sess_errmsg(r)) : 0;
}

static int resume_remote(fb_sess_run *r, const fb_remote_options *ro, const char *file,
                         char **err);

/* The session on a server: --server ADDR, or a private fuseboxd on a unix
 * socket that lives as long as this run; from the checkpoint `resume`
 * (a file here) when not NULL. */
static int start_remote(fb_sess_run *r, json_t *sc, const char *mode, const fb_session_config *cfg,
                        const char *resume, char **err) {
  char msg[1024] = "", exe[1024], sock[320];
  const char *addr = r->o.server;
  if (!addr) {
    /* a folder of our own (0700) for the socket, removed at the end, also
     * on Ctrl-C (cli_interrupt.c) */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 80) tmp = "/tmp";
    snprintf(r->sockdir, sizeof r->sockdir, "%s/fusebox-XXXXXX", tmp);
    if (!mkdtemp(r->sockdir))
      return errf(err, FB_EIO, "cannot make a folder for the private fuseboxd's socket (%s): %s",
                  r->sockdir, strerror(errno));
    snprintf(r->sockpath, sizeof r->sockpath, "%s/fuseboxd.sock", r->sockdir);
    snprintf(sock, sizeof sock, "unix:%s", r->sockpath);
    fb_cli_interrupt_daemon(&r->daemon.pid, r->sockpath, r->sockdir);
    r->have_daemon = 1;
    const char *args[] = {"--log-level", "warn", NULL};
    int rc =
        fb_daemon_start(fb_daemon_find(exe, sizeof exe), sock, args, &r->daemon, msg, sizeof msg);
    if (rc)
      return errf(err, rc, "cannot start a private fuseboxd: %s (or use --local / --server)", msg);
    addr = r->daemon.address;
  }
  int rc = fb_client_connect(addr, NULL, &r->cli, msg, sizeof msg);
  if (rc) return errf(err, rc, "cannot connect to %s: %s", addr, msg);
  fb_remote_options ro;
  fb_remote_options_init(&ro);
  json_t *b = json_object_get(sc, "backend");
  ro.backend = json_is_string(b) ? json_string_value(b) : NULL;
  ro.mode = mode;
  ro.seed = cfg->seed;
  ro.memory_limit = cfg->memory_limit;
  ro.flush_every = cfg->flush_every;
  ro.max_fuse_per_task = cfg->max_fuse_per_task;
  ro.compile_threads = (int)json_integer_value(json_object_get(sc, "compile_threads"));
  if (cfg->passes & FB_PASSES_EXACT) {
    ro.listgen = !!(cfg->passes & FB_PASSES_LISTGEN);
    ro.demote = !!(cfg->passes & FB_PASSES_DEMOTE);
    ro.fusion = !!(cfg->passes & FB_PASSES_FUSION);
    ro.dse = !!(cfg->passes & FB_PASSES_DSE);
  }
  if (resume) return resume_remote(r, &ro, resume, err);
  rc = fb_remote_open_program(r->cli, &ro, r->f->prog, &r->rem);
  if (rc)
    return errf(err, rc, "%s: cannot open a session on %s: %s", r->f->path, addr,
                fb_client_errmsg(r->cli));
  return 0;
}

/* session.passes (each on unless false), minus the passes a bench mode
 * turns off; flush_every (0 in the file means never); max_fuse_per_task. */
static void session_async_options(json_t *sc, unsigned off, fb_session_config *cfg) {
  static const struct {
    const char *key;
    unsigned bit, off;
  } passes[] = {{"listgen", FB_PASSES_LISTGEN, FB_SESS_NO_LISTGEN},
                {"demote", FB_PASSES_DEMOTE, FB_SESS_NO_DEMOTE},
                {"fusion", FB_PASSES_FUSION, FB_SESS_NO_FUSION},
                {"dse", FB_PASSES_DSE, FB_SESS_NO_DSE}};
  json_t *jp = json_object_get(sc, "passes");
  unsigned bits = 0;
  for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++)
    if (!json_is_false(json_object_get(jp, passes[i].key)) && !(off & passes[i].off))
      bits |= passes[i].bit;
  cfg->passes = bits == FB_PASSES_ALL ? 0 : (bits | FB_PASSES_EXACT);
  json_t *fe = json_object_get(sc, "flush_every");
  if (json_is_integer(fe))
    cfg->flush_every = json_integer_value(fe) > 0 ? (int)json_integer_value(fe) : -1;
  json_t *mf = json_object_get(sc, "max_fuse_per_task");
  if (json_is_integer(mf) && json_integer_value(mf) > 0)
    cfg->max_fuse_per_task = (int)json_integer_value(mf);
}

static int resume_session(fb_sess_run *r, const char *file, const fb_session_config *cfg,
                          char **err);

/* The session in this process: an engine, and a session made new or
 * restored from the sealed checkpoint `resume`. */
static int local_open(fb_sess_run *r, json_t *sc, const char *mode, const fb_session_config *cfg,
                      const char *resume, char **err) {
  const char *backend = sc && json_is_string(json_object_get(sc, "backend"))
                            ? json_string_value(json_object_get(sc, "backend"))
                            : "auto";
  fb_engine_config ec = {
      .backend = backend,
      .cpu_threads = r->o.cpu_threads,
      .compile_threads = sc ? (int)json_integer_value(json_object_get(sc, "compile_threads")) : 0};
  char msg[1024] = "";
  int rc = fb_engine_create(&ec, &r->eng, msg, sizeof msg);
  if (rc) return errf(err, rc, "%s: $.session.backend: %s", r->f->path, msg);
  if (resume) return resume_session(r, resume, cfg, err);
  rc = fb_session_create(r->eng, cfg, fb_program_layout(r->f->prog), &r->s, msg, sizeof msg);
  if (rc) return errf(err, rc, "%s: cannot create the session: %s", r->f->path, msg);
  return 0;
}

int fb_sess_start(fb_sess_file *f, const fb_sess_opts *o, fb_sess_run **out, char **err) {
  fb_sess_run *r = calloc(1, sizeof *r);
  if (r) fb_map_init(&r->acts, sizeof(uint32_t));
  if (!r) return FB_ENOMEM;
  r->f = f;
  r->o = *o;
  if (!r->o.out) r->o.out = stdout;
  r->at = o->server || o->private_server ? &remote_place : &local_place;
  json_t *sc = json_object_get(f->root, "session");
  const char *mode = o->mode ? o->mode
                     : sc && json_is_string(json_object_get(sc, "mode"))
                         ? json_string_value(json_object_get(sc, "mode"))
                         : "sync";
  fb_session_config cfg = {
      .mode = mode,
      .seed = sc ? (uint64_t)json_integer_value(json_object_get(sc, "seed")) : 0,
      .memory_limit = sc ? (uint64_t)json_integer_value(json_object_get(sc, "memory_limit")) : 0};
  session_async_options(sc, o->passes_off, &cfg);
  const char *resume = o->resume ? o->resume
                       : sc && json_is_string(json_object_get(sc, "resume"))
                           ? json_string_value(json_object_get(sc, "resume"))
                           : NULL;
  char *rp = NULL; /* session.resume: beside the JSON file */
  if (resume && !o->resume && resume[0] != '/' && f->dir[0] &&
      asprintf(&rp, "%s/%s", f->dir, resume) < 0)
    rp = NULL;
  int rc = r->at->open(r, sc, mode, &cfg, rp ? rp : resume, err);
  free(rp);
  if (rc) {
    fb_sess_stop(r);
    return rc;
  }
  *out = r;
  return 0;
}

void fb_sess_stop(fb_sess_run *r) {
  if (!r) return;
  if (r->rem) fb_remote_close(r->rem);
  if (r->cli) fb_client_close(r->cli);
  if (r->have_daemon) {
    if (r->daemon.pid > 0) fb_daemon_stop(&r->daemon, 10.0, NULL);
    fb_cli_interrupt_forget();
    unlink(r->sockpath); /* fuseboxd removes it, unless it was killed */
    rmdir(r->sockdir);
  }
  if (r->s) fb_session_destroy(r->s);
  if (r->eng) fb_engine_destroy(r->eng);
  free(r->kc);
  for (int i = 0; i < r->nhk; i++) {
    free(r->hk[i].target);
    fb_program_free(r->hk[i].p);
  }
  free(r->hk);
  for (uint32_t i = 0; i < r->npaths; i++) free(r->paths[i]);
  free(r->paths);
  for (int i = 0; i < r->nact; i++) {
    free(r->act[i].vals);
    free(r->act[i].kname);
  }
  free(r->act);
  fb_map_free(&r->acts);
  free(r->launch_path);
  free(r->rnames);
  free(r->saves);
  free(r->ckpt_files[0]);
  free(r->ckpt_files[1]);
  explicit_bzero(r->key, sizeof r->key);
  free(r);
}

static int kernel_id(fb_sess_run *r, const fb_kernel *ir, char **err) {
  for (int i = 0; i < r->nkc; i++)
    if (r->kc[i].ir == ir) return r->kc[i].id;
  /* a restored session holds the kernels the run had registered */
  int id = r->restored ? fb_session_find_kernel(r->s, ir->name) : -1;
  if (id < 0) id = fb_session_add_kernel(r->s, ir);
  if (id < 0) return errf(err, id, "kernel %s: %s", ir->name, fb_session_errmsg(r->s));
  if (FB_GROW(r->kc, r->nkc, r->capkc)) return FB_ENOMEM;
  r->kc[r->nkc++] = (kcache){ir, id};
  return id;
}

/* An integer argument written as a decimal string ("18446744073709551615"):
 * JSON numbers stop at 2^63-1 in jansson, so this is how a u64 above it is
 * given. The whole string must be the number, within t's range. */
static int decimal_arg(const char *s, fb_type t, fb_value *v) {
  char *end;
  errno = 0;
  if (t == FB_T_U64 || t == FB_T_U32) {
    while (isspace((unsigned char)*s)) s++;
    if (*s == '-') return FB_ETYPE;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *end || errno || (t == FB_T_U32 && x > UINT32_MAX)) return FB_ETYPE;
    *v = t == FB_T_U64 ? fb_value_u64(x) : fb_value_u32((uint32_t)x);
    return 0;
  }
  long long x = strtoll(s, &end, 10);
  if (end == s || *end || errno || (t == FB_T_I32 && (x < INT32_MIN || x > INT32_MAX)))
    return FB_ETYPE;
  *v = t == FB_T_I64 ? fb_value_i64(x) : fb_value_i32((int32_t)x);
  return 0;
}

static int scalar_arg(json_t *a, fb_type t, fb_value *v) {
  if (json_is_string(a) && fb_type_is_int(t)) return decimal_arg(json_string_value(a), t, v);
  if (json_is_boolean(a)) {
    *v = fb_value_cast(fb_value_bool(json_is_true(a)), t);
    return 0;
  }
  if (json_is_integer(a)) {
    *v = fb_value_cast(fb_value_i64(json_integer_value(a)), t);
    return 0;
  }
  if (json_is_real(a)) {
    double x = json_real_value(a);
    if (!fb_type_is_float(t) && x != floor(x)) return FB_ETYPE;
    *v = fb_value_cast(fb_value_f64(x), t);
    return 0;
  }
  return FB_ETYPE;
}

static int remote_launch(fb_sess_run *r, const launch_req *q, const char *path, char **err) {
  const fb_lang_kernel *lk = q->lk;
  const char **binds = q->binds;
  const fb_value *vals = q->vals;
  int nb = q->nb, nv = q->nv, grad = q->grad;
  if (r->skip) { /* it ran before the checkpoint the session resumed from */
    if (note_launch(r, path)) return errf(err, FB_ENOMEM, "%s: out of memory", path);
    r->skip--;
    return 0;
  }
  int id = fb_remote_kernel(r->rem, lk->name, binds, nb);
  if (id < 0) return errf(err, id, "%s: cannot register '%s': %s", path, lk->name, sess_errmsg(r));
  if (grad && (id = grad == 2 ? fb_remote_kernel_tangent(r->rem, id)
                              : fb_remote_kernel_adjoint(r->rem, id)) < 0)
    return errf(err, id, "%s: %s%s: %s", path, lk->name, grad == 2 ? ".dual" : ".grad",
                sess_errmsg(r));
  if (id >= r->nrnames) {
    const char **v = realloc(r->rnames, sizeof *v * (size_t)(id + 16));
    if (!v) return FB_ENOMEM;
    memset(v + r->nrnames, 0, sizeof *v * (size_t)(id + 16 - r->nrnames));
    r->rnames = v;
    r->nrnames = id + 16;
  }
  r->rnames[id] = lk->name;
  if (note_launch(r, path)) return errf(err, FB_ENOMEM, "%s: out of memory", path);
  int64_t seq = fb_remote_launch(r->rem, id, vals, nv);
  if (seq < 0) {
    r->nlaunch--; /* refused here: the server never saw it */
    return errf(err, (int)seq, "%s: launching %s: %s", path, lk->name, sess_errmsg(r));
  }
  if ((uint64_t)seq + r->seq_base != r->nlaunch) /* our count and the server's must agree */
    return errf(err, FB_EINTERNAL, "%s: launch #%llu, expected #%llu", path,
                (unsigned long long)((uint64_t)seq + r->seq_base), (unsigned long long)r->nlaunch);
  if (!r->o.verbose || lk->ret == FB_T_VOID) return 0;
  fb_value ret;
  int rc = remote_sync(r, path, (uint64_t)seq, &ret, err);
  if (!rc) fprintf(r->o.out, "%s returned %.17g\n", lk->name, fb_value_as_f64(ret));
  return rc;
}

/* ---- automatic differentiation (docs/autodiff.md) */

/* 1 when name is "<k>.grad", 2 when "<k>.dual" (its tangent, forward
 * mode), for a kernel k of the program (and no kernel is named name
 * itself): fwd gets k. */
static int grad_name(const fb_sess_run *r, const char *name, char *fwd, size_t n) {
  size_t len = strlen(name);
  if (len <= 5 || len - 5 >= n) return 0;
  int kind = !strcmp(name + len - 5, ".grad") ? 1 : !strcmp(name + len - 5, ".dual") ? 2 : 0;
  if (!kind || fb_program_find_kernel(r->f->prog, name) >= 0) return 0;
  memcpy(fwd, name, len - 5);
  fwd[len - 5] = 0;
  return fb_program_find_kernel(r->f->prog, fwd) >= 0 ? kind : 0;
}

/* `kernel k(...) grad k_adj`: k_adj's instance for the same fields is the
 * adjoint of k's (id) in the in-process session. */
static int bind_custom(fb_sess_run *r, int id, const fb_lang_kernel *lk, const char **binds, int nb,
                       const char *path, char **err) {
  if (fb_session_custom_adjoint(r->s, id) >= 0) return 0;
  fb_kernel *ir;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(r->f->prog, lk->grad, binds, nb, &ir, &d);
  if (rc) {
    char *m = fb_diags_render(fb_program_filename(r->f->prog), fb_program_source(r->f->prog), &d);
    fb_diags_free(&d);
    errf(err, rc, "%s: cannot instantiate '%s', the adjoint of '%s': %s", path, lk->grad, lk->name,
         m ? m : fb_strerror(rc));
    free(m);
    return rc;
  }
  fb_diags_free(&d);
  int aid = kernel_id(r, ir, err);
  if (aid < 0) return aid;
  if ((rc = fb_session_set_kernel_adjoint(r->s, id, aid)))
    return errf(err, rc, "%s: %s", path, fb_session_errmsg(r->s));
  return 0;
}

/* The adjoint (kind 1) or tangent (kind 2) of registered kernel id, made
 * by the in-process session. */
static int local_adjoint(fb_sess_run *r, int id, int kind, const char *path, const char **name,
                         char **err) {
  int adj = -1;
  int rc = kind == 2 ? fb_session_kernel_tangent(r->s, id, &adj)
                     : fb_session_kernel_adjoint(r->s, id, &adj);
  if (rc) return errf(err, rc, "%s: %s", path, fb_session_errmsg(r->s));
  static char buf[256]; /* the adjoint's name, for messages */
  snprintf(buf, sizeof buf, "%s%s", local_kernel_name(r, id), kind == 2 ? ".dual" : ".grad");
  *name = buf;
  return adj;
}

/* The tape's own launches (clears, seed, adjoints), in-process: numbered
 * by the engine after those noted so far, so they are noted too (as the
 * tape's), keeping launch numbers and actions in step. */
static int note_tape_launches(fb_sess_run *r, uint64_t before, const char *path) {
  fb_counters c;
  fb_session_counters(r->s, &c);
  uint64_t shown = r->pdone; /* the progress line counts the file's launches, not these */
  for (uint64_t i = before; i < c.launches; i++)
    if (note_launch(r, path)) return FB_ENOMEM;
  r->pdone = shown;
  return 0;
}

static int run_list(fb_sess_run *r, json_t *list, const char *path, char **err);

/* {"tape": "loss", "do": [...]}: the actions' launches recorded, then
 * the gradients (docs/autodiff.md, "The tape"). */
static int do_tape(fb_sess_run *r, json_t *a, const char *path, char **err) {
  const char *loss = json_string_value(json_object_get(a, "tape"));
  int fi = fb_program_find_field(r->f->prog, loss);
  if (fi < 0) return errf(err, FB_ENOENT, "%s.tape: no field named '%s' in the program", path, loss);
  const fb_lang_field *fld = fb_program_field(r->f->prog, fi);
  if (fld->ncomp != 1)
    return errf(err, FB_EINVAL, "%s.tape: the loss '%s' has %d components; a loss is a scalar",
                path, loss, fld->ncomp);
  char sub[1024];
  snprintf(sub, sizeof sub, "%.1000s.do", path);
  char end[1024];
  snprintf(end, sizeof end, "%.1000s (the tape's end)", path);
  return r->at->tape(r, fld->places[0], json_object_get(a, "do"), sub, end, path, err);
}

static int remote_tape(fb_sess_run *r, int loss, json_t *body, const char *sub, const char *end,
                       const char *path, char **err) {
  int rc;
  if ((rc = fb_remote_tape_begin(r->rem, loss)))
    return errf(err, rc, "%s.tape: %s", path, sess_errmsg(r));
  r->in_tape = 1;
  rc = run_list(r, body, sub, err);
  r->in_tape = 0;
  if (rc) return rc;
  /* its errors come with the next sync (a refused adjoint names its launch) */
  if ((rc = fb_remote_tape_end(r->rem))) return errf(err, rc, "%s: %s", path, sess_errmsg(r));
  return 0;
}

static int local_tape(fb_sess_run *r, int loss, json_t *body, const char *sub, const char *end,
                      const char *path, char **err) {
  int rc;
  if ((rc = fb_session_tape_begin(r->s, loss)))
    return errf(err, rc, "%s.tape: %s", path, fb_session_errmsg(r->s));
  if ((rc = run_list(r, body, sub, err))) return rc;
  fb_counters before;
  fb_session_counters(r->s, &before);
  rc = fb_session_tape_end(r->s);
  if (note_tape_launches(r, before.launches, end)) return errf(err, FB_ENOMEM, "out of memory");
  return rc ? local_error(r, rc, end, NULL, err) : 0;
}

static int launch_resolved(fb_sess_run *r, const act_memo *m, const char *path, char **err);
static int local_launch(fb_sess_run *r, const launch_req *q, const char *path, char **err);

static int do_launch(fb_sess_run *r, json_t *a, const char *path, char **err) {
  uint32_t *ix = fb_map_get(&r->acts, (uint64_t)(uintptr_t)a);
  if (ix && r->act[*ix].id >= 0) return launch_resolved(r, &r->act[*ix], path, err);
  const char *name = json_string_value(json_object_get(a, "launch"));
  char fwd[256];
  int grad = grad_name(r, name, fwd, sizeof fwd); /* "k.grad": k's adjoint; "k.dual": tangent */
  if (grad) name = fwd;
  int ki = fb_program_find_kernel(r->f->prog, name);
  if (ki < 0)
    return errf(err, FB_ENOENT, "%s.launch: no kernel named '%s' in the program", path, name);
  const fb_lang_kernel *lk = fb_program_kernel(r->f->prog, ki);
  json_t *args = json_object_get(a, "args");
  size_t na = args ? json_array_size(args) : 0;
  if ((int)na != lk->nparams)
    return errf(err, FB_ETYPE, "%s.args: kernel '%s' takes %d argument%s, %zu given", path, name,
                lk->nparams, lk->nparams == 1 ? "" : "s", na);
  const char *binds[16];
  fb_value vals[32];
  int nb = 0, nv = 0;
  for (int i = 0; i < lk->nparams; i++) {
    json_t *x = json_array_get(args, (size_t)i);
    if (lk->params[i].is_field) {
      if (!json_is_string(x) || nb >= 16)
        return errf(err, FB_ETYPE, "%s.args[%d]: parameter '%s' is a field: give its name", path, i,
                    lk->params[i].name);
      binds[nb++] = json_string_value(x);
    } else if (nv >= 32 || scalar_arg(x, lk->params[i].type, &vals[nv++])) {
      return errf(err, FB_ETYPE, "%s.args[%d]: parameter '%s' needs %s %s value", path, i,
                  lk->params[i].name, fb_type_article(lk->params[i].type),
                  fb_type_name(lk->params[i].type));
    }
  }
  launch_req q = {a, ix, name, lk, binds, nb, vals, nv, grad};
  return r->at->launch(r, &q, path, err);
}

/* Register (the first time) and launch in the in-process session: the
 * action is resolved once, its later runs go straight to launch_resolved. */
static int local_launch(fb_sess_run *r, const launch_req *q, const char *path, char **err) {
  const fb_lang_kernel *lk = q->lk;
  const char *name = q->name;
  const char **binds = q->binds;
  const fb_value *vals = q->vals;
  int nb = q->nb, nv = q->nv, grad = q->grad;
  uint32_t *ix = q->ix;
  fb_kernel *ir;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(r->f->prog, name, binds, nb, &ir, &d);
  if (rc) {
    char *m = fb_diags_render(fb_program_filename(r->f->prog), fb_program_source(r->f->prog), &d);
    fb_diags_free(&d);
    errf(err, rc, "%s: cannot instantiate '%s': %s", path, name, m ? m : fb_strerror(rc));
    free(m);
    return rc;
  }
  fb_diags_free(&d);
  int id = kernel_id(r, ir, err);
  if (id < 0) return id;
  if (lk->grad && (rc = bind_custom(r, id, lk, binds, nb, path, err))) return rc;
  const char *kname = ir->name;
  if (grad && (id = local_adjoint(r, id, grad, path, &kname, err)) < 0) return id;
  /* resolved: the action's next runs start from here (its kernel, field
   * bindings and argument values are the file's, fixed for the run) */
  act_memo m = {UINT32_MAX, id, nv, NULL, strdup(kname), lk->ret};
  if (!m.kname || (nv && !(m.vals = malloc(sizeof *m.vals * (size_t)nv)))) {
    free(m.kname);
    return errf(err, FB_ENOMEM, "%s: out of memory", path);
  }
  if (nv) memcpy(m.vals, vals, sizeof *vals * (size_t)nv);
  if (ix) {
    m.path = r->act[*ix].path;
    r->act[*ix] = m;
    return launch_resolved(r, &r->act[*ix], path, err);
  }
  rc = launch_resolved(r, &m, path, err); /* an action run outside a list: not kept */
  free(m.vals);
  free(m.kname);
  return rc;
}

/* Launch what action m resolved to (in-process). */
static int launch_resolved(fb_sess_run *r, const act_memo *m, const char *path, char **err) {
  fb_value ret;
  /* the engine's count, not fb_session_counters: that gathers every
     counter (in async mode under the worker's locks) on every launch */
  uint64_t before = fb_session_launches(r->s);
  if (m->path != UINT32_MAX ? note_launch_at(r, m->path) : note_launch(r, path))
    return errf(err, FB_ENOMEM, "%s: out of memory", path);
  if (r->skip) { /* it ran before the checkpoint the session resumed from */
    r->skip--;
    return 0;
  }
  int rc = fb_launch(r->s, m->id, m->vals, m->nv, &ret);
  if (rc) {
    uint64_t n;
    if (fb_session_error_launch(r->s, &n, NULL) == 0) /* an earlier launch failed (async) */
      return local_error(r, rc, path, NULL, err);
    if (fb_session_launches(r->s) > before) /* this launch ran and failed */
      return launch_error(r, rc, r->nlaunch - 1, m->kname, fb_session_errmsg(r->s), err);
    return errf(err, rc, "%s: launching %s: %s", path, m->kname, fb_session_errmsg(r->s));
  }
  if (r->o.verbose && m->ret != FB_T_VOID)
    fprintf(r->o.out, "%s returned %.17g\n", m->kname, fb_value_as_f64(ret));
  return 0;
}

/* Field elements in the host layout: indices row-major, components last. */
static int field_info(fb_sess_run *r, const char *name, const fb_lang_field **fld, int64_t *cells,
                      char **err) {
  int fi = fb_program_find_field(r->f->prog, name);
  if (fi < 0) return errf(err, FB_ENOENT, "no field named '%s' in the program", name);
  *fld = fb_program_field(r->f->prog, fi);
  *cells = 1;
  for (int d = 0; d < (*fld)->ndim; d++) *cells *= (*fld)->shape[d];
  return 0;
}

static int read_field(fb_sess_run *r, const char *name, fb_npy *out, char **err) {
  const fb_lang_field *fld = NULL;
  int64_t cells = 0;
  int rc = field_info(r, name, &fld, &cells, err);
  if (rc) return rc;
  size_t es = fb_type_size(fld->type);
  memset(out, 0, sizeof *out);
  out->type = fld->type;
  out->ndim = fld->ndim;
  for (int d = 0; d < fld->ndim; d++) out->shape[d] = fld->shape[d];
  if (fld->rows) out->shape[out->ndim++] = fld->rows;
  if (fld->cols) out->shape[out->ndim++] = fld->cols;
  out->nbytes = (size_t)cells * (size_t)fld->ncomp * es;
  out->data = malloc(out->nbytes ? out->nbytes : 1);
  uint8_t *tmp = fld->ncomp > 1 ? malloc((size_t)cells * es) : NULL;
  if (!out->data || (fld->ncomp > 1 && !tmp)) {
    free(tmp);
    fb_npy_free(out);
    return FB_ENOMEM;
  }
  for (int c = 0; c < fld->ncomp; c++) {
    uint8_t *dst = fld->ncomp > 1 ? tmp : out->data;
    rc = r->at->field_read(r, fld->places[c], dst, (size_t)cells * es);
    if (rc) {
      free(tmp);
      fb_npy_free(out);
      return errf(err, rc, "reading %s: %s", name, sess_errmsg(r));
    }
    for (int64_t i = 0; tmp && i < cells; i++)
      memcpy((uint8_t *)out->data + ((size_t)i * (size_t)fld->ncomp + (size_t)c) * es,
             tmp + (size_t)i * es, es);
  }
  free(tmp);
  return 0;
}

static int do_write(fb_sess_run *r, json_t *a, const char *path, char **err) {
  const char *name = json_string_value(json_object_get(a, "write"));
  char *file = join_path(r->f->dir, json_string_value(json_object_get(a, "from")));
  const fb_lang_field *fld = NULL;
  int64_t cells = 0;
  fb_npy arr;
  char msg[512];
  int rc = field_info(r, name, &fld, &cells, err);
  if (rc) {
    free(file);
    return errf(err, rc, "%s.write: %s", path, *err);
  }
  rc = fb_npy_read(file, &arr, msg, sizeof msg);
  free(file);
  if (rc) return errf(err, rc, "%s.from: %s", path, msg);
  if ((rc = r->at->settle(r, path, err))) { /* launches before it failed? */
    fb_npy_free(&arr);
    return rc;
  }
  if (arr.type != fld->type || fb_npy_numel(&arr) != cells * fld->ncomp) {
    errf(err, FB_ETYPE, "%s: field '%s' holds %lld %s values; the file has %lld %s values", path,
         name, (long long)(cells * fld->ncomp), fb_type_name(fld->type),
         (long long)fb_npy_numel(&arr), fb_type_name(arr.type));
    fb_npy_free(&arr);
    return FB_ETYPE;
  }
  size_t es = fb_type_size(fld->type);
  uint8_t *tmp = malloc((size_t)cells * es + 1);
  for (int c = 0; tmp && c < fld->ncomp && !rc; c++) {
    for (int64_t i = 0; i < cells; i++)
      memcpy(tmp + (size_t)i * es,
             (uint8_t *)arr.data + ((size_t)i * (size_t)fld->ncomp + (size_t)c) * es, es);
    rc = r->at->field_write(r, fld->places[c], tmp, (size_t)cells * es, name, path, err);
  }
  free(tmp);
  fb_npy_free(&arr);
  if (rc) return rc;
  return tmp ? 0 : FB_ENOMEM;
}

/* The id of the kernel that does op on target in the in-process session
 * (host.c), added the first time. */
static int local_host_kernel(fb_sess_run *r, fb_host_op op, const char *target, const char *path,
                             char **err) {
  for (int i = 0; i < r->nhk; i++)
    if (r->hk[i].op == (int)op && !strcmp(r->hk[i].target, target)) return r->hk[i].id;
  char msg[512];
  fb_program *hp;
  fb_kernel *k;
  int rc = fb_host_kernel(r->f->prog, op, target, &hp, &k, msg, sizeof msg);
  if (rc) return errf(err, rc, "%s: %s", path, msg);
  int id = fb_session_add_kernel(r->s, k);
  if (id < 0) {
    fb_program_free(hp);
    return errf(err, id, "%s: %s of '%s': %s", path,
                op == FB_HOST_ACTIVATE ? "activate" : "deactivate", target,
                fb_session_errmsg(r->s));
  }
  char *t = strdup(target);
  if (!t || FB_GROW(r->hk, r->nhk, r->caphk)) {
    free(t);
    fb_program_free(hp);
    return errf(err, FB_ENOMEM, "%s: out of memory", path);
  }
  r->hk[r->nhk].op = (int)op;
  r->hk[r->nhk].id = id;
  r->hk[r->nhk].target = t;
  r->hk[r->nhk++].p = hp;
  return id;
}

/* {"activate" | "deactivate": S, "cells": [[i, ...], ...]} and
 * {"deactivate_all": S}: a launch per cell (one for deactivate_all) of a
 * kernel the runner adds to the program, numbered as the launches are. */
static int do_host(fb_sess_run *r, json_t *a, const char *path, char **err) {
  fb_host_op op = json_object_get(a, "activate")     ? FB_HOST_ACTIVATE
                  : json_object_get(a, "deactivate") ? FB_HOST_DEACTIVATE
                                                     : FB_HOST_DEACTIVATE_ALL;
  static const char *const keys[] = {"activate", "deactivate", "deactivate_all"};
  const char *target = json_string_value(json_object_get(a, keys[op]));
  json_t *cells = json_object_get(a, "cells");
  size_t ncell = op == FB_HOST_DEACTIVATE_ALL ? 1 : json_array_size(cells);
  int id = r->at->host_begin(r, op, target, path, err);
  if (id < 0) return id;
  for (size_t c = 0; c < ncell; c++) {
    int64_t idx[FB_MAX_AXES];
    fb_value vals[FB_MAX_AXES];
    int nidx = 0;
    if (op != FB_HOST_DEACTIVATE_ALL) {
      json_t *cell = json_array_get(cells, c), *x;
      size_t j;
      json_array_foreach(cell, j, x) {
        if (nidx == FB_MAX_AXES) break;
        idx[nidx] = json_integer_value(x);
        vals[nidx] = fb_value_i32((int32_t)idx[nidx]);
        nidx++;
      }
    }
    char sub[1100];
    if (op == FB_HOST_DEACTIVATE_ALL) snprintf(sub, sizeof sub, "%s", path);
    else snprintf(sub, sizeof sub, "%.1000s.cells[%zu]", path, c);
    int rc = r->at->host_cell(r, op, target, id, idx, vals, nidx, path, sub, err);
    if (rc) return rc;
  }
  return 0;
}

static int remote_host_begin(fb_sess_run *r, fb_host_op op, const char *target, const char *path,
                             char **err) {
  return 0; /* libfusebox adds the kernel on the server the first time */
}

/* Note the cell's launch; 1 when the checkpoint the session resumed from holds it. */
static int host_noted(fb_sess_run *r, const char *path, char **err) {
  if (note_launch(r, path)) return errf(err, FB_ENOMEM, "%s: out of memory", path);
  if (r->skip) { /* it ran before the checkpoint the session resumed from */
    r->skip--;
    return 1;
  }
  return 0;
}

static int remote_host_cell(fb_sess_run *r, fb_host_op op, const char *target, int id,
                            const int64_t *idx, const fb_value *vals, int nidx, const char *path,
                            const char *sub, char **err) {
  int rc = host_noted(r, path, err);
  if (rc) return rc > 0 ? 0 : rc;
  int64_t seq = op == FB_HOST_ACTIVATE     ? fb_remote_activate(r->rem, target, idx, nidx)
                : op == FB_HOST_DEACTIVATE ? fb_remote_deactivate(r->rem, target, idx, nidx)
                                           : fb_remote_deactivate_all(r->rem, target);
  if (seq < 0) {
    r->nlaunch--; /* refused here: the server never saw it */
    /* a refused target is the action's; a bad index, its cell's */
    return errf(err, (int)seq, "%s: %s", seq == FB_EBOUNDS ? sub : path, sess_errmsg(r));
  }
  if ((uint64_t)seq + r->seq_base != r->nlaunch)
    return errf(err, FB_EINTERNAL, "%s: launch #%llu, expected #%llu", path,
                (unsigned long long)((uint64_t)seq + r->seq_base), (unsigned long long)r->nlaunch);
  return 0;
}

static int local_host_cell(fb_sess_run *r, fb_host_op op, const char *target, int id,
                           const int64_t *idx, const fb_value *vals, int nidx, const char *path,
                           const char *sub, char **err) {
  const fb_snode *sn = NULL;
  int snid, nd;
  char msg[512];
  if (fb_host_target(r->f->prog, target, &snid, &nd, msg, sizeof msg) == 0)
    sn = &fb_program_layout(r->f->prog)->nodes[snid];
  for (int d = 0; sn && d < nidx; d++)
    if (idx[d] < 0 || idx[d] >= sn->shape[sn->dim_axis[d]])
      return errf(err, FB_EBOUNDS, "%s: index %lld (number %d) is out of bounds of '%s' (0 .. %lld)",
                  sub, (long long)idx[d], d, target, (long long)sn->shape[sn->dim_axis[d]] - 1);
  int rc = host_noted(r, path, err);
  if (rc) return rc > 0 ? 0 : rc;
  fb_value ret;
  fb_counters before, after;
  fb_session_counters(r->s, &before);
  rc = fb_launch(r->s, id, vals, nidx, &ret);
  if (rc) {
    uint64_t n;
    if (fb_session_error_launch(r->s, &n, NULL) == 0) return local_error(r, rc, path, NULL, err);
    fb_session_counters(r->s, &after);
    if (after.launches > before.launches)
      return launch_error(r, rc, r->nlaunch - 1, local_kernel_name(r, id),
                          fb_session_errmsg(r->s), err);
    return errf(err, rc, "%s: %s", sub, fb_session_errmsg(r->s));
  }
  return 0;
}

/* The output directory: --output-dir, else the JSON file's folder ("":
 * the current one). Names under it are opened by fb_out_open. */
static const char *output_dir(fb_sess_run *r) { return r->o.outdir ? r->o.outdir : r->f->dir; }

/* How a file under the output directory is shown in messages. */
static char *output_shown(fb_sess_run *r, const char *name) {
  const char *d = output_dir(r);
  char *p = NULL;
  if (!d[0]) return strdup(name);
  if (asprintf(&p, "%s/%s", d, name) < 0) return NULL;
  return p;
}

/* Close an output file; an error (a full disk) fails the save. */
static int close_output(FILE *f, int rc, const char *shown, const char *path, char **err) {
  int bad = fclose(f) != 0;
  if (!rc && bad) return errf(err, FB_EIO, "%s.to: %s: %s", path, shown, strerror(errno));
  return rc;
}

/* Field `name` into the file `file` (a name under the output directory,
 * opened by fb_out_open: it stays inside): a .png picture (2-D, a colour
 * map over "range" of spec) or a .npy array. path: the JSON path of the
 * action, for errors. */
static int save_field(fb_sess_run *r, json_t *spec, const char *name, const char *file,
                      const char *path, char **err) {
  char msg[1024];
  int rc;
  if ((rc = r->at->settle(r, path, err))) return rc; /* launches before it failed? */
  char *shown = output_shown(r, file);
  if (!shown) return errf(err, FB_ENOMEM, "%s: out of memory", path);
  if (!fb_png_is_name(file)) {
    fb_npy a;
    if ((rc = read_field(r, name, &a, err))) {
      free(shown);
      return errf(err, rc, "%s: %s", path, *err);
    }
    FILE *f = fb_out_open(output_dir(r), file, msg, sizeof msg);
    rc = f ? fb_npy_write(f, shown, &a, msg, sizeof msg) : FB_EIO;
    fb_npy_free(&a);
    if (rc) errf(err, rc, "%s.to: %s", path, msg);
    if (f) rc = close_output(f, rc, shown, path, err);
    free(shown);
    return rc;
  }
  const fb_lang_field *fld = NULL;
  int64_t cells = 0, n = 0;
  double *v = NULL;
  json_t *pt = json_object_get(spec, "particles");
  if (pt) { /* checked when loaded: a field of 2-vectors */
    fb_png_particles ps;
    if ((rc = particles_spec(pt, path, &ps, err)) ||
        (rc = field_info(r, name, &fld, &cells, err)) ||
        (fld->rows == 2 && !fld->cols && (rc = fb_sess_read_f64(r, name, &v, &n, err)))) {
      free(shown);
      return errf(err, rc, "%s: %s", path, *err);
    }
    if (fld->rows != 2 || fld->cols) {
      free(shown);
      return errf(err, FB_EINVAL, "%s.particles: '%s' is not a field of 2-vectors", path, name);
    }
    FILE *f = fb_out_open(output_dir(r), file, msg, sizeof msg);
    rc = f ? fb_png_write_particles(f, shown, name, v, n / 2, &ps, msg, sizeof msg) : FB_EIO;
    free(v);
    if (rc) errf(err, rc, "%s.to: %s", path, msg);
    if (f) rc = close_output(f, rc, shown, path, err);
    free(shown);
    return rc;
  }
  if ((rc = field_info(r, name, &fld, &cells, err)) ||
      (fld->ndim == 2 && fld->ncomp == 1 && (rc = fb_sess_read_f64(r, name, &v, &n, err)))) {
    free(shown);
    return errf(err, rc, "%s: %s", path, *err);
  }
  if (fld->ndim != 2 || fld->ncomp != 1) {
    free(shown);
    return errf(err, FB_EINVAL, "%s.to: a picture needs a 2-D field of scalars ('%s' is not)", path,
                name);
  }
  json_t *range = json_object_get(spec, "range"), *cmap = json_object_get(spec, "colormap");
  fb_png_opts po = {.has_range = range != NULL,
                    .lo = json_number_value(json_array_get(range, 0)),
                    .hi = json_number_value(json_array_get(range, 1)),
                    .colormap = json_string_value(cmap),
                    .taichi = orientation_taichi(json_object_get(spec, "orientation")) == 1};
  FILE *f = fb_out_open(output_dir(r), file, msg, sizeof msg);
  rc = f ? fb_png_write(f, shown, v, fld->shape[0], fld->shape[1], &po, msg, sizeof msg) : FB_EIO;
  free(v);
  if (rc) errf(err, rc, "%s.to: %s", path, msg);
  if (f) rc = close_output(f, rc, shown, path, err);
  free(shown);
  return rc;
}

/* The file name of a save, its {step} placeholders replaced by n. */
static char *save_name(const char *to, uint64_t n) {
  size_t cap = strlen(to) + 1, o = 0;
  for (const char *p = strchr(to, '{'); p; p = strchr(p + 1, '{')) cap += 24;
  char *out = malloc(cap);
  for (const char *p = to; out && *p;) {
    size_t len = 0;
    int width = *p == '{' ? step_placeholder(p, &len) : -1;
    if (width < 0) {
      out[o++] = *p++;
      continue;
    }
    o += (size_t)snprintf(out + o, cap - o, "%0*llu", width, (unsigned long long)n);
    p += len;
  }
  if (out) out[o] = 0;
  return out;
}

/* {"save": F, "to": NAME, "every": K}: on every K-th time this action
 * comes up (counted from 1 per run: that count is {step}), F to a file. */
static int do_save(fb_sess_run *r, json_t *a, const char *path, char **err) {
  if (r->o.skip_saves) return 0;
  int i = 0;
  while (i < r->nsaves && r->saves[i].action != a) i++;
  if (i == r->nsaves) {
    if (r->nsaves == r->capsaves) {
      int nc = r->capsaves ? 2 * r->capsaves : 8;
      void *v = realloc(r->saves, sizeof *r->saves * (size_t)nc);
      if (!v) return errf(err, FB_ENOMEM, "%s: out of memory", path);
      r->saves = v;
      r->capsaves = nc;
    }
    r->saves[r->nsaves].action = a;
    r->saves[r->nsaves++].n = 0;
  }
  uint64_t n = ++r->saves[i].n;
  json_t *every = json_object_get(a, "every");
  if (every && n % (uint64_t)json_integer_value(every)) return 0;
  char *name = save_name(json_string_value(json_object_get(a, "to")), n);
  if (!name) return errf(err, FB_ENOMEM, "%s: out of memory", path);
  int rc = save_field(r, a, json_string_value(json_object_get(a, "save")), name, path, err);
  free(name);
  return rc;
}

/* ---------------------------------------------------------------- checkpoints
 * docs/checkpoint.md "The CLI": in-process, sealed files (engine/seal.c)
 * under the local key, owner "" (a local run has no tenant); on a fuseboxd,
 * the server seals the session under its own key and the file streams here
 * (fb_remote_checkpoint), and a resume uploads it (fb_remote_restore). */

/* The local key: --checkpoint-key FILE (which must exist), else
 * $XDG_CONFIG_HOME/fusebox/checkpoint.key (~/.config/...), made 0600 on
 * first use. */
static int ckpt_key(fb_sess_run *r, char **err) {
  if (r->have_key) return 0;
  char path[4096], msg[1024];
  int create = 0;
  if (r->o.ckpt_key) {
    snprintf(path, sizeof path, "%s", r->o.ckpt_key);
  } else {
    const char *x = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    char dir[3800];
    if (x && x[0] == '/') snprintf(dir, sizeof dir, "%.3700s", x);
    else if (home && home[0]) snprintf(dir, sizeof dir, "%.3700s/.config", home);
    else return errf(err, FB_EINVAL, "no checkpoint key: set HOME or XDG_CONFIG_HOME, or give "
                                     "--checkpoint-key FILE");
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/fusebox", dir);
    if (mkdir(path, 0700) && errno != EEXIST)
      return errf(err, FB_EIO, "cannot make %s: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/fusebox/checkpoint.key", dir);
    create = 1;
  }
  int rc = fb_seal_key_load(path, create, r->key, &r->keylen, msg, sizeof msg);
  if (rc) return errf(err, rc, "%s", msg);
  r->have_key = 1;
  return 0;
}

static int fd_sink(void *user, const void *buf, size_t n) {
  int fd = *(int *)user;
  const uint8_t *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The session as a sealed checkpoint into fd. */
static int sealed_to_fd(fb_sess_run *r, int fd, const char *shown, char **err) {
  int rc = ckpt_key(r, err);
  if (rc) return rc;
  fb_seal *seal = fb_seal_begin(r->key, r->keylen, "", fd_sink, &fd);
  if (!seal) return errf(err, FB_ENOMEM, "out of memory");
  char msg[1024];
  rc = fb_session_checkpoint(r->s, fb_seal_write, seal, msg, sizeof msg);
  if (rc) {
    fb_seal_abort(seal);
    return errf(err, rc, "checkpoint %s: %s", shown, msg);
  }
  rc = fb_seal_finish(seal, msg, sizeof msg);
  if (rc) return errf(err, rc, "checkpoint %s: %s", shown, msg);
  if (fsync(fd)) return errf(err, FB_EIO, "checkpoint %s: %s", shown, strerror(errno));
  return 0;
}

/* The session on a fuseboxd as a checkpoint into the file `file` (the
 * server seals it; libfusebox writes a temporary twin, syncs, renames). */
static int remote_checkpoint(fb_sess_run *r, FILE *f, const char *file, const char *what,
                             char **err) {
  /* f: the place is checked and made (as for any output); the server's file is renamed onto it */
  int rc = fb_remote_checkpoint(r->rem, file, NULL, 0);
  if (rc) return errf(err, rc, "%s: %s", what, sess_errmsg(r));
  return 0;
}

static int local_checkpoint(fb_sess_run *r, FILE *f, const char *file, const char *what,
                            char **err) {
  if (f) {
    fflush(f);
    if (ftruncate(fileno(f), 0)) { /* fb_out_open may reuse a file */
    }
    return sealed_to_fd(r, fileno(f), file, err);
  }
  char *tmp = NULL;
  if (asprintf(&tmp, "%s.tmp%d", file, (int)getpid()) < 0) return errf(err, FB_ENOMEM, "out of memory");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  int rc = fd < 0 ? errf(err, FB_EIO, "%s: %s: %s", what, tmp, strerror(errno))
                  : sealed_to_fd(r, fd, file, err);
  if (fd >= 0 && close(fd) && !rc) rc = errf(err, FB_EIO, "%s: %s", tmp, strerror(errno));
  if (!rc && rename(tmp, file))
    rc = errf(err, FB_EIO, "%s: cannot rename it to %s: %s", tmp, file, strerror(errno));
  if (rc) unlink(tmp); /* the previous checkpoints stay as they were */
  free(tmp);
  return rc;
}

/* {"checkpoint": NAME}: a sealed checkpoint into NAME under the output
 * directory (as "save" files are). */
static int do_checkpoint(fb_sess_run *r, json_t *a, const char *path, char **err) {
  int rc;
  const char *name = json_string_value(json_object_get(a, "checkpoint"));
  char msg[1024];
  char *shown = output_shown(r, name);
  FILE *f = fb_out_open(output_dir(r), name, msg, sizeof msg);
  if (!f || !shown) {
    rc = f ? errf(err, FB_ENOMEM, "%s: out of memory", path)
           : errf(err, FB_EIO, "%s.checkpoint: %s", path, msg);
    if (f) fclose(f);
    free(shown);
    return rc;
  }
  char what[1100];
  snprintf(what, sizeof what, "%.1000s.checkpoint", path);
  rc = r->at->checkpoint(r, f, shown, what, err);
  if (fclose(f) && !rc) rc = errf(err, FB_EIO, "%s.checkpoint: %s", path, strerror(errno));
  free(shown);
  return rc;
}

static int64_t local_ckpt_count(fb_sess_run *r) {
  return fb_session_tape_loss(r->s) >= 0 ? -1 : (int64_t)fb_session_launches(r->s);
}

static int64_t remote_ckpt_count(fb_sess_run *r) { return r->in_tape ? -1 : (int64_t)r->nlaunch; }

/* --checkpoint-every N: after each action that launched, a checkpoint
 * once N launches have run since the last one (never inside a tape):
 * DIR/NAME-LAUNCHES.fbck, written to a temporary file, synced, renamed;
 * the one before the previous is removed. */
static int periodic_checkpoint(fb_sess_run *r, const char *path, char **err) {
  if (!r->o.ckpt_every || r->skip) return 0;
  int64_t at = r->at->ckpt_count(r);
  if (at < 0) return 0;
  uint64_t n = (uint64_t)at;
  if (n - r->ckpt_at < r->o.ckpt_every) return 0;
  const char *name = r->f->name ? r->f->name : "session";
  char *file = NULL;
  if (asprintf(&file, "%s/%s-%012llu.fbck", r->o.ckpt_dir, name, (unsigned long long)n) < 0)
    return errf(err, FB_ENOMEM, "out of memory");
  char what[1100];
  snprintf(what, sizeof what, "%.1000s: --checkpoint-dir", path);
  int rc = r->at->checkpoint(r, NULL, file, what, err);
  if (rc) {
    free(file);
    return rc;
  }
  int dfd = open(r->o.ckpt_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd); /* the rename too */
    close(dfd);
  }
  if (r->ckpt_files[0]) unlink(r->ckpt_files[0]);
  free(r->ckpt_files[0]);
  r->ckpt_files[0] = r->ckpt_files[1];
  r->ckpt_files[1] = file;
  r->ckpt_at = n;
  return 0;
}

typedef struct fd_src {
  int fd;
  uint64_t left;
} fd_src;

static long fd_source(void *user, void *buf, size_t n) {
  fd_src *s = user;
  if (n > s->left) n = (size_t)s->left;
  if (!n) return 0;
  ssize_t got;
  do got = read(s->fd, buf, n);
  while (got < 0 && errno == EINTR);
  if (got <= 0) return got < 0 ? -1 : 0;
  s->left -= (uint64_t)got;
  return (long)got;
}

/* The run's session from the sealed checkpoint `file`. */
static int resume_session(fb_sess_run *r, const char *file, const fb_session_config *cfg,
                          char **err) {
  int rc = ckpt_key(r, err);
  if (rc) return rc;
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errf(err, FB_EIO, "resume: %s: %s", file, strerror(errno));
  char msg[1024];
  uint64_t plen = 0;
  /* the seal's MAC over all but the fields here, the fields' bytes against
     their SHA-256 in the manifest as the restore reads them: one pass */
  rc = fb_seal_check_fd(fd, r->key, r->keylen, "", &plen, msg, sizeof msg);
  if (!rc && lseek(fd, 0, SEEK_SET) != 0) {
    rc = FB_EIO;
    snprintf(msg, sizeof msg, "%s", strerror(errno));
  }
  fd_src src = {fd, plen};
  if (!rc) rc = fb_session_restore_sealed(r->eng, cfg, fd_source, &src, &r->s, msg, sizeof msg);
  close(fd);
  if (rc) return errf(err, rc, "resume: %s: %s", file, msg);
  if (!fb_layout_equal(fb_session_layout(r->s), fb_program_layout(r->f->prog)))
    return errf(err, FB_EINVAL,
                "resume: %s: the checkpoint is of a session with other fields than %s's program",
                file, r->f->path);
  r->restored = 1;
  r->skip = r->ckpt_at = fb_session_launches(r->s);
  return 0;
}

/* The run's session on the fuseboxd from the checkpoint `file` (made by
 * fb_remote_checkpoint, a --server run's --checkpoint-dir or "checkpoint"
 * action): uploaded; the server checks its seal, owner, format and quotas. */
static int resume_remote(fb_sess_run *r, const fb_remote_options *ro, const char *file,
                         char **err) {
  int rc = fb_remote_restore(r->cli, ro, file, NULL, &r->rem);
  if (rc) { /* "restore: Restore: the checkpoint was modified ...": the words after the call's names */
    const char *m = fb_client_errmsg(r->cli);
    if (!strncmp(m, "restore: ", 9)) m += 9;
    if (!strncmp(m, "Restore: ", 9)) m += 9;
    return errf(err, rc, "resume: %s: %s", file, m);
  }
  if (!fb_layout_equal(fb_remote_layout(r->rem), fb_program_layout(r->f->prog)))
    return errf(err, FB_EINVAL,
                "resume: %s: the checkpoint is of a session with other fields than %s's program",
                file, r->f->path);
  fb_counters c;
  if ((rc = fb_remote_counters(r->rem, &c)))
    return errf(err, rc, "resume: %s: %s", file, sess_errmsg(r));
  r->restored = 1;
  r->skip = r->ckpt_at = r->seq_base = c.launches;
  return 0;
}

static int run_list(fb_sess_run *r, json_t *list, const char *path, char **err);

static int run_action(fb_sess_run *r, json_t *a, const char *path, char **err) {
  int rc;
  if (json_object_get(a, "launch")) rc = do_launch(r, a, path, err);
  else if (json_object_get(a, "tape")) {
    if (r->skip)
      return errf(err, FB_EUNSUPPORTED,
                  "%s: resuming before a tape is not supported yet (the checkpoint was taken "
                  "%llu launches before this tape's end)",
                  path, (unsigned long long)r->skip);
    rc = do_tape(r, a, path, err);
  } else if (json_object_get(a, "checkpoint")) return r->skip ? 0 : do_checkpoint(r, a, path, err);
  else if (r->skip && (json_object_get(a, "save") || json_object_get(a, "write")))
    return 0; /* done before the checkpoint: its effect is in the fields */
  else if (json_object_get(a, "save")) return do_save(r, a, path, err);
  else if (json_object_get(a, "write")) return do_write(r, a, path, err);
  else goto rest;
  return rc ? rc : periodic_checkpoint(r, path, err);
rest:
  if (json_object_get(a, "activate") || json_object_get(a, "deactivate") ||
      json_object_get(a, "deactivate_all"))
    return (rc = do_host(r, a, path, err)) ? rc : periodic_checkpoint(r, path, err);
  if (json_object_get(a, "repeat")) {
    json_int_t n = json_integer_value(json_object_get(a, "repeat"));
    char sub[1024];
    snprintf(sub, sizeof sub, "%.1000s.do", path);
    for (json_int_t i = 0; i < n; i++) {
      int rc = run_list(r, json_object_get(a, "do"), sub, err);
      if (rc) return rc;
    }
    return 0;
  }
  if (json_object_get(a, "flush")) return r->at->flush(r, path, err);
  return r->at->sync(r, path, err);
}

static int run_list(fb_sess_run *r, json_t *list, const char *path, char **err) {
  size_t i;
  json_t *a;
  json_array_foreach(list, i, a) {
    const act_memo *m = act_of(r, a, path, i);
    if (!m) return errf(err, FB_ENOMEM, "%s[%zu]: out of memory", path, i);
    int rc = run_action(r, a, r->paths[m->path], err);
    if (rc) return rc;
  }
  return 0;
}

int fb_sess_actions(fb_sess_run *r, const char *list, char **err) {
  json_t *l = json_object_get(r->f->root, list);
  if (!l) return 0;
  char path[64];
  snprintf(path, sizeof path, "$.%s", list);
  r->plist = list;
  r->pdone = r->pshown = 0;
  r->ptotal = r->o.progress ? count_launches(l) : 0;
  r->pstart = r->plast = mono_s();
  int rc = run_list(r, l, path, err);
  if (r->pshown) fprintf(stderr, "\r\033[K"); /* the line goes when the list is done */
  return rc;
}

/* ---------------------------------------------------------------- checks */

int fb_sess_read_f64(fb_sess_run *r, const char *field, double **vals, int64_t *n, char **err) {
  fb_npy a;
  int rc = read_field(r, field, &a, err);
  if (rc) return rc;
  *n = fb_npy_numel(&a);
  *vals = malloc(sizeof(double) * (size_t)(*n ? *n : 1));
  size_t es = fb_type_size(a.type);
  for (int64_t i = 0; *vals && i < *n; i++)
    (*vals)[i] = fb_value_as_f64(fb_value_load(a.type, (uint8_t *)a.data + (size_t)i * es));
  fb_npy_free(&a);
  return *vals ? 0 : FB_ENOMEM;
}

static double num(json_t *v, double dflt) {
  return v && json_is_number(v) ? json_number_value(v) : dflt;
}

static int close_enough(double got, double want, double rtol, double atol) {
  if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
  return fabs(got - want) <= atol + rtol * fabs(want);
}

/* One "read" check; returns 1 when it failed, 0 when it passed, < 0 on error. */
static int run_check(fb_sess_run *r, json_t *c, size_t idx, char **err) {
  const char *name = json_string_value(json_object_get(c, "read"));
  FILE *o = r->o.out;
  json_t *to = json_object_get(c, "to");
  if (to) {
    char path[64];
    snprintf(path, sizeof path, "$.checks[%zu]", idx);
    const char *file = json_string_value(to);
    int rc = save_field(r, c, name, file, path, err);
    char *shown = rc ? NULL : output_shown(r, file);
    if (!rc) fprintf(o, "ok    checks[%zu] %s saved to %s\n", idx, name, shown ? shown : file);
    free(shown);
    if (rc) return rc;
  }
  json_t *sum = json_object_get(c, "sum"), *eq = json_object_get(c, "equals");
  json_t *mn = json_object_get(c, "min"), *mx = json_object_get(c, "max");
  if (!sum && !eq && !mn && !mx) return 0;
  double rtol = num(json_object_get(c, "rtol"), 1e-6), atol = num(json_object_get(c, "atol"), 0);
  double *v;
  int64_t n;
  int rc = fb_sess_read_f64(r, name, &v, &n, err);
  if (rc) return errf(err, rc, "$.checks[%zu]: %s", idx, *err);
  int failed = 0;
  if (sum) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    int ok = close_enough(s, json_number_value(sum), rtol, atol);
    fprintf(o, "%s checks[%zu] sum(%s) = %.9g, expected %.9g (rtol %g, atol %g)\n",
            ok ? "ok   " : "FAIL ", idx, name, s, json_number_value(sum), rtol, atol);
    failed |= !ok;
  }
  if (eq) {
    int64_t bad = -1;
    size_t ne = json_is_array(eq) ? json_array_size(eq) : 0;
    if (json_is_array(eq) && (int64_t)ne != n) {
      fprintf(o, "FAIL  checks[%zu] %s has %lld values, expected %zu\n", idx, name, (long long)n,
              ne);
      failed = 1;
    } else {
      for (int64_t i = 0; i < n && bad < 0; i++) {
        double want = json_is_array(eq) ? num(json_array_get(eq, (size_t)i), NAN) : num(eq, NAN);
        if (!close_enough(v[i], want, rtol, atol)) bad = i;
      }
      double want = bad < 0             ? 0
                    : json_is_array(eq) ? num(json_array_get(eq, (size_t)bad), NAN)
                                        : num(eq, NAN);
      if (bad < 0)
        fprintf(o, "ok    checks[%zu] %s equals the expected value%s\n", idx, name,
                n > 1 ? "s" : "");
      else
        fprintf(o, "FAIL  checks[%zu] %s[%lld] = %.9g, expected %.9g (off by %.3g, rtol %g)\n", idx,
                name, (long long)bad, v[bad], want, v[bad] - want, rtol);
      failed |= bad >= 0;
    }
  }
  if (mn || mx) {
    double lo = num(mn, -INFINITY), hi = num(mx, INFINITY), vmin = INFINITY, vmax = -INFINITY;
    int64_t nan = 0;
    for (int64_t i = 0; i < n; i++) {
      if (isnan(v[i])) nan++;
      vmin = fmin(vmin, v[i]);
      vmax = fmax(vmax, v[i]);
    }
    int ok = !nan && vmin >= lo - atol && vmax <= hi + atol;
    fprintf(o, "%s checks[%zu] %s in [%.9g, %.9g]: values span [%.9g, %.9g]%s\n",
            ok ? "ok   " : "FAIL ", idx, name, lo, hi, vmin, vmax, nan ? " and include NaN" : "");
    failed |= !ok;
  }
  free(v);
  return failed;
}

int fb_sess_checks(fb_sess_run *r, char **err) {
  json_t *checks = json_object_get(r->f->root, "checks");
  size_t i;
  json_t *c;
  int failed = 0;
  json_array_foreach(checks, i, c) {
    if (json_object_get(c, "same_across_modes")) continue; /* a bench check */
    int rc = run_check(r, c, i, err);
    if (rc < 0) return rc;
    failed += rc;
  }
  return failed;
}

/* ---------------------------------------------------------------- the two places */

static const sess_place local_place = {
    .open = local_open,
    .errmsg = local_errmsg,
    .backend = local_backend,
    .device = local_device,
    .launch = local_launch,
    .host_begin = local_host_kernel,
    .host_cell = local_host_cell,
    .tape = local_tape,
    .settle = local_settle,
    .field_read = local_field_read,
    .field_write = local_field_write,
    .flush = local_flush,
    .sync = local_sync,
    .counters = local_counters,
    .ckpt_count = local_ckpt_count,
    .checkpoint = local_checkpoint,
};

static const sess_place remote_place = {
    .open = start_remote,
    .errmsg = remote_errmsg,
    .backend = remote_backend,
    .device = remote_device,
    .launch = remote_launch,
    .host_begin = remote_host_begin,
    .host_cell = remote_host_cell,
    .tape = remote_tape,
    .settle = remote_sync_all,
    .field_read = remote_field_read,
    .field_write = remote_field_write,
    .flush = remote_flush,
    .sync = remote_sync_all,
    .counters = remote_counters,
    .ckpt_count = remote_ckpt_count,
    .checkpoint = remote_checkpoint,
};
