/* Automatic differentiation in the session: adjoint kernels registered on
 * the session's behalf (fb_session_kernel_adjoint) and the tape
 * (fb_session_tape_begin / _end). Everything here ends in ordinary kernels
 * and ordinary launches: an adjoint goes through fb_session_add_kernel like
 * a client's kernel, and the tape's clears, seed and adjoints go through
 * fb_launch, so async mode optimizes them with the rest of the state-flow
 * graph (docs/autodiff.md, "The tape"). */
#include "engine/internal.h"

#include <ctype.h>
#include <limits.h>

/* The most launches one tape records: each holds its arguments until the
 * tape ends. */
#define TAPE_MAX_LAUNCHES (1 << 20)
/* ... and the most argument values it holds in all (16 bytes each: 32 MiB;
 * without it, 2^20 launches of 64 arguments would hold 1 GiB, which under
 * thread isolation is fuseboxd's own memory). */
#define TAPE_MAX_VALUES ((size_t)1 << 21)

typedef struct tape_rec {
  int kernel;
  int nargs;
  size_t arg0;      /* its first argument in fbe_ad.argv */
  uint64_t launch;  /* the session's launch number */
} tape_rec;

typedef struct fbe_ad {
  int recording;    /* a tape is between begin and end */
  int loss;         /* its loss field */
  tape_rec *recs;
  int nrecs, rcap;
  fb_value *argv;
  size_t nargv, acap;
  int *fill;        /* per SNode: id + 1 of the kernel clearing that gradient place */
  int *seed;        /* per SNode: id + 1 of the kernel setting that gradient place to 1 */
} fbe_ad;

static fbe_ad *ad_get(fb_session *s) {
  if (s->ad) return s->ad;
  fbe_ad *a = calloc(1, sizeof *a);
  int n = s->layout->nnodes > 0 ? s->layout->nnodes : 1;
  if (a) a->fill = calloc((size_t)n, sizeof *a->fill);
  if (a) a->seed = calloc((size_t)n, sizeof *a->seed);
  if (!a || !a->fill || !a->seed) {
    if (a) free(a->fill);
    free(a);
    return NULL;
  }
  return s->ad = a;
}

void fbe_ad_free(fb_session *s) {
  fbe_ad *a = s->ad;
  if (!a) return;
  free(a->recs);
  free(a->argv);
  free(a->fill);
  free(a->seed);
  free(a);
  s->ad = NULL;
}

/* Kernels ids keep and up are about to go: forget the generated ones among
 * them (and references to them). */
void fbe_tape_forget(fb_session *s, int keep) {
  for (int i = 0; i < s->nkernels && i < keep; i++) {
    if (s->kernels[i].adj > keep) s->kernels[i].adj = 0, s->kernels[i].custom = 0;
    s->kernels[i].custom_of = 0;
  }
  for (int i = 0; i < s->nkernels && i < keep; i++) /* custom adjoints that stay */
    if (s->kernels[i].custom && s->kernels[i].adj > 0)
      s->kernels[s->kernels[i].adj - 1].custom_of = 1;
  for (int i = 0; i < s->nkernels && i < keep; i++)
    if (s->kernels[i].tan > keep) s->kernels[i].tan = 0;
  fbe_ad *a = s->ad;
  if (!a) return;
  for (int i = 0; i < s->layout->nnodes; i++) {
    if (a->fill[i] > keep) a->fill[i] = 0;
    if (a->seed[i] > keep) a->seed[i] = 0;
  }
}

int fbe_tape_recording(const fb_session *s) { return s->ad && s->ad->recording; }

int fbe_ad_tables(fb_session *s, int **fill, int **seed, int make) {
  fbe_ad *a = make ? ad_get(s) : s->ad;
  *fill = a ? a->fill : NULL;
  *seed = a ? a->seed : NULL;
  return make && !a ? FB_ENOMEM : 0;
}

static const char *field_name(const fb_session *s, int f) {
  const char *n = f >= 0 && f < s->layout->nnodes ? s->layout->nodes[f].name : NULL;
  return n ? n : "?";
}

/* The pass names statements by IR value ("%7 if: ...", "(%4 load)"),
 * which a client never sees: drop those, in place. */
