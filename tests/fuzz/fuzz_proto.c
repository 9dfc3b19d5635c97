/* libFuzzer target: the bytes a client sends fuseboxd, decoded and converted
 * as the server does it (server/methods.c, server/session/source.c, server/session/exec.c).
 *
 * Input framing: byte 0 picks the request type (its value modulo NTYPES,
 * the table `types` below: every message fuseboxd unpacks), byte 1 holds
 * flags, the rest is the message:
 *   flags bit 0   the decode limit: set, the smallest the server ever uses
 *                 (DECODE_FLOOR, 80 KiB, what a request that outlives its
 *                 call gets when the memory budget is full); clear, the
 *                 default FBP_DECODE_FACTOR x 16 MiB (max_message_bytes)
 *   flags bits 2+ where a FieldChunk's byte buffer is cut into slices
 * RegisterKernels carries the session too: a 4-byte little-endian length n,
 * n bytes of CreateSessionRequest (the session's layout, from its layout or
 * its source), then the RegisterKernelsRequest.
 *
 * What runs, per type (the server's order, the server's limits):
 *   every message   protobuf_c_message_unpack on an fbp_arena with the
 *                   limit above (over set only when it fails)
 *   CreateSession   a layout or a source, not both; fbp_layout_from_pb, or
 *                   the source's layout (fbd_source_layout) as the worker
 *                   that parsed it sends it to the broker (fbp_layout_to_pb,
 *                   packed, decoded, fbp_layout_from_pb)
 *   RegisterKernels fbd_source_expand (no more than 4096 instances; the
 *                   source's layout must be the session's); then, as the
 *                   worker does, every kernel
 *                   through fbp_kernel_from_pb, fb_kernel_check_public
 *                   (20,000 statements, the engine's default) and fb_verify
 *   Session         every launch's arguments through fbp_value_from_pb
 *   WriteField      fbp_bb_take_chunk on a gRPC byte buffer of one to four
 *                   slices (fbp_chunk_parse_head, then fbp_chunk_parse)
 *   DescribeSource  server/session/source.c fbd_source_describe, and its reply
 *                   decoded as a SourceInfo
 * Sources go through server/session/source.c itself, linked in (fbd_source_layout,
 * fbd_source_expand, fbd_source_describe: the ${NAME} substitution, the
 * 1 MiB caps, the language's work budget and the rendering of diagnostics
 * as the worker runs them); the server's deadline and cancellation are left
 * to libFuzzer's -timeout (no limits given).
 *
 * Beyond ASan and UBSan, it aborts when an invariant that the code documents
 * fails:
 *   - a decoded message packs and decodes again to the same bytes;
 *   - a layout or kernel that fbp_*_from_pb accepts converts back with
 *     fbp_*_to_pb and is accepted again, to the same wire form
 *     (proto/convert.h: x_from_pb(x_to_pb(x)) reproduces x);
 *   - a kernel or layout the front end made is accepted by fbp_*_from_pb;
 *   - fbp_chunk_parse accepts exactly what protobuf-c accepts as a
 *     FieldChunk, with the same fields; fbp_bb_take_chunk agrees with both;
 *   - fbp_session_scan (the broker's read of a SessionRequest's routing
 *     fields under process isolation) accepts whatever protobuf-c decodes
 *     as a SessionRequest, with the same session id, launch and tape mark
 *     counts, flush and sync, and whatever it refuses protobuf-c refuses.
 *
 * Seeds: `fuzz_proto --make-seeds DIR FILE.fbk...` writes inputs of every
 * type from the example programs (scripts/fuzz.sh does it; no binary seeds
 * are checked in). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"
#include "fusebox/lang.h"
#include "proto/convert.h"
#include "proto/wire.h"
#include "server/server.h"

#define MAX_MESSAGE_BYTES ((size_t)FB_SERVER_MAX_MESSAGE_BYTES_DEFAULT)
#define DECODE_FLOOR ((size_t)80 << 10)      /* server/methods.c */
#define MAX_STMTS FB_MAX_KERNEL_STATEMENTS_DEFAULT
#define ERRLEN 4096

enum {
  T_HEALTH,
  T_INFO,
  T_STATS,
  T_CREATE,
  T_CLOSE,
  T_CANCEL,
  T_REGISTER,
  T_SESSION,
  T_CHUNK,
  T_READ,
  T_SOURCE,
  NTYPES
};

