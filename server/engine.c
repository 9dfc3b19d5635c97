/* The in-process engine (include/fusebox/engine.h): wires the verifier,
 * lowering (optimizer/), the CPU JIT (codegen/) and the CPU device
 * (runtime/) together. Sync mode only in this milestone: a kernel is
 * verified, copied onto the session's layout, lowered to tasks and every
 * task compiled when it is registered; fb_launch runs its tasks at once.
 * Layouts with sparse SNodes get the sparse runtime (runtime/sparse.c):
 * its state is every task's ctx->runtime, list tasks are sized before they
 * run, and a block that does not fit in the session's memory limit is
 * reported as FB_EQUOTA naming the kernel and the SNode (docs/sparse.md).
 *
 * Sharing: an engine holds the JIT (and its code cache) and the thread pool,
 * both safe to use from several threads; everything else belongs to one
 * session, and a session is used by one thread at a time. Sessions must be
 * destroyed before their engine (their code lives in the engine's JIT). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "fusebox/engine.h"
#include "optimizer/optimizer.h"
#include "runtime/runtime.h"

#define ERRLEN 2048
#define MAX_RET_SLOTS 1024
#define MAX_PATH 64

struct fb_engine {
  fb_cpu_jit *jit;
  fb_cpu_device *dev;
  pthread_mutex_t mu; /* guards err */
};

typedef struct sess_kernel {
  fb_kernel *k;            /* copy on the session's layout */
  fb_task_list tl;         /* its tasks, in launch order */
  const fb_kernel **irs;   /* tl.v[i].ir, for fb_session_kernel_tasks */
  fb_rt_task *code;        /* compiled entry points per task */
  fb_rt_hint *hints;       /* per task: list to size, chunk grain */
} sess_kernel;

struct fb_session {
  fb_engine *e;
  fb_layout *layout;       /* the session's own copy */
  uint64_t seed;
  uint64_t launch_no;      /* launches run so far: rand()'s launch number */
  fb_devmem mem;
  fb_sparse *sparse;       /* NULL when the layout has no sparse SNode */
  sess_kernel *kernels;
  int nkernels, cap;
  uint64_t *args;          /* argument slots, nargs_cap of them */
  int nargs_cap;
  fb_counters c;
  char err[ERRLEN];
};

