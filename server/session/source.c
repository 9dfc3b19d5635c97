/* .fbk source over the wire: fuseboxd runs the front end (lang/) for
 * clients that have none (Python, any gRPC client). The source is hostile
 * input, so it is parsed only where the tenant's own work runs: in the
 * session's worker process under process isolation (and, under thread
 * isolation, on the session's thread), never on a completion-queue thread
 * and never in the broker. Three uses, called from exec.c, proc.c and
 * session.c:
 *  - CreateSession with a Source: the program's layout (fbd_source_layout),
 *    which the broker then receives as protobuf and checks as it checks a
 *    client's layout;
 *  - RegisterKernels with a Source: the IR kernels of the request, its own
 *    followed by the named instances (fbd_source_expand), registered as IR
 *    kernels are (fb_kernel_check_public and the rest);
 *  - DescribeSource: the program's fields and kernels with their
 *    signatures (fbd_source_describe), in a session that lives for that one
 *    request.
 * Every parse runs within a budget (fbd_parse_limits): the source's size
 * (FBD_SOURCE_MAX, after ${NAME} substitution), the front end's nesting and
 * per-kernel limits, the work of the whole program after inlining
 * (FB_LANG_PROGRAM_WORK), a deadline, and a stop when the request is
 * cancelled or its client has gone. The server keeps no program: a
 * request that registers kernels carries its source again, and the
 * program's layout must then be the session's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/lang.h"
#include "server/server.h"

#define FBD_SOURCE_MAX ((size_t)1 << 20)
#define MAX_INSTANCES FBD_SOURCE_INSTANCES
#define MAX_PARAM_NAME 128
#define MAX_SHOWN_LINE 400 /* longer source lines are not quoted in messages */

/* ---------------------------------------------------------------- parse */

static const char *src_name(const Fusebox__V1__Source *m) {
  return m->filename && m->filename[0] ? m->filename : "<source>";
}

static const char *param_value(const Fusebox__V1__Source *m, const char *name, size_t n) {
  for (size_t i = 0; i < m->n_params; i++) {
    const char *k = m->params[i]->key;
    if (strlen(k) == n && memcmp(k, name, n) == 0) return m->params[i]->value;
  }
  return NULL;
}

/* The text with every ${NAME} replaced (malloc'd), or NULL with err: an
 * unknown name, or a result over FBD_SOURCE_MAX (checked before growing). */
static char *substitute(const Fusebox__V1__Source *m, char *err, size_t errlen) {
  const char *t = m->text ? m->text : "";
  size_t cap = strlen(t) + 1, n = 0;
  if (cap > FBD_SOURCE_MAX) {
    fb_errf(err, errlen, "%s: the source is %zu bytes; the server accepts at most %zu", src_name(m),
            cap - 1, FBD_SOURCE_MAX);
    return NULL;
  }
  char *out = malloc(cap);
  if (!out) return fb_errf(err, errlen, "out of memory"), NULL;
  for (const char *p = t; *p;) {
    const char *val = p, *q = p[0] == '$' && p[1] == '{' ? strchr(p + 2, '}') : NULL;
    size_t vlen = 1;
    if (q) {
      size_t nl = (size_t)(q - p - 2);
      if (!(val = param_value(m, p + 2, nl))) {
        fb_errf(err, errlen, "%s: ${%.*s} is not a parameter (the request's params name %zu)",
                src_name(m), (int)(nl > MAX_PARAM_NAME ? MAX_PARAM_NAME : nl), p + 2, m->n_params);
        free(out);
        return NULL;
      }
      vlen = strlen(val);
    }
    if (vlen > FBD_SOURCE_MAX - n - 1) {
      fb_errf(err, errlen,
              "%s: the source after substitution is over %zu bytes, the most the "
              "server accepts",
              src_name(m), FBD_SOURCE_MAX);
      free(out);
      return NULL;
    }
    if (n + vlen + 1 > cap) {
      size_t nc = cap * 2 < n + vlen + 1 ? n + vlen + 1 : cap * 2;
      if (nc > FBD_SOURCE_MAX) nc = FBD_SOURCE_MAX;
      char *g = realloc(out, nc);
      if (!g) {
        free(out);
        return fb_errf(err, errlen, "out of memory"), NULL;
      }
      out = g;
      cap = nc;
    }
    memcpy(out + n, val, vlen);
    n += vlen;
    p = q ? q + 1 : p + 1;
  }
  out[n] = 0;
  return out;
}