static const ProtobufCMessageDescriptor *const types[NTYPES] = {
    [T_HEALTH] = &grpc__health__v1__health_check_request__descriptor,
    [T_INFO] = &fusebox__v1__info_request__descriptor,
    [T_STATS] = &fusebox__v1__stats_request__descriptor,
    [T_CREATE] = &fusebox__v1__create_session_request__descriptor,
    [T_CLOSE] = &fusebox__v1__close_session_request__descriptor,
    [T_CANCEL] = &fusebox__v1__cancel_request__descriptor,
    [T_REGISTER] = &fusebox__v1__register_kernels_request__descriptor,
    [T_SESSION] = &fusebox__v1__session_request__descriptor,
    [T_CHUNK] = &fusebox__v1__field_chunk__descriptor,
    [T_READ] = &fusebox__v1__read_field_request__descriptor,
    [T_SOURCE] = &fusebox__v1__source__descriptor,
};

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    fprintf(stderr, "fuzz_proto: " __VA_ARGS__);                                                   \
    fputc('\n', stderr);                                                                           \
    abort();                                                                                       \
  } while (0)

/* ---------------------------------------------------------------- decoding */

/* server/methods.c decode_keep: unpack under a limit on what the arena
 * holds. NULL when refused (malformed, or over the limit). */
static ProtobufCMessage *decode(const ProtobufCMessageDescriptor *d, fbp_arena *a,
                                const uint8_t *p, size_t n, int floor) {
  size_t limit = floor ? DECODE_FLOOR : FBP_DECODE_FACTOR * MAX_MESSAGE_BYTES;
  a->limit = a->held + limit;
  a->over = 0;
  ProtobufCMessage *m = protobuf_c_message_unpack(d, &a->pb, n, p);
  a->limit = 0;
  if (m && a->over) FAIL("%s decoded although its arena refused an allocation", d->name);
  return m;
}

/* Whether m or a message inside it kept unknown fields. */
static int has_unknown(const ProtobufCMessage *m) {
  if (!m) return 0;
  if (m->n_unknown_fields) return 1;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    const char *at = (const char *)m + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
      ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)at;
      for (size_t j = 0; j < n; j++)
        if (has_unknown(v[j])) return 1;
    } else if (has_unknown(*(ProtobufCMessage *const *)at)) {
      return 1;
    }
  }
  return 0;
}

/* A decoded message packs, and decodes again to the same bytes. Messages
 * that kept unknown fields are left out: protobuf-c 1.4 keeps a key that no
 * protobuf encoder writes (field number 0 in an over-long key, or the low
 * 32 bits of a field number over 2^29 - 1) and packs it again as a key it
 * then refuses (or reads as another field); see docs/testing.md. */
static void check_repack(const ProtobufCMessage *m) {
  if (!protobuf_c_message_check(m)) FAIL("%s: decoded message fails its check", m->descriptor->name);
  if (has_unknown(m)) return;
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b1 = malloc(n + 1), *b2 = malloc(n + 1);
  if (!b1 || !b2) FAIL("out of memory");
  if (protobuf_c_message_pack(m, b1) != n) FAIL("%s: packed size differs", m->descriptor->name);
  fbp_arena a;
  fbp_arena_init(&a);
  ProtobufCMessage *again = protobuf_c_message_unpack(m->descriptor, &a.pb, n, b1);
  if (!again) FAIL("%s: its own packing (%zu bytes) does not decode", m->descriptor->name, n);
  if (protobuf_c_message_get_packed_size(again) != n || protobuf_c_message_pack(again, b2) != n ||
      memcmp(b1, b2, n) != 0)
    FAIL("%s: packing changes after a decode", m->descriptor->name);
  fbp_arena_free(&a);
  free(b1);
  free(b2);
}

/* The wire bytes of m (malloc'd) in *out, their count returned. */
static size_t packed(const ProtobufCMessage *m, uint8_t **out) {
  size_t n = protobuf_c_message_get_packed_size(m);
  *out = malloc(n + 1);
  if (!*out) FAIL("out of memory");
  protobuf_c_message_pack(m, *out);
  return n;
}