static void strip_ir_values(char *m) {
  char *w = m;
  for (const char *r = m; *r;) {
    if (r[0] == '%' && isdigit((unsigned char)r[1])) {
      r++;
      while (isdigit((unsigned char)*r)) r++;
      if (*r == ' ') r++;
      continue;
    }
    *w++ = *r++;
  }
  *w = 0;
}

int fb_session_kernel_adjoint(fb_session *s, int kernel, int *adj) {
  if (!s) return FB_EINVAL;
  if (kernel < 0 || kernel >= s->nkernels)
    return fail(s, FB_ENOENT, "no kernel with id %d (the session has %d)", kernel, s->nkernels);
  sess_kernel *sk = &s->kernels[kernel];
  if (sk->adj > 0 && sk->adj <= s->nkernels) {
    if (adj) *adj = sk->adj - 1;
    return 0;
  }
  fb_grad_map g;
  if (fb_grad_map_from_layout(s->layout, &g))
    return fail(s, FB_ENOMEM, "kernel '%s': out of memory (gradient map)", sk->k->name);
  fb_kernel *out = NULL;
  char msg[ERRLEN];
  msg[0] = 0;
  /* bounded as a client's kernel is: the pass stops at the session's
   * statement limit rather than building a larger kernel to refuse later */
  int rc = fb_kernel_adjoint_ex(sk->k, &g, s->max_stmts, &out, NULL, msg, sizeof msg);
  fb_grad_map_free(&g);
  if (rc) {
    strip_ir_values(msg);
    return fail(s, rc, "%s", msg[0] ? msg : fb_strerror(rc));
  }
  rc = fb_session_add_kernel(s, out); /* the same checks as a client's kernel */
  fb_kernel_free(out);
  if (rc < 0) {
    char why[ERRLEN];
    snprintf(why, sizeof why, "%s", s->err);
    return fail(s, rc, "the adjoint of kernel '%s': %s", s->kernels[kernel].k->name, why);
  }
  s->kernels[kernel].adj = rc + 1; /* kernels may have moved */
  if (adj) *adj = rc;
  return 0;
}

/* The tangent (forward mode) of a registered kernel: fb_kernel_tangent
 * with the layout's dual map, registered like the adjoint above. */
int fb_session_kernel_tangent(fb_session *s, int kernel, int *tan) {
  if (!s) return FB_EINVAL;
  if (kernel < 0 || kernel >= s->nkernels)
    return fail(s, FB_ENOENT, "no kernel with id %d (the session has %d)", kernel, s->nkernels);
  sess_kernel *sk = &s->kernels[kernel];
  if (sk->tan > 0 && sk->tan <= s->nkernels) {
    if (tan) *tan = sk->tan - 1;
    return 0;
  }
  fb_grad_map d;
  if (fb_dual_map_from_layout(s->layout, &d))
    return fail(s, FB_ENOMEM, "kernel '%s': out of memory (dual map)", sk->k->name);
  fb_kernel *out = NULL;
  char msg[ERRLEN];
  msg[0] = 0;
  int rc = fb_kernel_tangent(sk->k, &d, s->max_stmts, &out, NULL, msg, sizeof msg);
  fb_grad_map_free(&d);
  if (rc) {
    strip_ir_values(msg);
    return fail(s, rc, "%s", msg[0] ? msg : fb_strerror(rc));
  }
  rc = fb_session_add_kernel(s, out); /* the same checks as a client's kernel */
  fb_kernel_free(out);
  if (rc < 0) {
    char why[ERRLEN];
    snprintf(why, sizeof why, "%s", s->err);
    return fail(s, rc, "the tangent of kernel '%s': %s", s->kernels[kernel].k->name, why);
  }
  s->kernels[kernel].tan = rc + 1; /* kernels may have moved */
  if (tan) *tan = rc;
  return 0;
}

/* "(f32, i32)": a kernel's parameter types, for messages. */
static void param_list(const fb_kernel *k, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < k->nparams && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", fb_type_name(k->params[i]));
  if (o < n) snprintf(buf + o, n - o, ")");
}

