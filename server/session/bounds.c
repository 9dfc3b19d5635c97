/* The largest reply a session process may send for a job (reply_cap),
 * from what the broker asked for and the protobuf descriptors' largest
 * encodings (pb_max), so that a field added to Counters or SyncResult can
 * never make a legitimate reply look oversized. */
#define _GNU_SOURCE
#include "server/session/proc.h"

/* The most bytes of packed response that a reply to j can legitimately
 * hold, from what the broker asked for: a worker is not trusted to say how
 * much the broker must allocate. RegisterKernels: one id per kernel sent;
 * a batch with a sync: a SyncResult listing at most one return per launch
 * sent since the last SyncResult and FBD_SYNC_MAX_ERRS errors of under
 * FBD_ERRLEN bytes each (exec.c keeps no more); a WriteField: one count.
 * Everything else answers with a status only (a read's bytes go through
 * the staging buffer's memfd). */
static uint64_t varint_len(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

/* The most bytes message type d packs to, each field at its widest; the
 * field named `open` (a string, or a repeated field) contributes nothing
 * here and is the caller's to add. UINT64_MAX: some other field has no
 * bound (a string, bytes or repeated field). */
static uint64_t pb_max(const ProtobufCMessageDescriptor *d, const char *open) {
  uint64_t total = 0;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (open && !strcmp(f->name, open)) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) return UINT64_MAX;
    uint64_t v;
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL: v = 1; break;
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FLOAT: v = 4; break;
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: v = 8; break;
    case PROTOBUF_C_TYPE_MESSAGE:
      v = pb_max(f->descriptor, NULL);
      if (v == UINT64_MAX) return v;
      v += varint_len(v);
      break;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES: return UINT64_MAX;
    default: v = 10; break; /* varints: a negative int32 takes 10 */
    }
    total += varint_len((uint64_t)f->id << 3) + v;
  }
  return total;
}

/* The widest SyncResult entries and fixed part, once. */
static uint64_t pb_sync_fixed, pb_ret_max, pb_err_max;
static pthread_once_t pb_once = PTHREAD_ONCE_INIT;

static void pb_bounds(void) {
  /* SyncResult less its two repeated fields (returns, errors: per entry
   * below), wrapped in SessionResponse (a tag and a length prefix) */
  uint64_t fixed = 0;
  const ProtobufCMessageDescriptor *d = &fusebox__v1__sync_result__descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->label == PROTOBUF_C_LABEL_REPEATED) continue; /* returns, errors: per entry below */
    uint64_t v = f->type == PROTOBUF_C_TYPE_MESSAGE ? pb_max(f->descriptor, NULL) : 10;
    if (v == UINT64_MAX) {
      fixed = WIRE_MAX_PB; /* a field without a bound: the wire's own limit */
      break;
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) v += 5;
    fixed += varint_len((uint64_t)f->id << 3) + v;
  }
  pb_sync_fixed = fixed + 1 + 5;
  /* a returns or errors entry: its tag, a length prefix, the entry */
  uint64_t ret = pb_max(&fusebox__v1__launch_return__descriptor, NULL);
  uint64_t err = pb_max(&fusebox__v1__launch_error__descriptor, "message");
  /* a field without a bound: the wire's own limit per entry */
  pb_ret_max = ret == UINT64_MAX ? WIRE_MAX_PB : 1 + 5 + ret;
  pb_err_max = err == UINT64_MAX ? WIRE_MAX_PB : 1 + 5 + err + 1 + 5 + FBD_ERRLEN;
}

uint64_t fbd_reply_cap(const fbd_proc *p, const fbd_job *j) {
  switch (j->kind) {
  case FBD_J_REGISTER: { /* a source adds at most FBD_SOURCE_INSTANCES instances */
    const Fusebox__V1__RegisterKernelsRequest *m = j->msg;
    uint64_t n =
        m ? m->n_kernels + m->n_adjoints + m->n_tangents + (m->source ? FBD_SOURCE_INSTANCES : 0)
          : 0;
    return 16 + 10 * n;
  }
  case FBD_J_PARSE: /* a layout: at most FB_LAYOUT_MAX_NODES SNodes named in the source */
  case FBD_J_DESCRIBE: /* its fields and kernels, named in the source */
    return FBD_SOURCE_REPLY_MAX;
  case FBD_J_BATCH: {
    if (!j->sync) return 0;
    uint64_t rets = p->unsynced < FBD_SYNC_MAX_RETS ? p->unsynced : FBD_SYNC_MAX_RETS;
    pthread_once(&pb_once, pb_bounds);
    return pb_sync_fixed + rets * pb_ret_max + (uint64_t)FBD_SYNC_MAX_ERRS * pb_err_max;
  }
  case FBD_J_WRITE: return 16;
  case FBD_J_RESTORE: return FBD_SOURCE_REPLY_MAX; /* a layout */
  default: return 0;
  }
}