static void same_wire(const ProtobufCMessage *x, const ProtobufCMessage *y, const char *what) {
  uint8_t *bx, *by;
  size_t nx = packed(x, &bx), ny = packed(y, &by);
  if (nx != ny || memcmp(bx, by, nx) != 0) FAIL("%s: converting back does not reproduce it", what);
  free(bx);
  free(by);
}

/* ---------------------------------------------------------------- conversions */

static void check_layout_roundtrip(const fb_layout *l) {
  char err[ERRLEN];
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Layout *m1 = fbp_layout_to_pb(&a, l);
  if (!m1) FAIL("fbp_layout_to_pb: out of memory");
  fb_layout *l2 = NULL;
  if (fbp_layout_from_pb(m1, &l2, err, sizeof err))
    FAIL("a layout fbp_layout_from_pb accepted is refused once converted back: %s", err);
  Fusebox__V1__Layout *m2 = fbp_layout_to_pb(&a, l2);
  if (!m2) FAIL("fbp_layout_to_pb: out of memory");
  same_wire(&m1->base, &m2->base, "layout");
  fb_layout_free(l2);
  fbp_arena_free(&a);
}

static void check_kernel_roundtrip(const fb_kernel *k, const fb_layout *l) {
  char err[ERRLEN];
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Kernel *m1 = fbp_kernel_to_pb(&a, k);
  if (!m1) FAIL("fbp_kernel_to_pb: out of memory");
  fb_kernel *k2 = NULL;
  if (fbp_kernel_from_pb(m1, l, &k2, err, sizeof err))
    FAIL("kernel '%s' accepted by fbp_kernel_from_pb is refused once converted back: %s", k->name,
         err);
  Fusebox__V1__Kernel *m2 = fbp_kernel_to_pb(&a, k2);
  if (!m2) FAIL("fbp_kernel_to_pb: out of memory");
  same_wire(&m1->base, &m2->base, "kernel");
  fb_kernel_free(k2);
  fbp_arena_free(&a);
}

/* What the worker does with each kernel of a RegisterKernels request
 * (server/session/exec.c register_one, then the engine's build_kernel checks). */
static void register_kernel(const Fusebox__V1__Kernel *m, const fb_layout *l, int from_source) {
  char err[ERRLEN];
  fb_kernel *k = NULL;
  if (fbp_kernel_from_pb(m, l, &k, err, sizeof err)) {
    if (from_source) FAIL("a kernel the front end made is refused by fbp_kernel_from_pb: %s", err);
    return;
  }
  check_kernel_roundtrip(k, l);
  if (!fb_kernel_check_public(k, MAX_STMTS, err, sizeof err)) {
    fb_diags d;
    fb_diags_init(&d);
    fb_verify(k, &d);
    fb_diags_free(&d);
  }
  fb_kernel_free(k);
}

/* ---------------------------------------------------------------- sources (server/session/source.c) */

/* server/session/source.c's one outside need: the clock of a parse's deadline
 * (none is set here). */
double fbd_now(void) { return 0; }

static const fbd_parse_limits no_limits; /* libFuzzer's -timeout stands for them */

/* The session's layout from a CreateSessionRequest, or NULL. A source's
 * layout comes from the worker that parsed it to the broker as protobuf,
 * and the broker converts it as it converts a client's. */
static fb_layout *session_layout(const Fusebox__V1__CreateSessionRequest *m) {
  char err[FBD_ERRLEN];
  fb_layout *l = NULL;
  if (fbd_source_layout(m, &no_limits, &l, err, sizeof err)) return NULL;
  if (m->source) { /* what the broker receives from the worker */
    fbp_arena a;
    fbp_arena_init(&a);
    Fusebox__V1__Layout *pl = fbp_layout_to_pb(&a, l);
    if (!pl) FAIL("out of memory");
    uint8_t *bytes;
    size_t n = packed(&pl->base, &bytes);
    Fusebox__V1__Layout *back = fusebox__v1__layout__unpack(&a.pb, n, bytes);
    if (!back) FAIL("a source's layout does not decode from its own packing");
    fb_layout *b = NULL;
    if (fbp_layout_from_pb(back, &b, err, sizeof err))
      FAIL("the layout of a source that parsed is refused by fbp_layout_from_pb: %s", err);
    free(bytes);
    fbp_arena_free(&a);
    fb_layout_free(l);
    l = b;
  }
  check_layout_roundtrip(l);
  return l;
}