/* The diagnostics into err, as many as fit: each with its source line and
 * caret where the line is short, else with its position only (hostile
 * source may put a megabyte on one line and an error on every token, so
 * rendering them all, as fb_diags_render does, is not bounded). */
static void render(const char *fname, const char *src, const fb_diags *d, int rc, char *err,
                   size_t errlen) {
  size_t used = 0;
  int i = 0;
  err[0] = 0;
  for (; d && i < d->n && used + 1 < errlen; i++) {
    const fb_diag *g = &d->v[i];
    const char *ls = src;
    for (int l = 1; ls && l < g->line; l++) {
      ls = strchr(ls, '\n');
      if (ls) ls++;
    }
    int short_line = ls && strcspn(ls, "\n") <= MAX_SHOWN_LINE && g->col <= MAX_SHOWN_LINE;
    char *one = fb_diag_render(fname, short_line ? src : NULL, g);
    if (!one) break;
    size_t n = strlen(one);
    if (used + n + 64 >= errlen && i) { /* keep room to say how many are left */
      free(one);
      break;
    }
    fb_errcat(err, errlen, "%s", one);
    used = strlen(err); /* errlen - 1 when it was cut */
    free(one);
  }
  if (d && i < d->n) fb_errcat(err, errlen, "(and %d more errors)\n", d->n - i);
  if (!err[0]) fb_errf(err, errlen, "%s: %s", fname, fb_strerror(rc));
}

/* The budget's stop: why the parse must end, or NULL. */
static const char *parse_stop(void *arg) {
  const fbd_parse_limits *pl = arg;
  if (pl->cancel && atomic_load(pl->cancel)) return "the request was cancelled";
  if (pl->gone && atomic_load(pl->gone)) return "its client went away";
  if (pl->deadline > 0 && fbd_now() > pl->deadline) return pl->deadline_why;
  return NULL;
}

void fbd_parse_limits_init(fbd_parse_limits *pl, double timeout_s, _Atomic int *cancel,
                           _Atomic int *gone) {
  memset(pl, 0, sizeof *pl);
  pl->cancel = cancel;
  pl->gone = gone;
  if (timeout_s > 0) {
    pl->deadline = fbd_now() + timeout_s;
    fb_errf(pl->deadline_why, sizeof pl->deadline_why,
            "parsing the source ran past its %g s (compile_timeout_s)", timeout_s);
  }
}

/* Parse m into *out, or FB_E* with the rendered diagnostics in err. */
static int parse(const Fusebox__V1__Source *m, const fbd_parse_limits *pl, fb_program **out,
                 char *err, size_t errlen) {
  *out = NULL;
  char *src = substitute(m, err, errlen);
  if (!src) return FB_EINVAL;
  fb_diags d;
  fb_diags_init(&d);
  fb_lang_budget b = {0, parse_stop, (void *)pl};
  int rc = fb_program_parse_within(src_name(m), src, &b, out, &d);
  if (rc) render(src_name(m), src, &d, rc, err, errlen);
  fb_diags_free(&d);
  free(src);
  return rc;
}

/* ---------------------------------------------------------------- CreateSession */

int fbd_source_layout(const Fusebox__V1__CreateSessionRequest *m, const fbd_parse_limits *pl,
                      fb_layout **out, char *err, size_t errlen) {
  *out = NULL;
  if (!m->source) return fbp_layout_from_pb(m->layout, out, err, errlen);
  if (m->layout && m->layout->n_nodes) {
    fb_errf(err, errlen, "CreateSession: give a layout or a source, not both");
    return FB_EINVAL;
  }
  fb_program *p = NULL;
  int rc = parse(m->source, pl, &p, err, errlen);
  if (rc) return rc;
  *out = fb_layout_clone(fb_program_layout(p));
  fb_program_free(p);
  if (!*out) return fb_errf(err, errlen, "out of memory"), FB_ENOMEM;
  return 0;
}

/* ---------------------------------------------------------------- RegisterKernels */