static int fail(fb_session *s, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int fail(fb_session *s, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
  return code;
}

static void set_err(char *err, size_t errlen, const char *msg) {
  if (err && errlen) snprintf(err, errlen, "%s", msg);
}

/* ---------------------------------------------------------------- engine */

int fb_engine_create(const fb_engine_config *cfg, fb_engine **out, char *err, size_t errlen) {
  *out = NULL;
  const char *be = cfg && cfg->backend ? cfg->backend : "cpu";
  if (strcmp(be, "cuda") == 0) {
    set_err(err, errlen, "CUDA backend not available in this build (no GPU driver support yet)");
    return FB_EUNSUPPORTED;
  }
  if (strcmp(be, "cpu") != 0 && strcmp(be, "auto") != 0) {
    if (err && errlen) snprintf(err, errlen, "unknown backend '%s' (expected cpu, cuda or auto)", be);
    return FB_EINVAL;
  }
  int threads = cfg ? cfg->cpu_threads : 0;
  if (threads < 0 || (cfg && cfg->compile_threads < 0)) {
    set_err(err, errlen, "thread counts must be >= 0 (0 = one per core)");
    return FB_EINVAL;
  }
  fb_engine *e = calloc(1, sizeof *e);
  if (!e) {
    set_err(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  int rc = fb_cpu_device_new(threads, &e->dev, err, errlen);
  if (rc) {
    free(e);
    return rc;
  }
  e->jit = fb_cpu_jit_new(err, errlen);
  if (!e->jit) {
    fb_cpu_device_free(e->dev);
    free(e);
    return FB_EDEVICE;
  }
  pthread_mutex_init(&e->mu, NULL);
  *out = e;
  return 0;
}

void fb_engine_destroy(fb_engine *e) {
  if (!e) return;
  fb_cpu_jit_free(e->jit);
  fb_cpu_device_free(e->dev);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

const char *fb_engine_backend(const fb_engine *e) { return "cpu"; }


/* ---------------------------------------------------------------- sessions */

static int layout_is_sparse(const fb_layout *l) {
  for (int i = 0; i < l->nnodes; i++)
    if (fb_cg_is_sparse(l->nodes[i].kind)) return 1;
  return 0;
}

static int check_mode(const char *mode) {
  return !mode || strcmp(mode, "sync") == 0 || strcmp(mode, "async") == 0;
}

int fb_session_create(fb_engine *e, const fb_session_config *cfg, const fb_layout *layout,
                      fb_session **out, char *err, size_t errlen) {
  char msg[ERRLEN];
  *out = NULL;
  if (!e || !layout) return FB_EINVAL;
  if (!layout->finalized) {
    set_err(err, errlen, "the session's layout is not finalized");
    return FB_EINVAL;
  }
  if (cfg && !check_mode(cfg->mode)) {
    snprintf(msg, sizeof msg, "unknown session mode '%s' (expected sync or async)", cfg->mode);
    set_err(err, errlen, msg);
    return FB_EINVAL;
  }
  fb_session *s = calloc(1, sizeof *s);
  if (!s || !(s->layout = fb_layout_clone(layout))) {
    free(s);
    set_err(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  s->e = e;
  s->seed = cfg ? cfg->seed : 0;
  int rc = fb_devmem_init(&s->mem, s->layout->root_bytes, cfg ? cfg->memory_limit : 0, msg,
                          sizeof msg);
  if (!rc) rc = fb_devmem_reserve(&s->mem, 0, 1, msg, sizeof msg);
  if (!rc && layout_is_sparse(s->layout))
    rc = fb_sparse_new(s->layout, &s->mem, &s->sparse, msg, sizeof msg);
  if (rc) {
    set_err(err, errlen, msg);
    fb_session_destroy(s);
    return rc;
  }
  *out = s;
  return 0;
}

static void kernel_free(sess_kernel *k) {
  fb_task_list_free(&k->tl);
  fb_kernel_free(k->k);
  free(k->irs);
  free(k->code);
  free(k->hints);
  memset(k, 0, sizeof *k);
}

void fb_session_destroy(fb_session *s) {
  if (!s) return;
  for (int i = 0; i < s->nkernels; i++) kernel_free(&s->kernels[i]);
  free(s->kernels);
  free(s->args);
  fb_sparse_free(s->sparse);
  fb_devmem_release(&s->mem);
  fb_layout_free(s->layout);
  free(s);
}

const char *fb_session_errmsg(const fb_session *s) { return s ? s->err : "no session"; }

const fb_layout *fb_session_layout(const fb_session *s) { return s->layout; }

void fb_session_counters(const fb_session *s, fb_counters *out) {
  *out = s->c;
  out->device_bytes = fb_devmem_used(&s->mem);
}

int fb_sync(fb_session *s) { return s ? 0 : FB_EINVAL; } /* sync mode: nothing pending */

/* ---------------------------------------------------------------- kernels */

/* Every SNode a statement names must exist in the session's layout. */
static int check_snodes(fb_session *s, const fb_kernel *k) {
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *st = &k->stmts[i];
    if (st->op >= FB_OP__COUNT || !(fb_op_table[st->op].flags & FB_OPF_SNODE)) continue;
    if (st->snode < 0 || st->snode >= s->layout->nnodes)
      return fail(s, FB_ENOENT, "kernel '%s': %%%d %s names SNode %d, which the session's layout "
                  "does not have (it has %d)", k->name, i, fb_op_table[st->op].name, st->snode,
                  s->layout->nnodes);
  }
  return 0;
}

static int verify(fb_session *s, const fb_kernel *k) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  if (rc) {
    char *all = fb_diags_join(&d);
    size_t n = all ? strlen(all) : 0;
    if (n && all[n - 1] == '\n') all[n - 1] = 0;
    fail(s, FB_EVERIFY, "kernel '%s' failed verification:\n%s", k->name,
         all ? all : "(out of memory)");
    free(all);
  }
  fb_diags_free(&d);
  return rc ? FB_EVERIFY : 0;
}

/* Return slots the tasks write: one past the highest ret slot. */
static int ret_slots(fb_session *s, const sess_kernel *sk, int *nrets) {
  int n = sk->k->ret != FB_T_VOID;
  for (int t = 0; t < sk->tl.n; t++) {
    const fb_kernel *ir = sk->tl.v[t].ir;
    for (int i = 0; i < ir->nstmts; i++) {
      if (ir->stmts[i].op != FB_OP_RET) continue;
      int64_t slot = ir->stmts[i].imm.i;
      if (slot < 0 || slot >= MAX_RET_SLOTS)
        return fail(s, FB_EINVAL, "kernel '%s': return slot %lld out of range [0, %d)",
                    sk->k->name, (long long)slot, MAX_RET_SLOTS);
      if (slot + 1 > n) n = (int)slot + 1;
    }
  }
  *nrets = n;
  return 0;
}

static int compile_task(fb_session *s, sess_kernel *sk, int t) {
  char msg[ERRLEN];
  const fb_task *task = &sk->tl.v[t];
  fb_cg_task cg = {task->ir, task->loop};
  fb_cpu_code code;
  memset(&code, 0, sizeof code);
  msg[0] = 0;
  int rc = fb_cpu_jit_compile(s->e->jit, &cg, &code, msg, sizeof msg);
  if (!rc && (!code.body || (task->loop >= 0 && !code.bounds))) rc = FB_EINTERNAL;
  if (rc)
    return fail(s, rc < 0 ? rc : FB_ECOMPILE, "kernel '%s': compiling task %d (%s) failed: %s",
                sk->k->name, t, task->ir->name, msg[0] ? msg : fb_strerror(rc));
  sk->code[t].body = code.body;
  sk->code[t].bounds = task->loop >= 0 ? code.bounds : NULL;
  sk->hints[t].list_snode = task->kind == FB_TASK_LISTGEN ? task->snode : 0;
  sk->hints[t].grain = task->kind == FB_TASK_LISTGEN ? 1 : 0;
  sk->irs[t] = task->ir;
  if (code.cache_hit) s->c.cache_hits++;
  else {
    s->c.tasks_compiled++;
    s->c.statements_emitted += (uint64_t)code.stmts_emitted;
  }
  s->c.compile_s += code.compile_s;
  return 0;
}

static int lower_and_compile(fb_session *s, sess_kernel *sk) {
  char msg[ERRLEN];
  msg[0] = 0;
  int rc = fb_lower(sk->k, &sk->tl, msg, sizeof msg);
  if (rc)
    return fail(s, rc, "kernel '%s': lowering failed: %s", sk->k->name,
                msg[0] ? msg : fb_strerror(rc));
  int n = sk->tl.n;
  sk->irs = calloc((size_t)(n ? n : 1), sizeof *sk->irs);
  sk->code = calloc((size_t)(n ? n : 1), sizeof *sk->code);
  sk->hints = calloc((size_t)(n ? n : 1), sizeof *sk->hints);
  if (!sk->irs || !sk->code || !sk->hints)
    return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
  for (int t = 0; t < n; t++)
    if ((rc = compile_task(s, sk, t))) return rc;
  return 0;
}

/* Scratch, return and argument slots for the kernel. */
static int reserve_slots(fb_session *s, sess_kernel *sk) {
  char msg[ERRLEN];
  int nrets = 0;
  int rc = ret_slots(s, sk, &nrets);
  if (rc) return rc;
  if ((rc = fb_devmem_reserve(&s->mem, sk->tl.gtmp_bytes, nrets, msg, sizeof msg)))
    return fail(s, rc, "kernel '%s': %s", sk->k->name, msg);
  if (sk->k->nparams > s->nargs_cap) {
    uint64_t *a = realloc(s->args, sizeof(uint64_t) * (size_t)sk->k->nparams);
    if (!a) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
    s->args = a;
    s->nargs_cap = sk->k->nparams;
  }
  return 0;
}

static int build_kernel(fb_session *s, const fb_kernel *k, sess_kernel *sk) {
  if (!k->name || k->nparams < 0 || (k->nparams && !k->params))
    return fail(s, FB_EINVAL, "malformed kernel (no name or parameter list)");
  int rc = check_snodes(s, k);
  if (rc) return rc;
  if (!(sk->k = fb_kernel_clone_to(k, s->layout)))
    return fail(s, FB_ENOMEM, "kernel '%s': out of memory", k->name);
  if ((rc = verify(s, sk->k))) return rc;
  if ((rc = lower_and_compile(s, sk))) return rc;
  return reserve_slots(s, sk);
}

int fb_session_add_kernel(fb_session *s, const fb_kernel *k) {
  if (!s) return FB_EINVAL;
  if (!k) return fail(s, FB_EINVAL, "no kernel given");
  if (s->nkernels == s->cap) {
    int nc = s->cap ? s->cap * 2 : 8;
    sess_kernel *v = realloc(s->kernels, sizeof *v * (size_t)nc);
    if (!v) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", k->name ? k->name : "?");
    s->kernels = v;
    s->cap = nc;
  }
  sess_kernel sk;
  memset(&sk, 0, sizeof sk);
  int rc = build_kernel(s, k, &sk);
  if (rc) {
    kernel_free(&sk);
    return rc;
  }
  s->kernels[s->nkernels] = sk;
  return s->nkernels++;
}

/* The most recently registered kernel of that name. */
int fb_session_find_kernel(const fb_session *s, const char *name) {
  if (!s || !name) return FB_EINVAL;
  for (int i = s->nkernels - 1; i >= 0; i--)
    if (strcmp(s->kernels[i].k->name, name) == 0) return i;
  return FB_ENOENT;
}

int fb_session_kernel_tasks(const fb_session *s, int kernel, const fb_kernel *const **tasks,
                            int *ntasks) {
  if (!s || kernel < 0 || kernel >= s->nkernels) return FB_ENOENT;
  *tasks = (const fb_kernel *const *)s->kernels[kernel].irs;
  *ntasks = s->kernels[kernel].tl.n;
  return 0;
}

/* ---------------------------------------------------------------- launches */

/* 0 bool, 1 integer, 2 float, -1 not a value type. */
static int type_kind(fb_type t) {
  if (t == FB_T_BOOL) return 0;
  if (fb_type_is_int(t)) return 1;
  if (fb_type_is_float(t)) return 2;
  return -1;
}

/* Values cross between types of one kind, and between bool and integers. */
static int kinds_agree(fb_type want, fb_type have) {
  int a = type_kind(want), b = type_kind(have);
  if (a < 0 || b < 0) return 0;
  return a == b || (a <= 1 && b <= 1);
}

static const char *type_name_safe(fb_type t) {
  return (unsigned)t < FB_T__COUNT ? fb_type_name(t) : "invalid";
}

static int pack_args(fb_session *s, const fb_kernel *k, const fb_value *args, int nargs) {
  if (nargs != k->nparams)
    return fail(s, FB_ETYPE, "kernel '%s' takes %d argument%s, %d given", k->name, k->nparams,
                k->nparams == 1 ? "" : "s", nargs);
  if (nargs > 0 && !args) return fail(s, FB_EINVAL, "kernel '%s': no argument values given", k->name);
  for (int i = 0; i < nargs; i++) {
    if (!kinds_agree(k->params[i], args[i].type))
      return fail(s, FB_ETYPE, "kernel '%s': argument %d (parameter of type %s) cannot take "
                  "a value of type %s", k->name, i, type_name_safe(k->params[i]),
                  type_name_safe(args[i].type));
    s->args[i] = fb_slot_pack(fb_value_cast(args[i], k->params[i]));
  }
  return 0;
}

static const char *snode_label(const fb_snode *n, char *buf, size_t len) {
  if (n->name) snprintf(buf, len, "'%s'", n->name);
  else snprintf(buf, len, "%d", n->id);
  return buf;
}

/* "out of device memory allocating a block of SNode 'x' (pointer, N bytes;
 * limit L bytes)" into buf, when the device ran out since the last call. */
static int oom_message(fb_session *s, char *buf, size_t len) {
  int sn;
  uint64_t bytes;
  if (!s->sparse || !fb_sparse_take_oom(s->sparse, &sn, &bytes)) return 0;
  const fb_snode *n = &s->layout->nodes[sn];
  char name[160];
  if (s->mem.limit)
    snprintf(buf, len, "out of device memory allocating a block of SNode %s (%s, %llu bytes; "
             "limit %llu bytes)", snode_label(n, name, sizeof name), fb_snode_kind_name(n->kind),
             (unsigned long long)bytes, (unsigned long long)s->mem.limit);
  else
    snprintf(buf, len, "out of device memory allocating a block of SNode %s (%s, %llu bytes; "
             "the block pool is exhausted)", snode_label(n, name, sizeof name),
             fb_snode_kind_name(n->kind), (unsigned long long)bytes);
  return 1;
}

static int launch_error(fb_session *s, const sess_kernel *sk, int rc, int failed,
                        const char *msg) {
  const char *task = failed >= 0 && failed < sk->tl.n ? sk->tl.v[failed].ir->name : "?";
  char oom[512];
  if (oom_message(s, oom, sizeof oom))
    return fail(s, FB_EQUOTA, "kernel '%s': %s; those accesses were skipped", sk->k->name, oom);
  if (msg && msg[0]) return fail(s, rc, "kernel '%s': %s", sk->k->name, msg);
  if (rc == FB_EBOUNDS)
    return fail(s, FB_EBOUNDS, "kernel '%s' indexed a field out of bounds (task %s); those "
                "accesses were skipped", sk->k->name, task);
  return fail(s, rc, "kernel '%s': task %s failed on the device: %s", sk->k->name, task,
              fb_strerror(rc));
}

int fb_launch(fb_session *s, int kernel, const fb_value *args, int nargs, fb_value *ret) {
  if (!s) return FB_EINVAL;
  if (kernel < 0 || kernel >= s->nkernels)
    return fail(s, FB_ENOENT, "no kernel with id %d (the session has %d)", kernel, s->nkernels);
  sess_kernel *sk = &s->kernels[kernel];
  int rc = pack_args(s, sk->k, args, nargs);
  if (rc) return rc;
  static const uint64_t no_args[1] = {0};
  memset(s->mem.rets, 0, sizeof(uint64_t) * (size_t)s->mem.nrets);
  int32_t error = 0;
  fb_rt_ctx ctx = {s->mem.root, s->args ? s->args : no_args, s->mem.rets, s->mem.gtmp,
                   &error, s->seed, s->launch_no, NULL};
  double secs = 0;
  int failed = -1;
  char msg[ERRLEN];
  msg[0] = 0;
  if (s->sparse) {
    fb_sparse_begin(s->sparse);
    ctx.runtime = fb_sparse_state(s->sparse);
  }
  rc = fb_cpu_run_sparse(s->e->dev, &ctx, s->sparse, sk->code, sk->hints, sk->tl.n, &secs,
                         &failed, msg, sizeof msg);
  if (s->sparse) fb_sparse_end(s->sparse);
  s->launch_no++;
  s->c.launches++;
  s->c.tasks_launched += (uint64_t)sk->tl.n;
  s->c.backend_s += secs;
  if (ret) {
    if (sk->k->ret != FB_T_VOID) *ret = fb_slot_unpack(sk->k->ret, s->mem.rets[0]);
    else memset(ret, 0, sizeof *ret);
  }
  return rc ? launch_error(s, sk, rc, failed, msg) : 0;
}

/* ---------------------------------------------------------------- host access
 * A dense field's element address is separable by axis:
 *   offset(idx) = base + sum_d g_d(idx[d]),
 *   g_d(x) = sum over the containers t splitting that axis of
 *            ((x / t.stride) % t.size) * t.mul
 * (see fb_layout_dense_offset), so whole-field copies walk rows and only
 * the last dimension is stepped per element (a plain memcpy when its rows
 * are contiguous). */

typedef struct axis_term {
  int64_t stride, size;
  uint64_t mul;
} axis_term;

typedef struct field_plan {
  const fb_snode *f;
  size_t esz;
  int ndim;
  int64_t shape[FB_MAX_AXES]; /* per index, in axis order */
  int64_t numel;
  uint64_t base;
  int nterm[FB_MAX_AXES];
  axis_term term[FB_MAX_AXES][MAX_PATH];
} field_plan;

static void copy_elem(uint8_t *dst, const uint8_t *src, size_t esz, int to_bool);
static int oom_message(fb_session *s, char *buf, size_t len);

static int check_field(fb_session *s, int field, const char *what) {
  const fb_layout *l = s->layout;
  if (field < 0 || field >= l->nnodes)
    return fail(s, FB_ENOENT, "%s: no field with id %d (the layout has %d SNodes)", what, field,
                l->nnodes);
  const fb_snode *f = &l->nodes[field];
  if (f->kind != FB_SN_PLACE)
    return fail(s, FB_EINVAL, "%s: SNode %d (%s%s%s) is not a field", what, field,
                fb_snode_kind_name(f->kind), f->name ? " " : "", f->name ? f->name : "");
  return 0;
}

/* Does the field lie under a sparse container? */
static int field_is_sparse(const fb_session *s, int field) {
  return s->sparse && fb_cg_sparse_leaf(s->layout, s->layout->nodes[field].parent) != 0;
}

/* Host side of an out-of-memory while activating: FB_EQUOTA naming the SNode. */
static int host_oom(fb_session *s, const char *what) {
  char oom[512];
  if (!oom_message(s, oom, sizeof oom)) snprintf(oom, sizeof oom, "out of device memory");
  return fail(s, FB_EQUOTA, "%s: %s", what, oom);
}

/* Element by element through the sparse runtime: reads of inactive cells
 * give 0, writes activate (every element of the field). */
static int sparse_io(fb_session *s, const fb_snode *f, uint8_t *host, int write, const char *what) {
  size_t esz = fb_type_size(f->type);
  int64_t numel = fb_field_numel(s->layout, f->id), idx[FB_MAX_AXES] = {0, 0, 0, 0};
  fb_sparse_begin(s->sparse);
  for (int64_t e = 0; e < numel; e++) {
    uint8_t *h = host + (size_t)e * esz;
    uint8_t *d = fb_sparse_elem(s->sparse, s->mem.root, f->id, idx, write);
    if (write && !d) return host_oom(s, what);
    if (write) copy_elem(d, h, esz, f->type == FB_T_BOOL);
    else if (d) copy_elem(h, d, esz, 0);
    else memset(h, 0, esz);
    for (int k = f->ndim - 1; k >= 0; k--) { /* odometer */
      if (++idx[k] < f->shape[f->dim_axis[k]]) break;
      idx[k] = 0;
    }
  }
  return 0;
}

static int dim_of_axis(const fb_snode *f, int axis) {
  for (int d = 0; d < f->ndim; d++)
    if (f->dim_axis[d] == axis) return d;
  return -1;
}

/* The terms container s adds to each dimension it splits. */
static void plan_node(field_plan *p, const fb_layout *l, const fb_snode *s) {
  for (int a = 0; a < FB_MAX_AXES; a++) {
    if (!(s->axes & (1u << a))) continue;
    int d = dim_of_axis(p->f, a);
    if (d < 0 || p->nterm[d] >= MAX_PATH) continue;
    uint64_t mul = s->cell_bytes;
    for (int b = a + 1; b < FB_MAX_AXES; b++)
      if (s->axes & (1u << b)) mul *= (uint64_t)s->size[b];
    axis_term *t = &p->term[d][p->nterm[d]++];
    t->stride = fb_layout_stride(l, s->id, p->f->id, a);
    t->size = s->size[a];
    t->mul = mul;
  }
}

static void plan_field(field_plan *p, const fb_layout *l, int field) {
  memset(p, 0, sizeof *p);
  p->f = &l->nodes[field];
  p->esz = fb_type_size(p->f->type);
  p->ndim = p->f->ndim;
  p->numel = 1;
  for (int d = 0; d < p->ndim; d++) {
    p->shape[d] = p->f->shape[p->f->dim_axis[d]];
    p->numel *= p->shape[d];
  }
  int path[MAX_PATH];
  int n = fb_layout_path(l, field, path, MAX_PATH);
  p->base = p->f->offset;
  for (int i = 0; i < n; i++) {
    const fb_snode *s = &l->nodes[path[i]];
    p->base += s->offset;
    plan_node(p, l, s);
  }
}

static uint64_t axis_offset(const field_plan *p, int d, int64_t x) {
  uint64_t off = 0;
  for (int t = 0; t < p->nterm[d]; t++) {
    const axis_term *at = &p->term[d][t];
    off += (uint64_t)((x / at->stride) % at->size) * at->mul;
  }
  return off;
}

static void copy_elem(uint8_t *dst, const uint8_t *src, size_t esz, int to_bool) {
  switch (esz) {
  case 1: *dst = to_bool ? *src != 0 : *src; break;
  case 4: memcpy(dst, src, 4); break;
  case 8: memcpy(dst, src, 8); break;
  default: memcpy(dst, src, esz); break;
  }
}

/* One row of the last dimension between device (dev) and host. */
static void copy_row(const field_plan *p, uint8_t *dev, uint8_t *host, int64_t len, int write) {
  int last = p->ndim - 1;
  size_t esz = p->esz;
  int to_bool = write && p->f->type == FB_T_BOOL;
  if (p->nterm[last] == 1 && p->term[last][0].mul == esz && !to_bool) {
    if (write) memcpy(dev, host, (size_t)len * esz);
    else memcpy(host, dev, (size_t)len * esz);
    return;
  }
  int affine = p->nterm[last] == 1;
  uint64_t step = affine ? p->term[last][0].mul : 0;
  for (int64_t x = 0; x < len; x++) {
    uint8_t *d = dev + (affine ? (uint64_t)x * step : axis_offset(p, last, x));
    if (write) copy_elem(d, host + (size_t)x * esz, esz, to_bool);
    else copy_elem(host + (size_t)x * esz, d, esz, 0);
  }
}

static void copy_field(const field_plan *p, uint8_t *root, uint8_t *host, int write) {
  if (p->ndim == 0) {
    if (write) copy_elem(root + p->base, host, p->esz, p->f->type == FB_T_BOOL);
    else copy_elem(host, root + p->base, p->esz, 0);
    return;
  }
  int last = p->ndim - 1;
  int64_t len = p->shape[last], rows = p->numel / len;
  int64_t idx[FB_MAX_AXES] = {0, 0, 0, 0};
  for (int64_t r = 0; r < rows; r++) {
    uint64_t off = p->base;
    for (int d = 0; d < last; d++) off += axis_offset(p, d, idx[d]);
    copy_row(p, root + off, host + (size_t)(r * len) * p->esz, len, write);
    for (int d = last - 1; d >= 0; d--) { /* odometer over the outer dims */
      if (++idx[d] < p->shape[d]) break;
      idx[d] = 0;
    }
  }
}

static int field_io(fb_session *s, int field, void *buf, size_t bytes, int write) {
  const char *what = write ? "field write" : "field read";
  if (!s) return FB_EINVAL;
  int rc = check_field(s, field, what);
  if (rc) return rc;
  field_plan *p = malloc(sizeof *p);
  if (!p) return fail(s, FB_ENOMEM, "%s: out of memory", what);
  plan_field(p, s->layout, field);
  uint64_t want = (uint64_t)p->numel * p->esz;
  if (bytes != want || !buf) {
    rc = fail(s, FB_EINVAL, "%s: field '%s' holds %lld elements of %s (%llu bytes); %zu bytes "
              "given%s", what, p->f->name, (long long)p->numel, fb_type_name(p->f->type),
              (unsigned long long)want, bytes, buf ? "" : " with no buffer");
  } else if (field_is_sparse(s, field)) {
    rc = sparse_io(s, p->f, buf, write, what);
  } else {
    copy_field(p, s->mem.root, buf, write);
  }
  free(p);
  return rc;
}

int fb_field_read(fb_session *s, int field, void *dst, size_t bytes) {
  return field_io(s, field, dst, bytes, 0);
}

int fb_field_write(fb_session *s, int field, const void *src, size_t bytes) {
  return field_io(s, field, (void *)src, bytes, 1);
}

/* Validate one element's index; returns its address through *addr (NULL:
 * an inactive cell when reading). Writing activates the cell. */
static int cell_addr(fb_session *s, int field, const int64_t *idx, int nidx, const char *what,
                     const fb_value *v, uint8_t **addr) {
  int rc = check_field(s, field, what);
  if (rc) return rc;
  const fb_snode *f = &s->layout->nodes[field];
  if (nidx != f->ndim || (nidx > 0 && !idx))
    return fail(s, FB_EINVAL, "%s: field '%s' takes %d indices, %d given", what, f->name,
                f->ndim, nidx);
  for (int d = 0; d < nidx; d++) {
    if (idx[d] >= 0 && idx[d] < f->shape[f->dim_axis[d]]) continue;
    char ix[128] = "", sh[128] = "";
    for (int e = 0; e < nidx; e++) {
      size_t a = strlen(ix), b = strlen(sh);
      snprintf(ix + a, sizeof ix - a, "%s%lld", e ? ", " : "", (long long)idx[e]);
      snprintf(sh + b, sizeof sh - b, "%s%lld", e ? ", " : "",
               (long long)f->shape[f->dim_axis[e]]);
    }
    return fail(s, FB_EBOUNDS, "%s: index (%s) is out of bounds of field '%s' of shape (%s)",
                what, ix, f->name, sh);
  }
  if (v && !kinds_agree(f->type, v->type))
    return fail(s, FB_ETYPE, "%s: field '%s' of type %s cannot take a value of type %s", what,
                f->name, fb_type_name(f->type), type_name_safe(v->type));
  int write = v != NULL;
  if (!field_is_sparse(s, field)) {
    *addr = s->mem.root + fb_layout_dense_offset(s->layout, field, idx);
    return 0;
  }
  fb_sparse_begin(s->sparse);
  *addr = fb_sparse_elem(s->sparse, s->mem.root, field, idx, write);
  return write && !*addr ? host_oom(s, what) : 0;
}

int fb_cell_read(fb_session *s, int field, const int64_t *idx, int nidx, fb_value *out) {
  uint8_t *p = NULL;
  if (!s) return FB_EINVAL;
  int rc = cell_addr(s, field, idx, nidx, "cell read", NULL, &p);
  if (rc) return rc;
  fb_type t = s->layout->nodes[field].type;
  if (p) {
    *out = fb_value_load(t, p);
  } else {
    memset(out, 0, sizeof *out);
    out->type = t;
  }
  return 0;
}

int fb_cell_write(fb_session *s, int field, const int64_t *idx, int nidx, fb_value v) {
  uint8_t *p = NULL;
  if (!s) return FB_EINVAL;
  int rc = cell_addr(s, field, idx, nidx, "cell write", &v, &p);
  if (rc) return rc;
  fb_value_store(fb_value_cast(v, s->layout->nodes[field].type), p);
  return 0;
}