static void register_kernels(const uint8_t *p, size_t n, int floor) {
  if (n < 4) return;
  size_t n1 = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
  if (n1 > n - 4) return;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CreateSessionRequest *cs = (Fusebox__V1__CreateSessionRequest *)decode(
      types[T_CREATE], &a, p + 4, n1, 0);
  fb_layout *l = cs ? session_layout(cs) : NULL;
  fbp_arena_free(&a);
  if (!l) return;
  fbp_arena_init(&a);
  Fusebox__V1__RegisterKernelsRequest *m = (Fusebox__V1__RegisterKernelsRequest *)decode(
      types[T_REGISTER], &a, p + 4 + n1, n - 4 - n1, floor);
  size_t nk = 0;
  Fusebox__V1__Kernel **ks = NULL;
  char err[FBD_ERRLEN];
  if (m) check_repack(&m->base);
  if (m && !fbd_source_expand(m, l, &no_limits, &a, &ks, &nk, err, sizeof err))
    for (size_t i = 0; i < nk; i++) register_kernel(ks[i], l, i >= m->n_kernels);
  fbp_arena_free(&a);
  fb_layout_free(l);
}

/* ---------------------------------------------------------------- field chunks */

/* protobuf-c's strings end at a NUL byte; the chunk parser's session id
 * has its length: compare what protobuf-c keeps of it. */
static int same_chunk(const fbp_chunk *c, const Fusebox__V1__FieldChunk *m) {
  size_t idl = strlen(m->session_id);
  const char *nul = memchr(c->session_id, 0, c->session_id_len);
  size_t cl = nul ? (size_t)(nul - c->session_id) : c->session_id_len;
  return cl == idl && memcmp(c->session_id, m->session_id, idl) == 0 &&
         c->field == m->field && c->offset == m->offset && c->total_bytes == m->total_bytes &&
         c->len == m->data.len && (!c->len || (c->data && !memcmp(c->data, m->data.data, c->len)));
}

/* fbp_bb_take_chunk's destination: the chunk as dst saw it (its session
 * id valid only there), and a buffer for its data. */
typedef struct {
  fbp_chunk seen;
  char *id;
  uint8_t *to;
} dst_state;

static uint8_t *chunk_dst(void *user, const fbp_chunk *ch) {
  dst_state *s = user;
  s->seen = *ch;
  s->id = malloc(ch->session_id_len + 1);
  s->to = malloc(ch->len + 1);
  if (!s->id || !s->to) FAIL("out of memory");
  memcpy(s->id, ch->session_id, ch->session_id_len);
  s->seen.session_id = s->id;
  return s->to;
}

/* Whether a key in the n bytes at p, read as far as they are well formed,
 * has a field number the protobuf encoding does not allow: 0, or over
 * 2^29 - 1. fbp_chunk_parse refuses those; protobuf-c (1.4) takes field 0
 * in an over-long key (0x80 0x00) and keeps only the low 32 bits of a key
 * of up to 5 bytes, as an unknown field: a laxity of protobuf-c, not a
 * disagreement to report. */
static int odd_field_number(const uint8_t *p, size_t n) {
  const uint8_t *end = p + n;
  while (p < end) {
    uint64_t key = 0, v = 0;
    int shift = 0;
    do key |= (uint64_t)(*p & 0x7f) << shift, shift += 7;
    while (*p++ & 0x80 && p < end && shift < 64);
    if (key >> 3 == 0 || key >> 3 > 0x1fffffff) return 1;
    switch (key & 7) {
    case 0:
      while (p < end && *p & 0x80) p++;
      p++;
      break;
    case 1: p += 8; break;
    case 5: p += 4; break;
    case 2:
      shift = 0;
      do v |= (uint64_t)(*p & 0x7f) << shift, shift += 7;
      while (p < end && *p++ & 0x80 && shift < 64);
      if (v > (uint64_t)(end - p)) return 0;
      p += v;
      break;
    default: return 0;
    }
  }
  return 0;
}