static int instantiate(fb_program *p, const Fusebox__V1__KernelInstance *ki, fbp_arena *a,
                       Fusebox__V1__Kernel **out, const char *fname, char *err, size_t errlen) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(p, ki->kernel, (const char *const *)ki->fields, (int)ki->n_fields,
                                  &k, &d);
  if (rc) {
    fb_errf(err, errlen, "kernel '%.128s': ", ki->kernel);
    size_t k = strlen(err);
    if (d.n) render(fname, fb_program_source(p), &d, rc, err + k, errlen - k);
    else
      fb_errcat(err, errlen, "%s",
                rc == FB_ENOENT ? "no such kernel, or no such field to bind, in the source"
                                : fb_strerror(rc));
  } else if (!(*out = fbp_kernel_to_pb(a, k))) {
    rc = FB_ENOMEM;
    fb_errf(err, errlen, "out of memory");
  }
  fb_diags_free(&d);
  return rc;
}

/* The instances to register: those asked for, or every kernel without
 * field parameters. */
static int default_instances(const fb_program *p, fbp_arena *a, Fusebox__V1__KernelInstance ***out,
                             size_t *n) {
  int nk = fb_program_nkernels(p);
  *out = fbp_alloc(a, sizeof **out * (size_t)(nk + 1));
  if (!*out) return FB_ENOMEM;
  *n = 0;
  for (int i = 0; i < nk; i++) {
    const fb_lang_kernel *k = fb_program_kernel(p, i);
    if (k->nfield_params) continue;
    Fusebox__V1__KernelInstance *ki = fbp_alloc(a, sizeof *ki);
    if (!ki) return FB_ENOMEM;
    fusebox__v1__kernel_instance__init(ki);
    ki->kernel = (char *)k->name;
    (*out)[(*n)++] = ki;
  }
  return 0;
}

int fbd_source_expand(const Fusebox__V1__RegisterKernelsRequest *m, const fb_layout *session_layout,
                      const fbd_parse_limits *pl, fbp_arena *a, Fusebox__V1__Kernel ***out,
                      size_t *nout, char *err, size_t errlen) {
  *out = m->kernels;
  *nout = m->n_kernels;
  if (!m->source) {
    if (!m->n_instances) return 0;
    fb_errf(err, errlen, "RegisterKernels: kernel instances need the source");
    return FB_EINVAL;
  }
  if (m->n_instances > MAX_INSTANCES) {
    fb_errf(err, errlen, "RegisterKernels: %zu kernel instances; at most %d per request",
            m->n_instances, MAX_INSTANCES);
    return FB_EINVAL;
  }
  fb_program *p = NULL;
  int rc = parse(m->source, pl, &p, err, errlen);
  if (rc) return rc;
  if (!fb_layout_equal(fb_program_layout(p), session_layout)) {
    fb_errf(err, errlen, "RegisterKernels: the layout of %s is not the session's",
            src_name(m->source));
    fb_program_free(p);
    return FB_EINVAL;
  }
  Fusebox__V1__KernelInstance **inst = m->instances;
  size_t ni = m->n_instances;
  if (!ni && (rc = default_instances(p, a, &inst, &ni))) {
    fb_program_free(p);
    return fb_errf(err, errlen, "out of memory"), rc;
  }
  if (ni > MAX_INSTANCES) {
    fb_errf(err, errlen,
            "RegisterKernels: %s has %zu kernels without field parameters; at "
            "most %d are registered per request (name them in instances)",
            src_name(m->source), ni, MAX_INSTANCES);
    fb_program_free(p);
    return FB_EQUOTA;
  }
  Fusebox__V1__Kernel **ks = fbp_alloc(a, sizeof *ks * (m->n_kernels + ni + 1));
  if (!ks) rc = FB_ENOMEM, fb_errf(err, errlen, "out of memory");
  for (size_t i = 0; !rc && i < m->n_kernels; i++) ks[i] = m->kernels[i];
  for (size_t i = 0; !rc && i < ni; i++)
    rc = instantiate(p, inst[i], a, &ks[m->n_kernels + i], src_name(m->source), err, errlen);
  if (!rc) {
    *out = ks;
    *nout = m->n_kernels + ni;
  }
  fb_program_free(p); /* the pb kernels live in the arena */
  return rc;
}

/* ---------------------------------------------------------------- DescribeSource */

