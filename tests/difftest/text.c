/* A differential-test program as text, and back: the IR module (layout and
 * kernels as fb_layout_print / fb_kernel_print write them, which
 * fb_ir_parse reads) followed by one "#!" comment line per step:
 *
 *   #! launch k1 3 -2        arguments as numbers (converted to the
 *                            parameter types)
 *   #! field_read f2         #! field_write f2 0x1f3a (seed of the contents)
 *   #! cell_read f2 1 3      #! cell_write f2 1 3 = 7
 *   #! flush                 #! sync
 *
 * "#" lines are comments to the IR parser, so the text is a valid module;
 * FB_DIFF_FILE=path replays it (tests/test_differential.c). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt.h"

typedef struct sbuf {
  char *s;
  size_t n, cap;
} sbuf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int need = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (need < 0) return;
  if (b->n + (size_t)need + 1 > b->cap) {
    size_t cap = (b->cap + (size_t)need + 1) * 2;
    char *s = realloc(b->s, cap);
    if (!s) return;
    b->s = s;
    b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
  va_end(ap);
  b->n += (size_t)need;
}

static void sb_value(sbuf *b, fb_value v) {
  if (fb_type_is_float(v.type)) sb_printf(b, " %.17g", v.v.f);
  else if (fb_type_is_signed(v.type)) sb_printf(b, " %lld", (long long)v.v.i);
  else sb_printf(b, " %llu", (unsigned long long)v.v.u);
}

static void step_text(sbuf *b, const dt_prog *p, const dt_step *s) {
  sb_printf(b, "#! %s", dt_step_name(s->kind));
  if (s->kind == DT_LAUNCH) {
    sb_printf(b, " %s", p->ks[s->kernel]->name);
    for (int i = 0; i < s->nargs; i++) sb_value(b, s->args[i]);
  } else if (s->kind != DT_FLUSH && s->kind != DT_SYNC) {
    const fb_snode *f = &p->l->nodes[s->field];
    sb_printf(b, " %s", f->name);
    if (s->kind == DT_FIELD_WRITE) sb_printf(b, " 0x%llx", (unsigned long long)s->data);
    if (s->kind == DT_CELL_READ || s->kind == DT_CELL_WRITE)
      for (int d = 0; d < f->ndim; d++) sb_printf(b, " %lld", (long long)s->idx[d]);
    if (s->kind == DT_CELL_WRITE) {
      sb_printf(b, " =");
      sb_value(b, fb_value_cast(s->val, f->type));
    }
  }
  sb_printf(b, "\n");
}

char *dt_prog_text(const dt_prog *p, const char *header) {
  sbuf b = {0};
  if (header) {
    const char *h = header;
    while (*h) {
      const char *e = strchr(h, '\n');
      size_t n = e ? (size_t)(e - h) : strlen(h);
      sb_printf(&b, "# %.*s\n", (int)n, h);
      h += n + (e ? 1 : 0);
    }
  }
  char *lt = fb_layout_print(p->l);
  sb_printf(&b, "%s", lt ? lt : "# (layout: out of memory)\n");
  free(lt);
  for (int i = 0; i < p->nk; i++) {
    fb_kernel *c = fb_kernel_compact(p->ks[i]);
    char *kt = fb_kernel_print(c ? c : p->ks[i]);
    sb_printf(&b, "\n%s", kt ? kt : "# (kernel: out of memory)\n");
    free(kt);
    fb_kernel_free(c);
  }
  sb_printf(&b, "\n#! seed 0x%llx\n", (unsigned long long)p->seed);
  for (int i = 0; i < p->nsteps; i++) step_text(&b, p, &p->steps[i]);
  return b.s;
}

/* ---------------------------------------------------------------- parsing */

static int next_tok(const char **s, char *tok, size_t len) {
  const char *p = *s;
  while (*p == ' ' || *p == '\t') p++;
  size_t n = 0;
  while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
    if (n + 1 < len) tok[n++] = *p;
    p++;
  }
  tok[n] = 0;
  *s = p;
  return n > 0;
}

static int parse_number(const char *tok, fb_type t, fb_value *out) {
  char *end;
  errno = 0;
  if (fb_type_is_float(t)) {
    double d = strtod(tok, &end);
    *out = t == FB_T_F32 ? fb_value_f32((float)d) : fb_value_f64(d);
  } else if (tok[0] == '-') {
    *out = fb_value_cast(fb_value_i64(strtoll(tok, &end, 0)), t);
  } else {
    *out = fb_value_cast(fb_value_u64(strtoull(tok, &end, 0)), t);
  }
  return *end == 0 && errno == 0 ? 0 : -1;
}