static void field_chunk(const uint8_t *p, size_t n, unsigned cuts, int floor) {
  char err[256];
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__FieldChunk *m =
      (Fusebox__V1__FieldChunk *)decode(types[T_CHUNK], &a, p, n, floor);
  fbp_chunk c;
  int rc = fbp_chunk_parse(p, n, &c, err, sizeof err);
  if (m) check_repack(&m->base);
  if (rc && m && odd_field_number(p, n)) m = NULL; /* protobuf-c's laxity: compare no further */
  if (!rc != !!m)
    FAIL("fbp_chunk_parse %s %zu bytes that protobuf-c %s", rc ? "refuses" : "accepts", n,
         m ? "accepts" : "refuses");
  if (m && !same_chunk(&c, m)) FAIL("fbp_chunk_parse reads other fields than protobuf-c");
  /* the head parser: when it answers, the same as the full parse */
  fbp_chunk h;
  size_t at = 0, avail = n < FBP_CHUNK_HEADER_MAX ? n : FBP_CHUNK_HEADER_MAX;
  if (fbp_chunk_parse_head(p, avail, n, &h, &at) == 0) {
    if (rc) FAIL("fbp_chunk_parse_head accepts a FieldChunk that fbp_chunk_parse refuses");
    h.data = p + at;
    if (at + h.len != n || !same_chunk(&h, m)) FAIL("fbp_chunk_parse_head disagrees with protobuf-c");
  }
  /* what the server calls, on a byte buffer of one to four slices */
  grpc_slice sl[4];
  size_t ns = 0, from = 0;
  for (int i = 0; i < 3 && n; i++) {
    size_t cut = from + (cuts >> (8 * i) & 0xff) % (n - from + 1);
    if (cut == from || cut == n) continue;
    sl[ns++] = grpc_slice_from_copied_buffer((const char *)p + from, cut - from);
    from = cut;
  }
  sl[ns++] = grpc_slice_from_copied_buffer((const char *)p + from, n - from);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, ns);
  for (size_t i = 0; i < ns; i++) grpc_slice_unref(sl[i]);
  dst_state s;
  memset(&s, 0, sizeof s);
  fbp_chunk t;
  int trc = fbp_bb_take_chunk(bb, &t, chunk_dst, &s, err, sizeof err);
  if ((trc == 0) != !!m) FAIL("fbp_bb_take_chunk answers %d where protobuf-c %s", trc,
                             m ? "accepts" : "refuses");
  if (m) {
    if (t.session_id || t.session_id_len || t.data || t.len != s.seen.len)
      FAIL("fbp_bb_take_chunk returns a chunk that points into its copies");
    s.seen.data = s.to;
    if (!same_chunk(&s.seen, m)) FAIL("fbp_bb_take_chunk copies other bytes");
  }
  free(s.id);
  free(s.to);
  grpc_byte_buffer_destroy(bb);
  fbp_arena_free(&a);
}

/* ---------------------------------------------------------------- the stream's scan */

/* m: protobuf-c's decode of the bytes (NULL: refused; over: for its size) */
static void session_scan(const uint8_t *p, size_t n, const Fusebox__V1__SessionRequest *m,
                         int over) {
  fbp_session_head h;
  int rc = fbp_session_scan(p, n, &h);
  if (!m && !over) {
    if (rc && (h.n_launches || h.n_tape || h.sync || h.flush || h.session_id))
      FAIL("fbp_session_scan refused and left fields set");
    return;
  }
  if (!m) return; /* over the decode limit: the scan reads no sub-message */
  if (rc) FAIL("fbp_session_scan refused a SessionRequest protobuf-c decodes (%zu bytes)", n);
  if (h.n_launches != m->n_launches || h.n_tape != m->n_tape || h.sync != m->sync ||
      h.flush != (m->flush != 0) || h.session_id_len != strlen(m->session_id) ||
      (h.session_id_len && memcmp(h.session_id, m->session_id, h.session_id_len)))
    FAIL("fbp_session_scan read other fields than protobuf-c decoded");
}