static Fusebox__V1__FieldInfo *field_info(fbp_arena *a, const fb_layout *l,
                                          const fb_lang_field *f) {
  Fusebox__V1__FieldInfo *fi = fbp_alloc(a, sizeof *fi);
  int64_t *shape = fbp_alloc(a, sizeof *shape * (size_t)(f->ndim + 1));
  int32_t *places = fbp_alloc(a, sizeof *places * (size_t)(f->ncomp + 1));
  if (!fi || !shape || !places) return NULL;
  fusebox__v1__field_info__init(fi);
  fi->name = (char *)f->name;
  fi->type = (Fusebox__V1__ScalarType)f->type;
  memcpy(shape, f->shape, sizeof *shape * (size_t)f->ndim);
  fi->shape = shape;
  fi->n_shape = (size_t)f->ndim;
  fi->rows = f->rows;
  fi->cols = f->cols;
  for (int i = 0; i < f->ncomp; i++) places[i] = f->places[i];
  fi->places = places;
  fi->n_places = (size_t)f->ncomp;
  fi->container = f->snode >= 0 && f->snode < l->nnodes
                      ? (char *)fb_snode_kind_name(l->nodes[f->snode].kind)
                      : "";
  return fi;
}

/* A named SNode (`as NAME`): its kind and its cell space; describe() adds
 * the fields below it. */
static Fusebox__V1__SNodeInfo *snode_info(fbp_arena *a, const fb_snode *sn) {
  Fusebox__V1__SNodeInfo *si = fbp_alloc(a, sizeof *si);
  int64_t *shape = fbp_alloc(a, sizeof *shape * (size_t)(sn->ndim + 1));
  if (!si || !shape) return NULL;
  fusebox__v1__snode_info__init(si);
  si->name = sn->name;
  si->kind = (char *)fb_snode_kind_name(sn->kind);
  for (int d = 0; d < sn->ndim; d++) shape[d] = sn->shape[sn->dim_axis[d]];
  si->shape = shape;
  si->n_shape = (size_t)sn->ndim;
  return si;
}

/* The named SNodes, each with the fields below it (in source order): a
 * walk up from each field, so O(fields x depth), not fields x SNodes. */
static int describe_snodes(const fb_program *p, fbp_arena *a, Fusebox__V1__SourceInfo *r) {
  const fb_layout *l = fb_program_layout(p);
  int nf = fb_program_nfields(p);
  int *slot = fbp_alloc(a, sizeof *slot * (size_t)(l->nnodes + 1));
  r->snodes = fbp_alloc(a, sizeof *r->snodes * (size_t)(l->nnodes + 1));
  if (!slot || !r->snodes) return FB_ENOMEM;
  for (int i = 0; i < l->nnodes; i++) {
    slot[i] = -1;
    if (i == 0 || l->nodes[i].kind == FB_SN_PLACE || !l->nodes[i].name) continue;
    if (!(r->snodes[r->n_snodes] = snode_info(a, &l->nodes[i]))) return FB_ENOMEM;
    slot[i] = (int)r->n_snodes++;
  }
  for (int pass = 0; pass < 2; pass++) { /* count, then fill */
    for (int i = 0; i < nf; i++) {
      const fb_lang_field *f = fb_program_field(p, i);
      for (int s = f->snode; s > 0 && s < l->nnodes; s = l->nodes[s].parent) {
        if (slot[s] < 0) continue;
        Fusebox__V1__SNodeInfo *si = r->snodes[slot[s]];
        if (pass) si->fields[si->n_fields++] = (char *)f->name;
        else si->n_fields++;
      }
    }
    for (size_t k = 0; !pass && k < r->n_snodes; k++) {
      Fusebox__V1__SNodeInfo *si = r->snodes[k];
      if (!(si->fields = fbp_alloc(a, sizeof *si->fields * (si->n_fields + 1)))) return FB_ENOMEM;
      si->n_fields = 0;
    }
  }
  return 0;
}

static Fusebox__V1__KernelInfo *kernel_info(fbp_arena *a, const fb_lang_kernel *k) {
  Fusebox__V1__KernelInfo *ki = fbp_alloc(a, sizeof *ki);
  Fusebox__V1__ParamInfo **ps = fbp_alloc(a, sizeof *ps * (size_t)(k->nparams + 1));
  if (!ki || !ps) return NULL;
  fusebox__v1__kernel_info__init(ki);
  ki->name = (char *)k->name;
  ki->ret = (Fusebox__V1__ScalarType)k->ret;
  ki->grad = k->grad ? (char *)k->grad : "";
  for (int i = 0; i < k->nparams; i++) {
    if (!(ps[i] = fbp_alloc(a, sizeof *ps[i]))) return NULL;
    fusebox__v1__param_info__init(ps[i]);
    ps[i]->name = (char *)k->params[i].name;
    ps[i]->is_field = k->params[i].is_field != 0;
    ps[i]->type = k->params[i].is_field ? FUSEBOX__V1__SCALAR_TYPE__T_VOID
                                        : (Fusebox__V1__ScalarType)k->params[i].type;
  }
  ki->params = ps;
  ki->n_params = (size_t)k->nparams;
  return ki;
}