int fb_session_set_kernel_adjoint(fb_session *s, int kernel, int adj) {
  if (!s) return FB_EINVAL;
  if (kernel < 0 || kernel >= s->nkernels)
    return fail(s, FB_ENOENT, "custom adjoint: no kernel with id %d (the session has %d)", kernel,
                s->nkernels);
  if (adj < -1 || adj >= s->nkernels)
    return fail(s, FB_ENOENT,
                "custom adjoint of kernel '%s': no kernel with id %d (the session has %d)",
                s->kernels[kernel].k->name, adj, s->nkernels);
  if (adj == -1) { /* unbind a custom adjoint */
    sess_kernel *f = &s->kernels[kernel];
    if (f->custom && f->adj > 0 && f->adj <= s->nkernels) s->kernels[f->adj - 1].custom_of = 0;
    if (f->custom) f->adj = 0, f->custom = 0;
    return 0;
  }
  sess_kernel *f = &s->kernels[kernel], *a = &s->kernels[adj];
  const char *fn = f->k->name, *an = a->k->name;
  if (kernel == adj)
    return fail(s, FB_EINVAL,
                "kernel '%s' cannot be its own adjoint: name another kernel that takes the "
                "same parameters",
                fn);
  if (f->custom && f->adj == adj + 1) return 0; /* the same pair again */
  int same = f->k->nparams == a->k->nparams;
  for (int i = 0; same && i < f->k->nparams; i++) same = f->k->params[i] == a->k->params[i];
  if (!same) {
    char fp[512], ap[512];
    param_list(f->k, fp, sizeof fp);
    param_list(a->k, ap, sizeof ap);
    return fail(s, FB_EINVAL,
                "kernel '%s' cannot be the adjoint of '%s': '%s' takes %s and '%s' takes %s; an "
                "adjoint takes the kernel's parameters",
                an, fn, fn, fp, an, ap);
  }
  if (a->custom)
    return fail(s, FB_EINVAL,
                "kernel '%s' cannot be the adjoint of '%s': it has an adjoint of its own ('%s'); "
                "custom adjoints do not chain",
                an, fn, a->adj > 0 && a->adj <= s->nkernels ? s->kernels[a->adj - 1].k->name : "?");
  if (f->custom_of)
    return fail(s, FB_EINVAL,
                "kernel '%s' cannot have the adjoint '%s': it is itself a custom adjoint; custom "
                "adjoints do not chain",
                fn, an);
  if (f->adj > 0 && f->adj <= s->nkernels)
    return fail(s, FB_EINVAL,
                "kernel '%s' already has the adjoint '%s'%s; name its adjoint before asking "
                "for it or taping it",
                fn, s->kernels[f->adj - 1].k->name, f->custom ? "" : " (made from its IR)");
  f->adj = adj + 1;
  f->custom = 1;
  a->custom_of = 1;
  return 0;
}

int fb_session_custom_adjoint(const fb_session *s, int kernel) {
  if (!s || kernel < 0 || kernel >= s->nkernels || !s->kernels[kernel].custom) return FB_ENOENT;
  return s->kernels[kernel].adj - 1;
}

int fb_session_tape_loss(const fb_session *s) {
  return s && s->ad && s->ad->recording ? s->ad->loss : FB_ENOENT;
}

/* The gradient place of field f, or -1. */
static int grad_place(const fb_session *s, int f) {
  fb_grad_map g;
  if (fb_grad_map_from_layout(s->layout, &g)) return FB_ENOMEM;
  int r = f >= 0 && f < g.n ? g.grad[f] : -1;
  fb_grad_map_free(&g);
  return r;
}