/* ---------------------------------------------------------------- one input */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size - 2 > MAX_MESSAGE_BYTES) return 0;
  int type = data[0] % NTYPES, floor = data[1] & 1;
  unsigned cuts = (unsigned)data[1] >> 2;
  const uint8_t *p = data + 2;
  size_t n = size - 2;
  if (type == T_REGISTER) {
    register_kernels(p, n, floor);
    return 0;
  }
  if (type == T_CHUNK) {
    /* spread the cut positions over the message */
    cuts = cuts * 0x010305u;
    field_chunk(p, n, cuts, floor);
    return 0;
  }
  fbp_arena a;
  fbp_arena_init(&a);
  ProtobufCMessage *m = decode(types[type], &a, p, n, floor);
  if (type == T_SESSION) session_scan(p, n, (const Fusebox__V1__SessionRequest *)m, a.over);
  if (m) {
    check_repack(m);
    if (type == T_CREATE) {
      fb_layout *l = session_layout((Fusebox__V1__CreateSessionRequest *)m);
      fb_layout_free(l);
    } else if (type == T_SESSION) {
      const Fusebox__V1__SessionRequest *s = (const Fusebox__V1__SessionRequest *)m;
      for (size_t i = 0; i < s->n_launches; i++)
        for (size_t j = 0; j < s->launches[i]->n_args; j++) {
          fb_value v;
          fbp_value_from_pb(s->launches[i]->args[j], &v);
        }
    } else if (type == T_SOURCE) {
      fbd_reply r;
      memset(&r, 0, sizeof r);
      fbd_source_describe(p, n, &no_limits, &r);
      if (!r.code) { /* the reply a client gets decodes */
        fbp_arena b;
        fbp_arena_init(&b);
        if (!r.pb || !fusebox__v1__source_info__unpack(&b.pb, r.pblen, r.pb))
          FAIL("DescribeSource's reply is not a SourceInfo");
        fbp_arena_free(&b);
      }
      free(r.pb);
    }
  }
  fbp_arena_free(&a);
  return 0;
}

/* ---------------------------------------------------------------- seeds */

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = (n + 4096 + 1) * 2;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, 4096, f);
    n += got;
    if (got < 4096) break;
  }
  fclose(f);
  buf[n] = 0;
  return buf;
}

static int write_seed(const char *dir, const char *base, const char *what, int type,
                      const ProtobufCMessage *first, const ProtobufCMessage *m) {
  size_t n1 = first ? protobuf_c_message_get_packed_size(first) : 0;
  size_t n2 = protobuf_c_message_get_packed_size(m), pre = first ? 4 : 0;
  size_t total = 2 + pre + n1 + n2;
  uint8_t *buf = malloc(total);
  if (!buf) return 1;
  buf[0] = (uint8_t)type;
  buf[1] = 0;
  if (first) {
    for (int b = 0; b < 4; b++) buf[2 + b] = (uint8_t)(n1 >> (8 * b));
    protobuf_c_message_pack(first, buf + 6);
  }
  protobuf_c_message_pack(m, buf + 2 + pre + n1);
  char out[4096];
  snprintf(out, sizeof out, "%s/%s.%s.seed", dir, base, what);
  FILE *f = fopen(out, "wb");
  int rc = !f || fwrite(buf, 1, total, f) != total;
  if (f && fclose(f)) rc = 1;
  if (rc) fprintf(stderr, "fuzz_proto: cannot write %s: %s\n", out, strerror(errno));
  free(buf);
  return rc;
}