static int describe(const fb_program *p, fbp_arena *a, Fusebox__V1__SourceInfo *r) {
  int nf = fb_program_nfields(p), nk = fb_program_nkernels(p);
  const fb_layout *l = fb_program_layout(p);
  r->fields = fbp_alloc(a, sizeof *r->fields * (size_t)(nf + 1));
  r->kernels = fbp_alloc(a, sizeof *r->kernels * (size_t)(nk + 1));
  if (!r->fields || !r->kernels) return FB_ENOMEM;
  for (int i = 0; i < nf; i++)
    if (!(r->fields[r->n_fields++] = field_info(a, l, fb_program_field(p, i)))) return FB_ENOMEM;
  for (int i = 0; i < nk; i++)
    if (!(r->kernels[r->n_kernels++] = kernel_info(a, fb_program_kernel(p, i)))) return FB_ENOMEM;
  if (describe_snodes(p, a, r)) return FB_ENOMEM;
  return 0;
}

/* The program's warnings for the client, bounded: a hostile program may
 * have thousands (one per interleaved block) and put a megabyte on one
 * line, so at most FBD_SOURCE_WARNINGS of at most FBD_SOURCE_WARNING_LEN
 * bytes each, without the source line, then one saying how many more. */
#define FBD_SOURCE_WARNINGS 16
#define FBD_SOURCE_WARNING_LEN 1024

static int describe_warnings(const fb_program *p, const char *fname, fbp_arena *a,
                             Fusebox__V1__SourceInfo *r) {
  const fb_diags *w = fb_program_warnings(p);
  if (!w->n) return 0;
  int shown = w->n < FBD_SOURCE_WARNINGS ? w->n : FBD_SOURCE_WARNINGS;
  if (!(r->warnings = fbp_alloc(a, sizeof *r->warnings * (size_t)(shown + 1)))) return FB_ENOMEM;
  for (int i = 0; i <= shown; i++) {
    if (i == shown && w->n == shown) break;
    char *s = fbp_alloc(a, FBD_SOURCE_WARNING_LEN);
    if (!s) return FB_ENOMEM;
    const fb_diag *g = i < shown ? &w->v[i] : NULL;
    if (!g) snprintf(s, FBD_SOURCE_WARNING_LEN, "%.512s: ... and %d more warnings", fname,
                     w->n - shown);
    else if (g->line > 0)
      snprintf(s, FBD_SOURCE_WARNING_LEN, "%.512s:%d:%d: warning: %s", fname, g->line, g->col,
               g->msg);
    else snprintf(s, FBD_SOURCE_WARNING_LEN, "%.512s: warning: %s", fname, g->msg);
    r->warnings[r->n_warnings++] = s;
  }
  return 0;
}

void fbd_source_describe(const uint8_t *bytes, size_t n, const fbd_parse_limits *pl,
                         fbd_reply *r) {
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Source *m = (Fusebox__V1__Source *)protobuf_c_message_unpack(
      &fusebox__v1__source__descriptor, &a.pb, n, bytes);
  fb_program *p = NULL;
  int rc = m ? parse(m, pl, &p, r->msg, sizeof r->msg) : FB_EINVAL;
  if (!m)
    fb_errf(r->msg, sizeof r->msg, "malformed request: %zu bytes that are not a valid fusebox.v1.Source",
            n);
  Fusebox__V1__SourceInfo info = FUSEBOX__V1__SOURCE_INFO__INIT;
  if (!rc && ((rc = describe(p, &a, &info)) || (rc = describe_warnings(p, src_name(m), &a, &info))))
    fb_errf(r->msg, sizeof r->msg, "out of memory");
  if (!rc) {
    size_t len = protobuf_c_message_get_packed_size(&info.base);
    if (!(r->pb = malloc(len ? len : 1))) rc = FB_ENOMEM, fb_errf(r->msg, sizeof r->msg, "out of memory");
    else r->pblen = protobuf_c_message_pack(&info.base, r->pb);
  }
  if (!rc) r->msg[0] = 0;
  r->code = rc;
  r->finish = 1;
  fb_program_free(p);
  fbp_arena_free(&a);
}