int fb_session_tape_begin(fb_session *s, int loss) {
  if (!s) return FB_EINVAL;
  if (s->ad && s->ad->recording)
    return fail(s, FB_EINVAL,
                "a tape over '%s' is already recording: end it before beginning another (tapes "
                "do not nest)",
                field_name(s, s->ad->loss));
  const fb_layout *l = s->layout;
  if (loss < 0 || loss >= l->nnodes || l->nodes[loss].kind != FB_SN_PLACE)
    return fail(s, FB_EINVAL, "tape: the loss must be a field; SNode %d is not one", loss);
  const fb_snode *n = &l->nodes[loss];
  if (!fb_type_is_float(n->type))
    return fail(s, FB_EINVAL, "tape: the loss '%s' is %s; a loss is an f32 or f64 field",
                field_name(s, loss), fb_type_name(n->type));
  if (fb_field_numel(l, loss) != 1)
    return fail(s, FB_EINVAL,
                "tape: the loss '%s' has %lld elements; a loss is a 0-D (scalar) field",
                field_name(s, loss), (long long)fb_field_numel(l, loss));
  int g = grad_place(s, loss);
  if (g == FB_ENOMEM) return fail(s, FB_ENOMEM, "tape: out of memory");
  if (g < 0)
    return fail(s, FB_EINVAL,
                "tape: the loss '%s' has no gradient; declare it with one (a place '%s.grad' "
                "next to it, `place %s: %s grad` in .fbk)",
                field_name(s, loss), field_name(s, loss), field_name(s, loss),
                fb_type_name(n->type));
  fbe_ad *a = ad_get(s);
  if (!a) return fail(s, FB_ENOMEM, "tape: out of memory");
  a->recording = 1;
  a->loss = loss;
  a->nrecs = 0;
  a->nargv = 0;
  return 0;
}

/* The async worker reads the session's memory under cmu (dev_bytes), and
 * host without it (the sparse pool's room): an atomic store. */
static void set_host(fb_session *s, uint64_t bytes) {
  pthread_mutex_lock(&s->cmu);
  __atomic_store_n(&s->mem.host, bytes, __ATOMIC_RELAXED);
  s->dev_bytes = fb_devmem_used(&s->mem);
  pthread_mutex_unlock(&s->cmu);
}

/* The bytes a tape of these capacities holds. */
static uint64_t tape_bytes(int rcap, size_t acap) {
  return (uint64_t)rcap * sizeof(tape_rec) + (uint64_t)acap * sizeof(fb_value);
}

/* The tape's memory counts against the session's memory limit, the budget
 * its fields use (fb_devmem.host, so fields see it too): growing to these
 * capacities must fit, else FB_EQUOTA naming the tape and the bytes (the
 * launch is refused, the tape goes on). */
static int tape_charge(fb_session *s, fbe_ad *a, int rcap, size_t acap, int kernel, int nargs) {
  uint64_t now = s->mem.host, want = tape_bytes(rcap, acap);
  uint64_t others = fb_devmem_used(&s->mem) - now;
  if (s->mem.limit && (others > s->mem.limit || want > s->mem.limit - others))
    return fail(s, FB_EQUOTA,
                "kernel '%s': the tape over '%s' needs %llu bytes for its %d launches and %zu "
                "argument values, past the session's memory limit of %llu bytes (its fields and "
                "other memory take %llu); end the tape sooner or ask for more memory "
                "(memory_limit)",
                s->kernels[kernel].k->name, field_name(s, a->loss), (unsigned long long)want,
                a->nrecs + 1, a->nargv + (size_t)nargs,
                (unsigned long long)s->mem.limit, (unsigned long long)others);
  set_host(s, want);
  return 0;
}

/* The tape is over: give its memory back (and its charge). */
static void tape_release(fb_session *s, fbe_ad *a) {
  free(a->recs);
  free(a->argv);
  a->recs = NULL;
  a->argv = NULL;
  a->rcap = 0;
  a->acap = 0;
  a->nrecs = 0;
  a->nargv = 0;
  set_host(s, 0);
}

