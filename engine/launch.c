/* Launches: argument packing and checks, the sync path (run a kernel's
 * tasks at once, through the device's operations), and the
 * messages that name a failed launch; async launches go to async.c. */
#include "engine/internal.h"

/* ---------------------------------------------------------------- launches */

/* 0 bool, 1 integer, 2 float, -1 not a value type. */
static int type_kind(fb_type t) {
  if (t == FB_T_BOOL) return 0;
  if (fb_type_is_int(t)) return 1;
  if (fb_type_is_float(t)) return 2;
  return -1;
}

/* Values cross between types of one kind, and between bool and integers. */
int fbe_kinds_agree(fb_type want, fb_type have) {
  int a = type_kind(want), b = type_kind(have);
  if (a < 0 || b < 0) return 0;
  return a == b || (a <= 1 && b <= 1);
}

const char *fbe_type_name_safe(fb_type t) {
  return (unsigned)t < FB_T__COUNT ? fb_type_name(t) : "invalid";
}

static int pack_args(fb_session *s, const fb_kernel *k, const fb_value *args, int nargs) {
  if (nargs != k->nparams)
    return fail(s, FB_ETYPE, "kernel '%s' takes %d argument%s, %d given", k->name, k->nparams,
                k->nparams == 1 ? "" : "s", nargs);
  if (nargs > 0 && !args)
    return fail(s, FB_EINVAL, "kernel '%s': no argument values given", k->name);
  for (int i = 0; i < nargs; i++) {
    if (!fbe_kinds_agree(k->params[i], args[i].type))
      return fail(s, FB_ETYPE,
                  "kernel '%s': argument %d (parameter of type %s) cannot take "
                  "a value of type %s",
                  k->name, i, fbe_type_name_safe(k->params[i]), fbe_type_name_safe(args[i].type));
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
int fbe_oom_message(fb_session *s, char *buf, size_t len) {
  int sn;
  uint64_t bytes;
  if (!s->sparse || !fb_sparse_take_oom(s->sparse, &sn, &bytes)) return 0;
  const fb_snode *n = &s->layout->nodes[sn];
  char name[160];
  if (s->mem.limit)
    fb_errf(buf, len,
            "out of device memory allocating a block of SNode %s (%s, %llu bytes; "
            "limit %llu bytes)",
            snode_label(n, name, sizeof name), fb_snode_kind_name(n->kind),
            (unsigned long long)bytes, (unsigned long long)s->mem.limit);
  else
    fb_errf(buf, len,
            "out of device memory allocating a block of SNode %s (%s, %llu bytes; "
            "the block pool is exhausted)",
            snode_label(n, name, sizeof name), fb_snode_kind_name(n->kind),
            (unsigned long long)bytes);
  return 1;
}

static int launch_error(fb_session *s, const sess_kernel *sk, int rc, int failed, const char *msg) {
  char task[FBE_WHERE_MAX];
  fbe_task_where((const fb_kernel *const *)sk->irs, sk->tl.n, failed, task, sizeof task);
  char oom[512];
  if (fbe_oom_message(s, oom, sizeof oom))
    return fail(s, FB_EQUOTA, "kernel '%s': %s; those accesses were skipped", sk->k->name, oom);
  if (msg && msg[0]) return fail(s, rc, "kernel '%s': %s", sk->k->name, msg);
  if (rc == FB_EBOUNDS)
    return fail(s, FB_EBOUNDS,
                "kernel '%s' indexed a field out of bounds in %s; those "
                "accesses were skipped",
                sk->k->name, task);
  return fail(s, rc, "kernel '%s': %s failed on the device: %s", sk->k->name, task,
              fb_strerror(rc));
}

/* Sync mode: a launch on the device track of the timeline. */
static void trace_launch(fb_session *s, const sess_kernel *sk, double t0) {
  char args[96];
  snprintf(args, sizeof args, "{\"launch\":%llu,\"tasks\":%d}", (unsigned long long)s->launch_no,
           sk->tl.n);
  fb_trace_span(s->trace, FB_TRACK_DEVICE, "launch", sk->k->name, t0, fb_trace_clock(), args);
}

/* The session's queue has failed (CUDA: a sticky error) */
int fbe_device_dead(fb_session *s) {
  char msg[ERRLEN];
  if (!s->e->ops->alive(s->q, msg, sizeof msg)) return 0;
  return fail(s, FB_EDEVICE, "%s", msg);
}

int fb_launch(fb_session *s, int kernel, const fb_value *args, int nargs, fb_value *ret) {
  if (!s) return FB_EINVAL;
  if (kernel < 0 || kernel >= s->nkernels)
    return fail(s, FB_ENOENT, "no kernel with id %d (the session has %d)", kernel, s->nkernels);
  sess_kernel *sk = &s->kernels[kernel];
  int rc = pack_args(s, sk->k, args, nargs);
  if (rc) return rc;
  if ((rc = fbe_device_dead(s))) return rc;
  if (s->ad && (rc = fbe_tape_record(s, kernel, args, nargs))) return rc;
  if (s->as) return fbe_async_launch(s, kernel, sk, ret);
  char msg[ERRLEN];
  msg[0] = 0;
  if ((rc = fb_devmem_clear_rets(&s->mem, msg, sizeof msg)))
    return fail(s, rc, "kernel '%s': %s", sk->k->name, msg);
  int32_t error[2] = {0, 0}; /* the error and the blame word (fb_rt.h) */
  fb_rt_ctx ctx = {s->mem.root,  s->args ? s->args : no_args,
                   s->mem.rets,  s->mem.gtmp,
                   error,        s->seed,
                   s->launch_no, NULL,
                   NULL};
  double secs = 0;
  int failed = -1;
  if (s->sparse) {
    fb_sparse_begin(s->sparse);
    ctx.runtime = fb_sparse_state(s->sparse);
  }
  if (s->hook && s->hook(s->hook_user, sk->k->name, sk->k->name, s->launch_no)) {
    if (s->sparse) fb_sparse_end(s->sparse);
    s->hook(s->hook_user, NULL, NULL, s->launch_no);
    return fail(s, FB_ECANCELLED, "kernel '%s' (launch %llu) was cancelled before it ran",
                sk->k->name, (unsigned long long)s->launch_no);
  }
  double t0 = s->trace ? fb_trace_clock() : 0;
  rc = s->e->ops->run(s->q, &ctx, s->sparse, sk->code, sk->hints, sk->tl.n, &secs, &failed, msg,
                      sizeof msg);
  if (s->trace) trace_launch(s, sk, t0);
  if (s->hook) s->hook(s->hook_user, NULL, NULL, s->launch_no);
  if (s->sparse) fb_sparse_end(s->sparse);
  s->launch_no++;
  s->c.launches++;
  s->c.tasks_launched += (uint64_t)sk->tl.n;
  s->c.backend_s += secs;
  if (ret) {
    uint64_t slot = 0;
    char rerr[512];
    /* read even when the launch failed: what the kernel returned before
     * its error is its result, as the interpreter gives it */
    int crc = sk->k->ret != FB_T_VOID ? fb_devmem_ret0(&s->mem, &slot, rerr, sizeof rerr) : 0;
    if (crc) slot = 0;
    if (crc && !rc) return fail(s, crc, "kernel '%s': reading its return value: %s", sk->k->name, rerr);
    if (sk->k->ret != FB_T_VOID) *ret = fb_slot_unpack(sk->k->ret, slot);
    else memset(ret, 0, sizeof *ret);
  }
  return rc ? launch_error(s, sk, rc, failed, msg) : 0;
}