/* Seeds of every type from one .fbk program. 0 on success. */
static int make_seeds(const char *dir, const char *path) {
  char *src = read_file(path);
  if (!src) {
    fprintf(stderr, "fuzz_proto: cannot read %s: %s\n", path, strerror(errno));
    return 1;
  }
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  fb_diags d;
  fb_diags_init(&d);
  fb_program *prog = NULL;
  if (fb_program_parse(path, src, &prog, &d)) {
    char *msg = fb_diags_render(path, src, &d);
    fprintf(stderr, "fuzz_proto: %s does not parse:\n%s", path, msg ? msg : "");
    free(msg);
    fb_diags_free(&d);
    free(src);
    return 1;
  }
  fbp_arena a;
  fbp_arena_init(&a);
  int rc = 0, nk = fb_program_nkernels(prog), nf = fb_program_nfields(prog);

  /* the source, with a ${NAME} the params fill in */
  Fusebox__V1__Source s = FUSEBOX__V1__SOURCE__INIT;
  Fusebox__V1__Source__ParamsEntry pe = FUSEBOX__V1__SOURCE__PARAMS_ENTRY__INIT, *pes[1] = {&pe};
  size_t sl = strlen(src);
  s.text = fbp_alloc(&a, sl + 32);
  if (!s.text) return 1;
  snprintf(s.text, sl + 32, "// ${NOTE}\n%s", src);
  s.filename = (char *)base;
  pe.key = "NOTE";
  pe.value = "a seed";
  s.params = pes;
  s.n_params = 1;
  rc |= write_seed(dir, base, "describe", T_SOURCE, NULL, &s.base);

  Fusebox__V1__CreateSessionRequest cl = FUSEBOX__V1__CREATE_SESSION_REQUEST__INIT;
  Fusebox__V1__CreateSessionRequest cs = FUSEBOX__V1__CREATE_SESSION_REQUEST__INIT;
  Fusebox__V1__SessionOptions opt = FUSEBOX__V1__SESSION_OPTIONS__INIT;
  opt.mode = "async";
  opt.backend = "cpu";
  cl.options = &opt;
  cl.layout = fbp_layout_to_pb(&a, fb_program_layout(prog));
  cs.source = &s;
  rc |= !cl.layout || write_seed(dir, base, "create-layout", T_CREATE, NULL, &cl.base);
  rc |= write_seed(dir, base, "create-source", T_CREATE, NULL, &cs.base);

  /* kernels as IR, and as the source's instances (field parameters bound
   * to the program's first fields) */
  Fusebox__V1__RegisterKernelsRequest ir = FUSEBOX__V1__REGISTER_KERNELS_REQUEST__INIT;
  Fusebox__V1__RegisterKernelsRequest rs = FUSEBOX__V1__REGISTER_KERNELS_REQUEST__INIT;
  ir.session_id = rs.session_id = "0123456789abcdef";
  ir.kernels = fbp_alloc(&a, sizeof *ir.kernels * (size_t)(nk + 1));
  rs.instances = fbp_alloc(&a, sizeof *rs.instances * (size_t)(nk + 1));
  rs.source = &s;
  for (int i = 0; i < nk && ir.kernels && rs.instances; i++) {
    const fb_lang_kernel *lk = fb_program_kernel(prog, i);
    Fusebox__V1__KernelInstance *ki = fbp_alloc(&a, sizeof *ki);
    char **fields = fbp_alloc(&a, sizeof *fields * (size_t)(lk->nfield_params + 1));
    if (!ki || !fields || (lk->nfield_params && !nf)) continue;
    fusebox__v1__kernel_instance__init(ki);
    ki->kernel = (char *)lk->name;
    for (int j = 0; j < lk->nfield_params; j++)
      fields[j] = (char *)fb_program_field(prog, j % nf)->name;
    ki->fields = fields;
    ki->n_fields = (size_t)lk->nfield_params;
    rs.instances[rs.n_instances++] = ki;
    fb_kernel *k = NULL;
    if (fb_program_instantiate(prog, lk->name, (const char *const *)fields, lk->nfield_params, &k,
                               &d) == 0) {
      Fusebox__V1__Kernel *m = fbp_kernel_to_pb(&a, k);
      if (m) ir.kernels[ir.n_kernels++] = m;
    }
  }
  rc |= write_seed(dir, base, "register-ir", T_REGISTER, &cl.base, &ir.base);
  rc |= write_seed(dir, base, "register-source", T_REGISTER, &cl.base, &rs.base);

  /* launches of every kernel with zero arguments of its types */
  Fusebox__V1__SessionRequest sr = FUSEBOX__V1__SESSION_REQUEST__INIT;
  sr.session_id = "0123456789abcdef";
  sr.launches = fbp_alloc(&a, sizeof *sr.launches * (size_t)(nk + 1));
  for (int i = 0; i < nk && sr.launches; i++) {
    const fb_lang_kernel *lk = fb_program_kernel(prog, i);
    Fusebox__V1__Launch *l = fbp_alloc(&a, sizeof *l);
    Fusebox__V1__Value **args = fbp_alloc(&a, sizeof *args * (size_t)(lk->nparams + 1));
    if (!l || !args) break;
    fusebox__v1__launch__init(l);
    l->kernel = i;
    for (int j = 0; j < lk->nparams; j++) {
      if (lk->params[j].is_field) continue;
      Fusebox__V1__Value *v = fbp_alloc(&a, sizeof *v);
      if (!v) break;
      fb_value x;
      memset(&x, 0, sizeof x);
      x.type = lk->params[j].type;
      fbp_value_to_pb(v, x);
      args[l->n_args++] = v;
    }
    l->args = args;
    sr.launches[sr.n_launches++] = l;
  }
  sr.flush = 1;
  sr.sync = 7;
  rc |= write_seed(dir, base, "session", T_SESSION, NULL, &sr.base);

  fbp_arena_free(&a);
  fb_program_free(prog);
  fb_diags_free(&d);
  free(src);
  return rc;
}