int fbe_tape_record(fb_session *s, int kernel, const fb_value *args, int nargs) {
  fbe_ad *a = s->ad;
  if (!a->recording) return 0;
  if (a->nrecs == TAPE_MAX_LAUNCHES)
    return fail(s, FB_EQUOTA,
                "kernel '%s': the tape over '%s' already holds %d launches, the most one tape "
                "records; end the tape sooner",
                s->kernels[kernel].k->name, field_name(s, a->loss), a->nrecs);
  if (a->nargv + (size_t)nargs > TAPE_MAX_VALUES)
    return fail(s, FB_EQUOTA,
                "kernel '%s': the tape over '%s' already holds %zu argument values of %d launches, "
                "the most one tape records is %zu values; end the tape sooner",
                s->kernels[kernel].k->name, field_name(s, a->loss), a->nargv, a->nrecs,
                TAPE_MAX_VALUES);
  int rc_cap = a->rcap;
  size_t ac_cap = a->acap;
  if (a->nrecs == rc_cap) rc_cap = rc_cap ? rc_cap * 2 : 16;
  if (a->nargv + (size_t)nargs > ac_cap) {
    ac_cap = ac_cap ? ac_cap * 2 : 64;
    while (ac_cap < a->nargv + (size_t)nargs) ac_cap *= 2;
  }
  if ((rc_cap != a->rcap || ac_cap != a->acap) && tape_charge(s, a, rc_cap, ac_cap, kernel, nargs))
    return FB_EQUOTA;
  if (rc_cap != a->rcap) {
    tape_rec *v = realloc(a->recs, sizeof *v * (size_t)rc_cap);
    if (!v) return fail(s, FB_ENOMEM, "kernel '%s': out of memory (tape)", s->kernels[kernel].k->name);
    a->recs = v;
    a->rcap = rc_cap;
  }
  if (ac_cap != a->acap) {
    fb_value *v = realloc(a->argv, sizeof *v * ac_cap);
    if (!v) return fail(s, FB_ENOMEM, "kernel '%s': out of memory (tape)", s->kernels[kernel].k->name);
    a->argv = v;
    a->acap = ac_cap;
  }
  if (nargs) memcpy(a->argv + a->nargv, args, sizeof *args * (size_t)nargs);
  a->recs[a->nrecs++] = (tape_rec){kernel, nargs, a->nargv, s->launch_no};
  a->nargv += (size_t)nargs;
  return 0;
}

/* A kernel of no parameters setting every element of place p to v (0 or 1),
 * registered once and remembered in *slot (id + 1). */
static int fill_kernel(fb_session *s, int p, int one, int *slot, int *id) {
  if (*slot > 0 && *slot <= s->nkernels) {
    *id = *slot - 1;
    return 0;
  }
  const fb_snode *n = &s->layout->nodes[p];
  char name[256];
  snprintf(name, sizeof name, "%s.%s", field_name(s, p), one ? "seed" : "clear");
  fb_kernel *k = fb_kernel_new(s->layout, name, 0, NULL, FB_T_VOID);
  if (!k) return fail(s, FB_ENOMEM, "tape: out of memory");
  fb_builder b;
  fb_builder_init(&b, k);
  int idx[FB_MAX_AXES], saved = -1;
  if (n->ndim > 0) {
    int st = fb_b_struct_for(&b, p);
    if (st >= 0) {
      saved = fb_b_enter(&b, k->stmts[st].body);
      for (int i = 0; i < n->ndim; i++) idx[i] = fb_b_loop_index(&b, st, i);
    }
  }
  int c = n->type == FB_T_F64 ? fb_b_const_f64(&b, one) : fb_b_const_f32(&b, (float)one);
  fb_b_store(&b, p, idx, n->ndim, c);
  if (saved >= 0) fb_b_leave(&b, saved);
  if (b.err) {
    fb_kernel_free(k);
    return fail(s, FB_ENOMEM, "tape: out of memory");
  }
  int rc = fb_session_add_kernel(s, k);
  fb_kernel_free(k);
  if (rc < 0) return rc;
  *slot = rc + 1;
  *id = rc;
  return 0;
}

/* Mark in touched[] the gradient place of every field kernel k accesses. */
static void mark_touched(const fb_kernel *k, const fb_grad_map *g, uint8_t *touched) {
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *st = &k->stmts[i];
    if (st->op >= FB_OP__COUNT || !(fb_op_table[st->op].flags & FB_OPF_SNODE)) continue;
    int c = fb_op_table[st->op].cls;
    if (c != FB_OPC_GLOAD && c != FB_OPC_GSTORE && c != FB_OPC_ATOMIC) continue;
    if (st->snode >= 0 && st->snode < g->n && g->grad[st->snode] >= 0)
      touched[g->grad[st->snode]] = 1;
  }
}