static int find_kernel(const dt_prog *p, const char *name) {
  for (int i = 0; i < p->nk; i++)
    if (strcmp(p->ks[i]->name, name) == 0) return i;
  return -1;
}

static int parse_step(dt_prog *p, const char *line, dt_step *s, char *err, size_t errlen) {
  char tok[128];
  memset(s, 0, sizeof *s);
  if (!next_tok(&line, tok, sizeof tok)) return 1;
  if (strcmp(tok, "seed") == 0) {
    if (next_tok(&line, tok, sizeof tok)) p->seed = strtoull(tok, NULL, 0);
    return 1;
  }
  s->kind = -1;
  for (int k = 0; k < DT_STEP__COUNT; k++)
    if (strcmp(tok, dt_step_name(k)) == 0) s->kind = k;
  if (s->kind < 0) {
    snprintf(err, errlen, "unknown step '%s'", tok);
    return -1;
  }
  if (s->kind == DT_FLUSH || s->kind == DT_SYNC) return 0;
  if (!next_tok(&line, tok, sizeof tok)) {
    snprintf(err, errlen, "%s: missing name", dt_step_name(s->kind));
    return -1;
  }
  if (s->kind == DT_LAUNCH) {
    s->kernel = find_kernel(p, tok);
    if (s->kernel < 0) {
      snprintf(err, errlen, "launch: no kernel '%s'", tok);
      return -1;
    }
    const fb_kernel *k = p->ks[s->kernel];
    for (s->nargs = 0; s->nargs < k->nparams && s->nargs < DT_MAXP; s->nargs++)
      if (!next_tok(&line, tok, sizeof tok) ||
          parse_number(tok, k->params[s->nargs], &s->args[s->nargs])) {
        snprintf(err, errlen, "launch %s: argument %d missing or bad", k->name, s->nargs);
        return -1;
      }
    return 0;
  }
  s->field = fb_layout_find(p->l, tok);
  if (s->field < 0 || p->l->nodes[s->field].kind != FB_SN_PLACE) {
    snprintf(err, errlen, "%s: no field '%s'", dt_step_name(s->kind), tok);
    return -1;
  }
  const fb_snode *f = &p->l->nodes[s->field];
  if (s->kind == DT_FIELD_WRITE && next_tok(&line, tok, sizeof tok))
    s->data = strtoull(tok, NULL, 0);
  if (s->kind == DT_CELL_READ || s->kind == DT_CELL_WRITE)
    for (int d = 0; d < f->ndim; d++) {
      if (!next_tok(&line, tok, sizeof tok)) {
        snprintf(err, errlen, "%s %s: missing index", dt_step_name(s->kind), tok);
        return -1;
      }
      s->idx[d] = strtoll(tok, NULL, 0);
      if (s->idx[d] < 0 || s->idx[d] >= f->shape[f->dim_axis[d]]) {
        snprintf(err, errlen, "%s %s: index %d out of range", dt_step_name(s->kind), f->name, d);
        return -1;
      }
    }
  if (s->kind == DT_CELL_WRITE) {
    if (!next_tok(&line, tok, sizeof tok) || strcmp(tok, "=") != 0 ||
        !next_tok(&line, tok, sizeof tok) || parse_number(tok, f->type, &s->val)) {
      snprintf(err, errlen, "cell_write %s: expected '= value'", f->name);
      return -1;
    }
  }
  return 0;
}

int dt_prog_parse(const char *text, dt_prog *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_ir_parse(text, &out->l, &out->ks, &out->nk, &d);
  if (rc) {
    char *m = fb_diags_join(&d);
    snprintf(err, errlen, "IR: %s", m ? m : fb_strerror(rc));
    free(m);
    fb_diags_free(&d);
    return rc;
  }
  fb_diags_free(&d);
  int cap = 16;
  out->steps = malloc(sizeof *out->steps * (size_t)cap);
  for (const char *line = text; line && *line;
       line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (strncmp(line, "#!", 2) != 0) continue;
    if (out->nsteps == cap) {
      cap *= 2;
      dt_step *v = realloc(out->steps, sizeof *v * (size_t)cap);
      if (!v) break;
      out->steps = v;
    }
    if (!out->steps) {
      dt_prog_free(out);
      return FB_ENOMEM;
    }
    int r = parse_step(out, line + 2, &out->steps[out->nsteps], err, errlen);
    if (r < 0) {
      dt_prog_free(out);
      return FB_EPARSE;
    }
    if (r == 0) out->nsteps++;
  }
  return 0;
}