/* Seeds of the messages that carry no program. */
static int make_small_seeds(const char *dir) {
  int rc = 0;
  Grpc__Health__V1__HealthCheckRequest h = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  h.service = "fusebox.v1.Fusebox";
  rc |= write_seed(dir, "any", "health", T_HEALTH, NULL, &h.base);
  Fusebox__V1__InfoRequest in = FUSEBOX__V1__INFO_REQUEST__INIT;
  rc |= write_seed(dir, "any", "info", T_INFO, NULL, &in.base);
  Fusebox__V1__StatsRequest st = FUSEBOX__V1__STATS_REQUEST__INIT;
  rc |= write_seed(dir, "any", "stats", T_STATS, NULL, &st.base);
  Fusebox__V1__CloseSessionRequest cl = FUSEBOX__V1__CLOSE_SESSION_REQUEST__INIT;
  cl.session_id = "0123456789abcdef";
  rc |= write_seed(dir, "any", "close", T_CLOSE, NULL, &cl.base);
  Fusebox__V1__CancelRequest ca = FUSEBOX__V1__CANCEL_REQUEST__INIT;
  ca.session_id = "0123456789abcdef";
  ca.through_launch = 12;
  rc |= write_seed(dir, "any", "cancel", T_CANCEL, NULL, &ca.base);
  Fusebox__V1__ReadFieldRequest rf = FUSEBOX__V1__READ_FIELD_REQUEST__INIT;
  rf.session_id = "0123456789abcdef";
  rf.field = 1;
  rf.chunk_bytes = 4096;
  rf.active = 1;
  rc |= write_seed(dir, "any", "read", T_READ, NULL, &rf.base);
  /* a chunk as Fusebox peers write it (data last), and one with its
   * session id after the data (the full parser's case) */
  static const char data[] = "0123456789abcdef0123456789abcdef";
  Fusebox__V1__FieldChunk ch = FUSEBOX__V1__FIELD_CHUNK__INIT;
  ch.session_id = "0123456789abcdef";
  ch.field = 2;
  ch.offset = 64;
  ch.total_bytes = 4096;
  ch.data.data = (uint8_t *)data;
  ch.data.len = sizeof data - 1;
  rc |= write_seed(dir, "any", "chunk", T_CHUNK, NULL, &ch.base);
  uint8_t buf[256];
  size_t n = 0;
  buf[n++] = T_CHUNK;
  buf[n++] = 0x5c; /* slices cut somewhere */
  size_t hn = fbp_chunk_header(buf + n, NULL, 3, 0, 32, sizeof data - 1);
  n += hn;
  memcpy(buf + n, data, sizeof data - 1);
  n += sizeof data - 1;
  buf[n++] = 0x0a; /* field 1, length-delimited */
  buf[n++] = 4;
  memcpy(buf + n, "abcd", 4);
  n += 4;
  char out[4096];
  snprintf(out, sizeof out, "%s/any.chunk-id-last.seed", dir);
  FILE *f = fopen(out, "wb");
  if (!f || fwrite(buf, 1, n, f) != n || fclose(f)) {
    fprintf(stderr, "fuzz_proto: cannot write %s: %s\n", out, strerror(errno));
    rc = 1;
  }
  return rc;
}

/* `fuzz_proto --make-seeds DIR FILE.fbk...` writes the seeds and exits; any
 * other command line is libFuzzer's. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  if (*argc >= 2 && strcmp((*argv)[1], "--make-seeds") == 0) {
    if (*argc < 4) {
      fprintf(stderr, "usage: %s --make-seeds DIR FILE.fbk...\n", (*argv)[0]);
      exit(2);
    }
    int bad = make_small_seeds((*argv)[2]);
    for (int i = 3; i < *argc; i++) bad |= make_seeds((*argv)[2], (*argv)[i]);
    exit(bad ? 1 : 0);
  }
  return 0;
}