/* A custom adjoint may write gradients its forward kernel does not reach:
 * mark every gradient place it accesses too (is_grad: the map's image). */
static void mark_touched_custom(const fb_kernel *adj, const uint8_t *is_grad, int n,
                                uint8_t *touched) {
  for (int i = 0; i < adj->nstmts; i++) {
    const fb_stmt *st = &adj->stmts[i];
    if (st->op >= FB_OP__COUNT || !(fb_op_table[st->op].flags & FB_OPF_SNODE)) continue;
    if (st->snode >= 0 && st->snode < n && is_grad[st->snode]) touched[st->snode] = 1;
  }
}

/* The adjoint of every recorded launch, made before anything is launched:
 * a refusal launches nothing. */
static int tape_adjoints(fb_session *s, fbe_ad *a, int *adj) {
  for (int i = 0; i < a->nrecs; i++) {
    const tape_rec *r = &a->recs[i];
    int rc = fb_session_kernel_adjoint(s, r->kernel, &adj[i]);
    if (!rc) continue;
    char why[ERRLEN];
    snprintf(why, sizeof why, "%s", s->err);
    fail(s, rc, "tape over '%s': launch %d of the tape (kernel '%s', the session's launch %llu): %s",
         field_name(s, a->loss), i + 1, s->kernels[r->kernel].k->name,
         (unsigned long long)r->launch, why);
    s->err_bg = 1; /* fb_session_error_launch names the launch to blame */
    s->err_launch = r->launch;
    s->err_kernel = r->kernel;
    return rc;
  }
  return 0;
}

static int tape_run(fb_session *s, fbe_ad *a) {
  const fb_layout *l = s->layout;
  int n = l->nnodes, rc = 0;
  int *adj = malloc(sizeof *adj * (size_t)(a->nrecs ? a->nrecs : 1));
  uint8_t *touched = calloc((size_t)n, 1);
  fb_grad_map g = {0, NULL};
  if (!adj || !touched || fb_grad_map_from_layout(l, &g)) rc = fail(s, FB_ENOMEM, "tape: out of memory");
  if (!rc) rc = tape_adjoints(s, a, adj);
  if (!rc) {
    for (int i = 0; i < a->nrecs; i++) mark_touched(s->kernels[a->recs[i].kernel].k, &g, touched);
    uint8_t *is_grad = calloc((size_t)n, 1);
    if (!is_grad) rc = fail(s, FB_ENOMEM, "tape: out of memory");
    for (int p = 0; is_grad && p < g.n; p++)
      if (g.grad[p] >= 0 && g.grad[p] < n) is_grad[g.grad[p]] = 1;
    for (int i = 0; is_grad && i < a->nrecs; i++)
      if (s->kernels[a->recs[i].kernel].custom)
        mark_touched_custom(s->kernels[adj[i]].k, is_grad, n, touched);
    free(is_grad);
    int lg = g.grad[a->loss];
    touched[lg] = 1;
    for (int p = 0; !rc && p < n; p++) {
      int id;
      if (touched[p] && !(rc = fill_kernel(s, p, 0, &a->fill[p], &id)))
        rc = fb_launch(s, id, NULL, 0, NULL);
    }
    int id;
    if (!rc && !(rc = fill_kernel(s, lg, 1, &a->seed[lg], &id))) rc = fb_launch(s, id, NULL, 0, NULL);
    for (int i = a->nrecs - 1; !rc && i >= 0; i--) {
      const tape_rec *r = &a->recs[i];
      rc = fb_launch(s, adj[i], r->nargs ? a->argv + r->arg0 : NULL, r->nargs, NULL);
    }
  }
  fb_grad_map_free(&g);
  free(touched);
  free(adj);
  return rc;
}

int fb_session_tape_end(fb_session *s) {
  if (!s) return FB_EINVAL;
  fbe_ad *a = s->ad;
  if (!a || !a->recording) return fail(s, FB_EINVAL, "tape end: no tape is recording");
  a->recording = 0; /* over whatever happens; its own launches are not recorded */
  int rc = tape_run(s, a);
  tape_release(s, a);
  return rc;
}
