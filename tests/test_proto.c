/* proto/convert.c: IR <-> protobuf round trips (every layout and kernel of
 * tests/ir, through packed bytes and back, printing identically),
 * refusal of structurally broken messages with a message that names the
 * problem, the hand-written launch and field-chunk encodings against
 * protobuf-c's own packers and unpackers, values bit for bit, and the
 * FB_E* <-> gRPC status mapping. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/convert.h"
#include "proto/wire.h"
#include "tests/support/support.h"

/* ---------------------------------------------------------------- helpers */

/* Pack m with protobuf-c and unpack it again: what the wire delivers. */
static void *wire(const ProtobufCMessage *m, const ProtobufCMessageDescriptor *d) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  ck_assert_ptr_nonnull(buf);
  ck_assert_uint_eq(protobuf_c_message_pack(m, buf), n);
  void *back = protobuf_c_message_unpack(d, NULL, n, buf);
  free(buf);
  ck_assert_ptr_nonnull(back);
  return back;
}

static fb_layout *layout_round_trip(const fb_layout *l) {
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Layout *m = fbp_layout_to_pb(&a, l);
  ck_assert_ptr_nonnull(m);
  Fusebox__V1__Layout *w = wire(&m->base, &fusebox__v1__layout__descriptor);
  fb_layout *back = NULL;
  char err[512] = "";
  int rc = fbp_layout_from_pb(w, &back, err, sizeof err);
  ck_assert_msg(rc == 0, "layout from protobuf: %s", err);
  protobuf_c_message_free_unpacked(&w->base, NULL);
  fbp_arena_free(&a);
  return back;
}

static fb_kernel *kernel_round_trip(const fb_kernel *k, const fb_layout *l) {
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Kernel *m = fbp_kernel_to_pb(&a, k);
  ck_assert_ptr_nonnull(m);
  Fusebox__V1__Kernel *w = wire(&m->base, &fusebox__v1__kernel__descriptor);
  fb_kernel *back = NULL;
  char err[512] = "";
  int rc = fbp_kernel_from_pb(w, l, &back, err, sizeof err);
  ck_assert_msg(rc == 0, "kernel %s from protobuf: %s", k->name, err);
  protobuf_c_message_free_unpacked(&w->base, NULL);
  fbp_arena_free(&a);
  return back;
}

static void assert_same_layout(const fb_layout *a, const fb_layout *b) {
  char *pa = fb_layout_print(a), *pb = fb_layout_print(b);
  ck_assert_str_eq(pa, pb);
  ck_assert_int_eq(a->nnodes, b->nnodes);
  ck_assert_uint_eq(a->root_bytes, b->root_bytes);
  ck_assert_uint_eq(fb_layout_hash(a), fb_layout_hash(b));
  free(pa);
  free(pb);
}

static void assert_same_kernel(const fb_kernel *a, const fb_kernel *b) {
  ck_assert_int_eq(a->nstmts, b->nstmts);
  ck_assert_int_eq(a->nblocks, b->nblocks);
  ck_assert(fb_kernel_equal(a, b));
  ck_assert_uint_eq(fb_kernel_hash(a), fb_kernel_hash(b));
  char *pa = fb_kernel_print(a), *pb = fb_kernel_print(b);
  ck_assert_str_eq(pa, pb);
  free(pa);
  free(pb);
  /* statement by statement, immediates bit for bit (dead ones too) */
  for (int i = 0; i < a->nstmts; i++) {
    const fb_stmt *x = &a->stmts[i], *y = &b->stmts[i];
    ck_assert_int_eq(x->op, y->op);
    ck_assert_int_eq(x->type, y->type);
    ck_assert_int_eq(x->nargs, y->nargs);
    ck_assert_int_eq(x->snode, y->snode);
    for (int k = 0; k < x->nargs; k++) ck_assert_int_eq(x->args[k], y->args[k]);
    ck_assert(x->imm.u == y->imm.u);
    ck_assert_int_eq(x->body, y->body);
    ck_assert_int_eq(x->orelse, y->orelse);
  }
}

/* ---------------------------------------------------------------- round trips */

START_TEST(ir_files_round_trip) {
  DIR *dir = opendir(fbt_path("ir"));
  ck_assert_ptr_nonnull(dir);
  int files = 0, kernels = 0;
  struct dirent *e;
  while ((e = readdir(dir))) {
    size_t n = strlen(e->d_name);
    if (n < 4 || strcmp(e->d_name + n - 3, ".ir") != 0) continue;
    char rel[512];
    snprintf(rel, sizeof rel, "ir/%s", e->d_name);
    char *text = fbt_read_file(fbt_path(rel), NULL);
    ck_assert_ptr_nonnull(text);
    fb_layout *l = NULL;
    fb_kernel **ks = NULL;
    int nk = 0;
    fb_diags d;
    fb_diags_init(&d);
    if (fb_ir_parse(text, &l, &ks, &nk, &d) == 0) {
      fb_layout *l2 = layout_round_trip(l);
      assert_same_layout(l, l2);
      for (int i = 0; i < nk; i++) {
        fb_kernel *k2 = kernel_round_trip(ks[i], l2);
        assert_same_kernel(ks[i], k2);
        ck_assert_ptr_eq(k2->layout, l2);
        fb_kernel_free(k2);
        fb_kernel_free(ks[i]);
        kernels++;
      }
      free(ks);
      fb_layout_free(l);
      fb_layout_free(l2);
      files++;
    }
    fb_diags_free(&d);
    free(text);
  }
  closedir(dir);
  ck_assert_int_ge(files, 5);
  ck_assert_int_ge(kernels, 10);
}
END_TEST

/* Every SNode kind, names, several axes, a dynamic's chunk. */
START_TEST(layout_kinds_round_trip) {
  fb_layout *l = fb_layout_new();
  int64_t s2[2] = {16, 8}, s1[1] = {64};
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "ij", s2, 0, "grid");
  fb_layout_place(l, d, "a", FB_T_F32);
  fb_layout_place(l, d, "flag", FB_T_BOOL);
  int p = fb_layout_add(l, 0, FB_SN_POINTER, "ij", s2, 0, "blocks");
  int b = fb_layout_add(l, p, FB_SN_BITMASKED, "ij", s2, 0, NULL);
  fb_layout_place(l, b, "rho", FB_T_F64);
  int dy = fb_layout_add(l, 0, FB_SN_DYNAMIC, "k", s1, 16, "list");
  fb_layout_place(l, dy, "px", FB_T_U64);
  fb_layout_place(l, 0, "loss", FB_T_I64);
  char err[256];
  ck_assert_int_eq(fb_layout_finalize(l, err, sizeof err), 0);
  fb_layout *back = layout_round_trip(l);
  assert_same_layout(l, back);
  for (int i = 0; i < l->nnodes; i++) {
    ck_assert_int_eq(l->nodes[i].kind, back->nodes[i].kind);
    ck_assert_int_eq(l->nodes[i].parent, back->nodes[i].parent);
    ck_assert_int_eq(l->nodes[i].chunk, back->nodes[i].chunk);
    ck_assert_uint_eq(l->nodes[i].offset, back->nodes[i].offset);
  }
  fb_layout_free(l);
  fb_layout_free(back);
}
END_TEST

/* ---------------------------------------------------------------- refusals */

static Fusebox__V1__Layout *small_layout_pb(fbp_arena *a) {
  fb_layout *l = fb_layout_new();
  int64_t n = 32;
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  fb_layout_place(l, d, "x", FB_T_F32);
  fb_layout_finalize(l, NULL, 0);
  Fusebox__V1__Layout *m = fbp_layout_to_pb(a, l);
  fb_layout_free(l);
  return m;
}

static void expect_layout_refused(Fusebox__V1__Layout *m, const char *needle) {
  fb_layout *l = (fb_layout *)1;
  char err[512] = "";
  ck_assert_int_eq(fbp_layout_from_pb(m, &l, err, sizeof err), FB_EINVAL);
  ck_assert_ptr_null(l);
  ck_assert_msg(strstr(err, needle) != NULL, "'%s' does not mention '%s'", err, needle);
}

START_TEST(layout_refusals) {
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Layout *m = small_layout_pb(&a);
  m->nodes[1]->parent = 2; /* a later node */
  expect_layout_refused(m, "parent 2");
  m = small_layout_pb(&a);
  m->nodes[2]->name = (char *)"";
  expect_layout_refused(m, "needs a name");
  m = small_layout_pb(&a);
  m->nodes[0]->kind = FUSEBOX__V1__SNODE_KIND__SN_DENSE;
  expect_layout_refused(m, "root");
  m = small_layout_pb(&a);
  m->nodes[1]->size[0] = 0;
  expect_layout_refused(m, "malformed");
  m = small_layout_pb(&a);
  m->nodes[1]->kind = 42;
  expect_layout_refused(m, "unknown SNode kind 42");
  m = small_layout_pb(&a);
  m->nodes[2]->type = 99;
  expect_layout_refused(m, "type 99");
  m = small_layout_pb(&a);
  m->n_nodes = 0;
  expect_layout_refused(m, "0 nodes");
  expect_layout_refused(NULL, "0 nodes");
  fbp_arena_free(&a);
}
END_TEST

/* Found by tests/fuzz/fuzz_ir.c: a dynamic SNode on an axis that a container
 * above it already splits (dense(i: 4) > dynamic(i: 16)) was accepted, yet no
 * indices name one of its lists: the verifier let append/length through, the
 * interpreter refused them and generated code would have addressed the wrong
 * list. fb_layout_finalize refuses it, naming both SNodes, directly and
 * through the wire; the same dynamic on a fresh axis is fine. */
START_TEST(dynamic_axis_split_above_refused) {
  for (int fresh = 0; fresh < 2; fresh++) {
    fb_layout *l = fb_layout_new();
    int64_t four = 4, sixteen = 16;
    int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", &four, 0, "rows");
    int dy = fb_layout_add(l, d, FB_SN_DYNAMIC, fresh ? "j" : "i", &sixteen, 4, "bag");
    ck_assert_int_ge(dy, 0);
    ck_assert_int_ge(fb_layout_place(l, dy, "v", FB_T_I32), 0);
    char err[512] = "";
    int rc = fb_layout_finalize(l, err, sizeof err);
    fbp_arena a;
    fbp_arena_init(&a);
    Fusebox__V1__Layout *m = fbp_layout_to_pb(&a, l);
    ck_assert_ptr_nonnull(m);
    if (fresh) {
      ck_assert_msg(rc == 0, "finalize: %s", err);
      fb_layout *back = NULL;
      ck_assert_int_eq(fbp_layout_from_pb(m, &back, err, sizeof err), 0);
      fb_layout_free(back);
    } else {
      ck_assert_int_eq(rc, FB_EINVAL);
      ck_assert_msg(strstr(err, "dynamic SNode 2 bag splits axis i, already split above it by "
                                "SNode 1") != NULL,
                    "message: %s", err);
      expect_layout_refused(m, "already split above it");
    }
    fbp_arena_free(&a);
    fb_layout_free(l);
  }
}
END_TEST

/* A kernel x[i] = f32(i) over a range, in protobuf form. */
static Fusebox__V1__Kernel *small_kernel_pb(fbp_arena *a, fb_layout **lout) {
  fb_layout *l = fb_layout_new();
  int64_t n = 32;
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  int x = fb_layout_place(l, d, "x", FB_T_F32);
  fb_layout_finalize(l, NULL, 0);
  fb_kernel *k = fb_kernel_new(l, "k", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int lo = fb_b_const_i32(&b, 0), hi = fb_b_const_i32(&b, 32);
  int loop = fb_b_range_for(&b, lo, hi, 1);
  int saved = fb_b_enter(&b, k->stmts[loop].body);
  int i = fb_b_loop_index(&b, loop, 0);
  fb_b_store(&b, x, &i, 1, fb_b_cast(&b, FB_T_F32, i));
  fb_b_leave(&b, saved);
  Fusebox__V1__Kernel *m = fbp_kernel_to_pb(a, k);
  fb_kernel_free(k);
  *lout = l;
  return m;
}

static void expect_kernel_refused(Fusebox__V1__Kernel *m, const fb_layout *l, const char *needle) {
  fb_kernel *k = (fb_kernel *)1;
  char err[512] = "";
  ck_assert_int_eq(fbp_kernel_from_pb(m, l, &k, err, sizeof err), FB_EINVAL);
  ck_assert_ptr_null(k);
  ck_assert_msg(strstr(err, needle) != NULL, "'%s' does not mention '%s'", err, needle);
}

START_TEST(kernel_refusals) {
  fbp_arena a;
  fbp_arena_init(&a);
  fb_layout *l;
  Fusebox__V1__Kernel *m = small_kernel_pb(&a, &l);
  fb_kernel *ok = NULL;
  ck_assert_int_eq(fbp_kernel_from_pb(m, l, &ok, NULL, 0), 0);
  ck_assert_int_eq(fb_verify(ok, NULL), 0);
  fb_kernel_free(ok);
  m->stmts[1]->op = (char *)"frobnicate";
  expect_kernel_refused(m, l, "unknown op 'frobnicate'");
  m->stmts[1]->op = (char *)"const";
  m->stmts[2]->body = 7;
  expect_kernel_refused(m, l, "block ids 7");
  m->stmts[2]->body = 1;
  m->blocks[1]->ids[0] = 100;
  expect_kernel_refused(m, l, "statement 100");
  m->blocks[1]->ids[0] = 3;
  m->stmts[0]->n_args = FB_MAX_ARGS + 1;
  expect_kernel_refused(m, l, "operand count");
  m->stmts[0]->n_args = 0;
  m->stmts[0]->type = 9;
  expect_kernel_refused(m, l, "type 9");
  m->stmts[0]->type = FUSEBOX__V1__SCALAR_TYPE__T_I32;
  m->n_blocks = 0;
  expect_kernel_refused(m, l, "at least one block");
  m->n_blocks = 2;
  m->name = (char *)"";
  expect_kernel_refused(m, l, "no name");
  m->name = (char *)"k";
  Fusebox__V1__ScalarType bad[1] = {FUSEBOX__V1__SCALAR_TYPE__T_VOID};
  m->params = bad;
  m->n_params = 1;
  expect_kernel_refused(m, l, "parameter 0");
  fb_layout_free(l);
  fbp_arena_free(&a);
}
END_TEST

/* Structure that converts but breaks the IR rules is the verifier's. */
START_TEST(kernel_semantics_left_to_verifier) {
  fbp_arena a;
  fbp_arena_init(&a);
  fb_layout *l;
  Fusebox__V1__Kernel *m = small_kernel_pb(&a, &l);
  m->stmts[5]->args[0] = 4; /* the store's index is now the f32 cast */
  fb_kernel *k = NULL;
  ck_assert_int_eq(fbp_kernel_from_pb(m, l, &k, NULL, 0), 0);
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_verify(k, &d), FB_EVERIFY);
  ck_assert_int_gt(d.n, 0);
  fb_diags_free(&d);
  fb_kernel_free(k);
  fb_layout_free(l);
  fbp_arena_free(&a);
}
END_TEST

/* ---------------------------------------------------------------- values */

static fb_value f64_bits(uint64_t bits) {
  fb_value v = fb_value_f64(0);
  v.v.u = bits;
  return v;
}

START_TEST(values_bit_exact) {
  fb_value vs[] = {fb_value_bool(1),         fb_value_i32(-7),
                   fb_value_i32(INT32_MIN),  fb_value_i64(INT64_MIN),
                   fb_value_u32(UINT32_MAX), fb_value_u64(UINT64_MAX),
                   fb_value_f32(-0.0f),      fb_value_f32(1e-45f),
                   fb_value_f64(-0.0),       f64_bits(0x7ff8000000000123ull),
                   fb_value_f64(INFINITY),   fb_value_i64(0)};
  for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
    Fusebox__V1__Value m;
    fbp_value_to_pb(&m, vs[i]);
    Fusebox__V1__Value *w = wire(&m.base, &fusebox__v1__value__descriptor);
    fb_value back;
    ck_assert_int_eq(fbp_value_from_pb(w, &back), 0);
    ck_assert_int_eq(back.type, vs[i].type);
    ck_assert_msg(back.v.u == vs[i].v.u, "value %zu: %llx became %llx", i,
                  (unsigned long long)vs[i].v.u, (unsigned long long)back.v.u);
    protobuf_c_message_free_unpacked(&w->base, NULL);
  }
  Fusebox__V1__Value bad = FUSEBOX__V1__VALUE__INIT;
  fb_value out;
  ck_assert_int_eq(fbp_value_from_pb(&bad, &out), FB_EINVAL); /* void */
  bad.type = 12;
  ck_assert_int_eq(fbp_value_from_pb(&bad, &out), FB_EINVAL);
}
END_TEST

/* ---------------------------------------------------------------- launch batches */

START_TEST(launch_encoding_matches_protobuf_c) {
  fbp_buf b;
  memset(&b, 0, sizeof b);
  fb_value args[5] = {fb_value_i32(-3), fb_value_u64(1ull << 63), fb_value_f32(2.5f),
                      fb_value_f64(-0.0), fb_value_bool(1)};
  for (int k = 0; k < 300; k++) fbp_launch_append(&b, k % 7, args, k % 6);
  fbp_launch_append(&b, -1, NULL, 0);
  fbp_session_tail(&b, "0123456789abcdef0123456789abcdef", 1, 99);
  ck_assert_int_eq(b.oom, 0);
  Fusebox__V1__SessionRequest *m = fusebox__v1__session_request__unpack(NULL, b.n, b.p);
  ck_assert_ptr_nonnull(m);
  ck_assert_uint_eq(m->n_launches, 301);
  ck_assert_str_eq(m->session_id, "0123456789abcdef0123456789abcdef");
  ck_assert(m->flush);
  ck_assert_uint_eq(m->sync, 99);
  for (int k = 0; k < 300; k++) {
    const Fusebox__V1__Launch *l = m->launches[k];
    ck_assert_int_eq(l->kernel, k % 7);
    ck_assert_uint_eq(l->n_args, (size_t)(k % 6));
    for (size_t a = 0; a < l->n_args; a++) {
      fb_value v;
      ck_assert_int_eq(fbp_value_from_pb(l->args[a], &v), 0);
      ck_assert_int_eq(v.type, args[a].type);
      ck_assert(v.v.u == args[a].v.u);
    }
  }
  ck_assert_int_eq(m->launches[300]->kernel, -1);
  /* without the session id (packed first by protobuf-c) the bytes agree */
  char *id = m->session_id;
  m->session_id = (char *)protobuf_c_empty_string;
  fbp_buf b2;
  memset(&b2, 0, sizeof b2);
  for (int k = 0; k < 300; k++) fbp_launch_append(&b2, k % 7, args, k % 6);
  fbp_launch_append(&b2, -1, NULL, 0);
  fbp_session_tail(&b2, NULL, 1, 99);
  size_t n = fusebox__v1__session_request__get_packed_size(m);
  uint8_t *p = malloc(n);
  fusebox__v1__session_request__pack(m, p);
  ck_assert_uint_eq(n, b2.n);
  ck_assert_int_eq(memcmp(p, b2.p, n), 0);
  free(p);
  m->session_id = id;
  fusebox__v1__session_request__free_unpacked(m, NULL);
  fbp_buf_free(&b);
  fbp_buf_free(&b2);
}
END_TEST

/* ---------------------------------------------------------------- field chunks */

START_TEST(chunk_encoding_both_ways) {
  uint8_t data[300];
  for (int i = 0; i < 300; i++) data[i] = (uint8_t)(i * 7);
  uint8_t msg[FBP_CHUNK_HEADER_MAX + 300];
  size_t hn = fbp_chunk_header(msg, "0123456789abcdef0123456789abcdef", 5, 1 << 20, 3u << 28, 300);
  ck_assert_uint_gt(hn, 0);
  memcpy(msg + hn, data, 300);
  Fusebox__V1__FieldChunk *m = fusebox__v1__field_chunk__unpack(NULL, hn + 300, msg);
  ck_assert_ptr_nonnull(m);
  ck_assert_str_eq(m->session_id, "0123456789abcdef0123456789abcdef");
  ck_assert_int_eq(m->field, 5);
  ck_assert_uint_eq(m->offset, 1 << 20);
  ck_assert_uint_eq(m->total_bytes, 3ull << 28);
  ck_assert_uint_eq(m->data.len, 300);
  ck_assert_int_eq(memcmp(m->data.data, data, 300), 0);
  /* protobuf-c's packing parsed by ours */
  size_t n = fusebox__v1__field_chunk__get_packed_size(m);
  uint8_t *p = malloc(n);
  fusebox__v1__field_chunk__pack(m, p);
  fbp_chunk c;
  ck_assert_int_eq(fbp_chunk_parse(p, n, &c, NULL, 0), 0);
  ck_assert_uint_eq(c.session_id_len, 32);
  ck_assert_int_eq(memcmp(c.session_id, m->session_id, 32), 0);
  ck_assert_int_eq(c.field, 5);
  ck_assert_uint_eq(c.offset, 1 << 20);
  ck_assert_uint_eq(c.total_bytes, 3ull << 28);
  ck_assert_uint_eq(c.len, 300);
  ck_assert_int_eq(memcmp(c.data, data, 300), 0);
  free(p);
  fusebox__v1__field_chunk__free_unpacked(m, NULL);
  ck_assert_uint_eq(fbp_chunk_header(msg,
                                     "this id is far too long to be any session id at all, "
                                     "really far too long",
                                     0, 0, 0, 0),
                    0);
}
END_TEST

/* Bytes that are not a FieldChunk: both parsers refuse them. */
START_TEST(chunk_malformed) {
  static const struct {
    const char *b;
    size_t n;
  } bad[] = {
      {"\x0a\x7f", 2},             /* field 1, length past the end */
      {"\x10", 1},                 /* field 2 varint, truncated */
      {"\x2a\x05\x01\x02", 4},     /* data longer than the message */
      {"\x08\x01", 2},             /* field 1 as a varint: wrong wire type */
      {"\x00\x01", 2},             /* field number 0 */
      {"\x33\x01", 2},             /* a group */
      {"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11}, /* varint too long */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fbp_chunk c;
    char err[128] = "";
    ck_assert_msg(fbp_chunk_parse((const uint8_t *)bad[i].b, bad[i].n, &c, err, sizeof err) ==
                      FB_EINVAL,
                  "case %zu accepted", i);
    ck_assert(strstr(err, "malformed FieldChunk") != NULL);
    ck_assert_msg(fusebox__v1__field_chunk__unpack(NULL, bad[i].n, (const uint8_t *)bad[i].b) ==
                      NULL,
                  "protobuf-c accepted case %zu", i);
  }
  /* unknown fields are skipped by both */
  static const uint8_t unknown[] = {0x48, 0x05, 0x10, 0x03}; /* field 9 = 5, field 2 = 3 */
  fbp_chunk c;
  ck_assert_int_eq(fbp_chunk_parse(unknown, sizeof unknown, &c, NULL, 0), 0);
  ck_assert_int_eq(c.field, 3);
}
END_TEST

/* ---------------------------------------------------------------- status codes */

START_TEST(status_mapping) {
  ck_assert_int_eq(fbp_status_of_code(FB_OK), FBP_GRPC_OK);
  ck_assert_int_eq(fbp_status_of_code(FB_EVERIFY), FBP_GRPC_INVALID_ARGUMENT);
  ck_assert_int_eq(fbp_status_of_code(FB_EINVAL), FBP_GRPC_INVALID_ARGUMENT);
  ck_assert_int_eq(fbp_status_of_code(FB_ENOENT), FBP_GRPC_NOT_FOUND);
  ck_assert_int_eq(fbp_status_of_code(FB_EQUOTA), FBP_GRPC_RESOURCE_EXHAUSTED);
  ck_assert_int_eq(fbp_status_of_code(FB_EBOUNDS), FBP_GRPC_OUT_OF_RANGE);
  ck_assert_int_eq(fbp_status_of_code(FB_EINTERNAL), FBP_GRPC_INTERNAL);
  ck_assert_int_eq(fbp_status_of_code(FB_ENOMEM), FBP_GRPC_RESOURCE_EXHAUSTED);
  ck_assert_int_eq(fbp_status_of_code(FB_EPARSE), FBP_GRPC_INVALID_ARGUMENT);
  ck_assert_int_eq(fbp_status_of_code(FB_ETYPE), FBP_GRPC_INVALID_ARGUMENT);
  ck_assert_int_eq(fbp_status_of_code(FB_ECOMPILE), FBP_GRPC_INTERNAL);
  ck_assert_int_eq(fbp_status_of_code(FB_EDEVICE), FBP_GRPC_INTERNAL);
  ck_assert_int_eq(fbp_status_of_code(FB_EUNSUPPORTED), FBP_GRPC_UNIMPLEMENTED);
  ck_assert_int_eq(fbp_status_of_code(FB_EIO), FBP_GRPC_UNAVAILABLE);
  ck_assert_int_eq(fbp_status_of_code(-99), FBP_GRPC_UNKNOWN);
  ck_assert_int_eq(fbp_status_of_code(FB_ECANCELLED), FBP_GRPC_CANCELLED);
  ck_assert_int_eq(fbp_status_of_code(FB_ETIMEOUT), FBP_GRPC_DEADLINE_EXCEEDED);
  for (int code = FB_EINVAL; code >= FB_ELAST; code--) {
    int st = fbp_status_of_code(code);
    ck_assert_int_ne(st, FBP_GRPC_OK);
    ck_assert_int_ne(fbp_code_of_status(st), FB_OK);
    /* every code of include/fusebox/errors.h has its own message */
    ck_assert_str_ne(fb_strerror(code), "unknown error");
    if (code < FB_EINVAL) ck_assert_str_ne(fb_strerror(code), fb_strerror(code + 1));
  }
  ck_assert_str_eq(fb_strerror(FB_OK), "success");
  ck_assert_str_eq(fb_strerror(FB_EBOUNDS), "index out of bounds");
  ck_assert_str_eq(fb_strerror(-99), "unknown error");
  ck_assert_int_eq(fbp_code_of_status(FBP_GRPC_UNAVAILABLE), FB_EIO);
}
END_TEST

START_TEST(arena_reuse) {
  fbp_arena a;
  fbp_arena_init(&a);
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 10000; i++) {
      uint64_t *p = fbp_alloc(&a, 24);
      ck_assert_ptr_nonnull(p);
      ck_assert_uint_eq(p[0] | p[1] | p[2], 0);
      p[0] = p[1] = p[2] = ~0ull;
    }
    void *big = fbp_alloc(&a, 1 << 20);
    ck_assert_ptr_nonnull(big);
    fbp_arena_reset(&a);
  }
  ck_assert_str_eq(fbp_strdup(&a, "abc"), "abc");
  fbp_arena_free(&a);
}
END_TEST

/* The limit: allocations past it fail and say so, held and the count
 * callback follow every block, and protobuf-c's unpack fails cleanly under
 * it (a batch of empty launches decodes to tens of times its bytes). */
static int64_t counted;
static void count_cb(void *ctx, int64_t d) {
  ck_assert_ptr_eq(ctx, &counted);
  counted += d;
}

START_TEST(arena_limit) {
  fbp_arena a;
  fbp_arena_init(&a);
  fbp_arena_count(&a, count_cb, &counted);
  a.limit = 256 << 10;
  size_t got = 0;
  while (fbp_alloc(&a, 1000)) got += 1000;
  ck_assert(a.over);
  ck_assert_uint_le(a.held, a.limit);
  ck_assert_uint_ge(got, (size_t)200 << 10); /* the last block shrinks to fit */
  ck_assert_int_eq(counted, (int64_t)a.held);
  ck_assert_ptr_null(fbp_alloc(&a, (size_t)1 << 20));
  ck_assert_ptr_null(fbp_alloc(&a, SIZE_MAX - 4));
  fbp_arena_reset(&a);
  ck_assert_int_eq(counted, (int64_t)a.held);
  fbp_arena_free(&a);
  ck_assert_int_eq(counted, 0);
  ck_assert_uint_eq(a.held, 0);

  /* 200,000 empty launches: 400 KB on the wire */
  fbp_buf b;
  memset(&b, 0, sizeof b);
  for (int k = 0; k < 200000; k++) fbp_buf_reserve(&b, 2), b.p[b.n++] = 0x12, b.p[b.n++] = 0;
  fbp_session_tail(&b, "s", 0, 1);
  fbp_arena_init(&a);
  a.limit = 4 * b.n;
  ck_assert_ptr_null(
      protobuf_c_message_unpack(&fusebox__v1__session_request__descriptor, &a.pb, b.n, b.p));
  ck_assert(a.over);
  ck_assert_uint_le(a.held, a.limit);
  fbp_arena_free(&a);
  fbp_arena_init(&a); /* unlimited: the same bytes decode, to far more */
  Fusebox__V1__SessionRequest *m = (Fusebox__V1__SessionRequest *)protobuf_c_message_unpack(
      &fusebox__v1__session_request__descriptor, &a.pb, b.n, b.p);
  ck_assert_ptr_nonnull(m);
  ck_assert_uint_eq(m->n_launches, 200000);
  ck_assert_uint_gt(a.held, 16 * b.n);
  fbp_arena_free(&a);
  fbp_buf_free(&b);
}
END_TEST

/* What legitimate large requests decode to, against FBP_DECODE_FACTOR:
 * launch batches as the client encodes them, and kernels of every shape
 * in tests/ir. The factor must leave them a wide margin. */
static double decoded_ratio(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n) {
  fbp_arena a;
  fbp_arena_init(&a);
  ck_assert_ptr_nonnull(protobuf_c_message_unpack(d, &a.pb, n, p));
  double r = (double)a.held / (double)n;
  fbp_arena_free(&a);
  return r;
}

START_TEST(legitimate_decoded_ratio) {
  fb_value args[5] = {fb_value_i32(7), fb_value_u64(1ull << 40), fb_value_f32(2.5f),
                      fb_value_f64(-1.25), fb_value_bool(1)};
  double worst = 0;
  for (int nargs = 0; nargs <= 5; nargs++) {
    fbp_buf b;
    memset(&b, 0, sizeof b);
    while (b.n < ((size_t)4 << 20)) fbp_launch_append(&b, 3, args, nargs);
    fbp_session_tail(&b, "0123456789abcdef0123456789abcdef", 0, 1);
    double r = decoded_ratio(&fusebox__v1__session_request__descriptor, b.p, b.n);
    printf("launch batch of %zu bytes, %d args a launch: decodes to %.1fx\n", b.n, nargs, r);
    fflush(stdout);
    if (r > worst) worst = r;
    fbp_buf_free(&b);
  }
  /* every kernel of tests/ir, many times over in one RegisterKernels */
  DIR *dir = opendir(fbt_path("ir"));
  ck_assert_ptr_nonnull(dir);
  struct dirent *e;
  while ((e = readdir(dir))) {
    size_t n = strlen(e->d_name);
    if (n < 4 || strcmp(e->d_name + n - 3, ".ir") != 0) continue;
    char rel[512];
    snprintf(rel, sizeof rel, "ir/%s", e->d_name);
    char *text = fbt_read_file(fbt_path(rel), NULL);
    fb_layout *l = NULL;
    fb_kernel **ks = NULL;
    int nk = 0;
    fb_diags d;
    fb_diags_init(&d);
    if (text && fb_ir_parse(text, &l, &ks, &nk, &d) == 0 && nk > 0) {
      fbp_arena a;
      fbp_arena_init(&a);
      Fusebox__V1__RegisterKernelsRequest r = FUSEBOX__V1__REGISTER_KERNELS_REQUEST__INIT;
      r.session_id = "0123456789abcdef0123456789abcdef";
      r.n_kernels = 2000;
      r.kernels = fbp_alloc(&a, r.n_kernels * sizeof *r.kernels);
      for (size_t i = 0; i < r.n_kernels; i++) r.kernels[i] = fbp_kernel_to_pb(&a, ks[i % nk]);
      size_t sz = fusebox__v1__register_kernels_request__get_packed_size(&r);
      uint8_t *p = malloc(sz);
      fusebox__v1__register_kernels_request__pack(&r, p);
      double ratio = decoded_ratio(&fusebox__v1__register_kernels_request__descriptor, p, sz);
      printf("RegisterKernels of %zu bytes (%s): decodes to %.1fx\n", sz, e->d_name, ratio);
      fflush(stdout);
      if (ratio > worst) worst = ratio;
      free(p);
      fbp_arena_free(&a);
    }
    for (int i = 0; i < nk; i++) fb_kernel_free(ks[i]);
    free(ks);
    fb_layout_free(l);
    fb_diags_free(&d);
    free(text);
  }
  closedir(dir);
  printf("worst legitimate ratio %.1fx; FBP_DECODE_FACTOR %d\n", worst, FBP_DECODE_FACTOR);
  fflush(stdout);
  ck_assert_double_lt(worst * 2, FBP_DECODE_FACTOR);
}
END_TEST

/* Counters cross the wire field by field, the fusion cost model's, the
 * fallback's and the plan memo's too (fields appended: 16, 17, 18). */
START_TEST(counters_round_trip) {
  fb_counters c = {.launches = 9,
                   .tasks_fused = 4,
                   .tasks_pending = 2,
                   .fuse_refused = 7,
                   .fuse_fallbacks = 3,
                   .plans_reused = 5,
                   .optimizer_s = 0.25};
  Fusebox__V1__Counters m;
  fbp_counters_to_pb(&m, &c);
  Fusebox__V1__Counters *back = wire(&m.base, &fusebox__v1__counters__descriptor);
  fb_counters d;
  fbp_counters_from_pb(back, &d);
  ck_assert_mem_eq(&c, &d, sizeof c);
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(
      &fusebox__v1__counters__descriptor, "fuse_refused");
  ck_assert(f && f->id == 16);
  f = protobuf_c_message_descriptor_get_field_by_name(&fusebox__v1__counters__descriptor,
                                                      "fuse_fallbacks");
  ck_assert(f && f->id == 17);
  f = protobuf_c_message_descriptor_get_field_by_name(&fusebox__v1__counters__descriptor,
                                                      "plans_reused");
  ck_assert(f && f->id == 18);
  protobuf_c_message_free_unpacked(&back->base, NULL);
}
END_TEST

/* FB_COUNTERS (fusebox/counters.h) is the protocol's Counters message:
 * the same names, in field-number order 1, 2, ..., of the same types, and
 * no field the list lacks. The struct and the mapping are generated from
 * the list, so this is what keeps the .proto from drifting. */
#define PB_TYPE_uint64_t PROTOBUF_C_TYPE_UINT64
#define PB_TYPE_double PROTOBUF_C_TYPE_DOUBLE
static const struct {
  const char *name;
  ProtobufCType type;
  int sum;
} counter_list[] = {
#define SUM 1
#define LEVEL 0
#define C_(name, type, kind, unit, meaning) {#name, PB_TYPE_##type, kind},
    FB_COUNTERS(C_)
#undef C_
#undef LEVEL
#undef SUM
};
#define NCOUNTERS ((unsigned)(sizeof counter_list / sizeof counter_list[0]))

START_TEST(counters_list_is_the_protocol) {
  const ProtobufCMessageDescriptor *d = &fusebox__v1__counters__descriptor;
  ck_assert_uint_ge(NCOUNTERS, 18);
  ck_assert_msg(d->n_fields == NCOUNTERS, "Counters has %u fields, FB_COUNTERS %u", d->n_fields,
                NCOUNTERS);
  for (unsigned i = 0; i < NCOUNTERS; i++) {
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(d, counter_list[i].name);
    ck_assert_msg(f != NULL, "FB_COUNTERS has %s, the protocol's Counters does not",
                  counter_list[i].name);
    ck_assert_msg(f->id == i + 1, "%s is field %u of Counters, entry %u of FB_COUNTERS",
                  counter_list[i].name, f->id, i + 1);
    ck_assert_msg(f->type == counter_list[i].type, "%s: its protocol type is not its C type",
                  counter_list[i].name);
  }
}
END_TEST

/* fb_counters_since: each cumulative counter is the difference, flushes
 * included (fusebox bench's own copy once forgot it), each level the later
 * reading. */
START_TEST(counters_since_by_kind) {
  fb_counters a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  int k = 0;
#define C_(name, type, kind, unit, meaning) a.name = (type)(10 + 3 * k), b.name = (type)(k + 1), k++;
  FB_COUNTERS(C_)
#undef C_
  fb_counters d = fb_counters_since(&a, &b);
  ck_assert_uint_eq(d.flushes, a.flushes - b.flushes);
  ck_assert_uint_eq(d.device_bytes, a.device_bytes);
  ck_assert_uint_eq(d.tasks_pending, a.tasks_pending);
  ck_assert_double_eq(d.optimizer_s, a.optimizer_s - b.optimizer_s);
  k = 0;
  int levels = 0;
#define C_(name, type, kind, unit, meaning)                                                    \
  {                                                                                            \
    int sum = counter_list[k++].sum;                                                           \
    levels += !sum;                                                                            \
    ck_assert_msg(d.name == (sum ? a.name - b.name : a.name), "%s: wrong difference", #name);  \
  }
  FB_COUNTERS(C_)
#undef C_
  ck_assert_int_eq(levels, 2); /* device_bytes and tasks_pending */
}
END_TEST

/* Every counter crosses the wire (the list generates both directions). */
START_TEST(every_counter_round_trips) {
  fb_counters c, d;
  memset(&c, 0, sizeof c);
  int k = 0;
#define C_(name, type, kind, unit, meaning) k++, c.name = (type)(1000003 * k) + (type)k / 4;
  FB_COUNTERS(C_)
#undef C_
  Fusebox__V1__Counters m;
  fbp_counters_to_pb(&m, &c);
  Fusebox__V1__Counters *back = wire(&m.base, &fusebox__v1__counters__descriptor);
  fbp_counters_from_pb(back, &d);
#define C_(name, type, kind, unit, meaning)                                                    \
  ck_assert_msg(d.name == c.name && c.name != 0, "%s did not cross the wire", #name);
  FB_COUNTERS(C_)
#undef C_
  protobuf_c_message_free_unpacked(&back->base, NULL);
}
END_TEST

/* fbp_bb_copy (both ends' copy of a chunk's bytes): any range of a message
 * split over several slices, the slices' edges included, and nothing past
 * the end or for n = 0. */
START_TEST(bb_copy_across_slices) {
  const char *parts[] = {"abc", "defg", "h", "ijklm"};
  const char *all = "abcdefghijklm";
  grpc_slice sl[4];
  for (int i = 0; i < 4; i++) sl[i] = grpc_slice_from_copied_string(parts[i]);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, 4);
  for (int i = 0; i < 4; i++) grpc_slice_unref(sl[i]);
  size_t len = strlen(all);
  ck_assert_uint_eq(grpc_byte_buffer_length(bb), len);
  for (size_t from = 0; from <= len; from++) {
    for (size_t n = 0; from + n <= len; n++) {
      uint8_t dst[16];
      memset(dst, '#', sizeof dst);
      fbp_bb_copy(bb, from, dst, n);
      ck_assert_msg(memcmp(dst, all + from, n) == 0, "from %zu, %zu bytes", from, n);
      ck_assert_msg(dst[n] == '#', "from %zu, %zu bytes: wrote past n", from, n);
    }
  }
  uint8_t tail[8];
  memset(tail, '#', sizeof tail);
  fbp_bb_copy(bb, len - 2, tail, 5); /* asks past the end: copies what there is */
  ck_assert(memcmp(tail, "lm###", 5) == 0);
  grpc_slice whole = fbp_bb_slice(bb); /* the four slices as one */
  ck_assert_uint_eq(GRPC_SLICE_LENGTH(whole), len);
  ck_assert(memcmp(GRPC_SLICE_START_PTR(whole), all, len) == 0);
  grpc_slice_unref(whole);
  grpc_byte_buffer_destroy(bb);
  ck_assert_uint_eq(GRPC_SLICE_LENGTH(fbp_bb_slice(NULL)), 0);
}
END_TEST

/* fbp_bb_take_chunk's destination: a buffer, and what it was asked. */
typedef struct take_dst {
  uint8_t buf[64];
  int calls, refuse;
  uint64_t offset;
  size_t len;
  char id[16]; /* the session id as dst saw it */
} take_dst;

static uint8_t *take_to(void *user, const fbp_chunk *ch) {
  take_dst *d = user;
  d->calls++;
  d->offset = ch->offset;
  d->len = ch->len;
  snprintf(d->id, sizeof d->id, "%.*s", (int)ch->session_id_len, ch->session_id);
  ck_assert_ptr_null(ch->data); /* the data may lie in several slices */
  return d->refuse || ch->len > sizeof d->buf ? NULL : d->buf;
}

/* A buffer of the n bytes at p, cut into slices of `cut` bytes. */
static grpc_byte_buffer *bb_cut(const uint8_t *p, size_t n, size_t cut) {
  grpc_slice sl[64];
  size_t k = 0;
  for (size_t at = 0; at < n; at += cut, k++)
    sl[k] = grpc_slice_from_copied_buffer((const char *)p + at, n - at < cut ? n - at : cut);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, k);
  for (size_t i = 0; i < k; i++) grpc_slice_unref(sl[i]);
  return bb;
}

/* Both ends take a received chunk with fbp_bb_take_chunk: the data comes
 * to where the callback says, whatever the slices (header and data split
 * anywhere) and whether the data field comes last (the head alone is
 * parsed) or not (the whole message is); a malformed chunk never reaches
 * the callback, and a refused one is not copied. */
/* The n-byte chunk at msg, cut into slices of every width, taken whole:
 * session id `id` seen by dst, offset `at`, the `len` bytes `data` copied;
 * refused, nothing copied. */
static void take_every_cut(const uint8_t *msg, size_t n, const char *id, uint64_t at,
                           const char *data, size_t len) {
  for (size_t cut = 1; cut <= n; cut++) {
    grpc_byte_buffer *bb = bb_cut(msg, n, cut);
    take_dst d;
    memset(&d, 0, sizeof d);
    fbp_chunk ch;
    char err[128] = "";
    ck_assert_int_eq(fbp_bb_take_chunk(bb, &ch, take_to, &d, err, sizeof err), 0);
    ck_assert_int_eq(d.calls, 1);
    ck_assert_uint_eq(d.offset, at);
    ck_assert_uint_eq(ch.len, len);
    ck_assert_ptr_null(ch.data); /* in the full parse it pointed into a slice now gone */
    ck_assert_str_eq(d.id, id);
    /* the id pointed into a copy now gone (found by tests/fuzz/fuzz_proto.c) */
    ck_assert_ptr_null(ch.session_id);
    ck_assert_uint_eq(ch.session_id_len, 0);
    ck_assert_msg(memcmp(d.buf, data, len) == 0, "cut %zu", cut);
    d.refuse = 1;
    memset(d.buf, 0, sizeof d.buf);
    ck_assert_int_eq(fbp_bb_take_chunk(bb, &ch, take_to, &d, err, sizeof err), FBP_CHUNK_REFUSED);
    ck_assert_int_eq(d.buf[0], 0); /* refused: nothing copied */
    grpc_byte_buffer_destroy(bb);
  }
}

START_TEST(take_chunk_both_paths) {
  const char *data = "0123456789abcdefghij"; /* 20 bytes */
  uint8_t msg[FBP_CHUNK_HEADER_MAX + 32];
  size_t hn = fbp_chunk_header(msg, "sess", 3, 40, 60, 20);
  memcpy(msg + hn, data, 20);
  take_every_cut(msg, hn + 20, "sess", 40, data, 20); /* the data last: the head parse */
  /* the data field first, then the offset: only the full parse takes it */
  uint8_t odd[] = {0x2a, 3, 'x', 'y', 'z', 0x18, 7, 0x0a, 2, 'i', 'd'};
  take_every_cut(odd, sizeof odd, "id", 7, "xyz", 3);
  /* the data's length says more than the message holds */
  uint8_t bad[] = {0x18, 7, 0x2a, 9, 'x', 'y'};
  grpc_byte_buffer *bb = bb_cut(bad, sizeof bad, 2);
  take_dst d;
  memset(&d, 0, sizeof d);
  fbp_chunk ch;
  char err[128] = "";
  ck_assert_int_eq(fbp_bb_take_chunk(bb, &ch, take_to, &d, err, sizeof err), FBP_CHUNK_MALFORMED);
  ck_assert_int_eq(d.calls, 0);
  ck_assert_msg(strstr(err, "malformed FieldChunk") != NULL, "%s", err);
  grpc_byte_buffer_destroy(bb);
}
END_TEST


/* ---------------------------------------------------------------- scanning a SessionRequest */

static uint64_t scan_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64: the same cases every run */
  scan_rng ^= scan_rng << 13;
  scan_rng ^= scan_rng >> 7;
  scan_rng ^= scan_rng << 17;
  return scan_rng;
}

/* fbp_session_scan against protobuf-c's decode of the same bytes: whatever
 * protobuf-c decodes, the scan accepts with the same fields; whatever the
 * scan refuses, protobuf-c refuses. Returns 1 when protobuf-c decoded it. */
static int scan_agrees(const uint8_t *p, size_t n) {
  fbp_session_head h;
  int rc = fbp_session_scan(p, n, &h);
  Fusebox__V1__SessionRequest *m = fusebox__v1__session_request__unpack(NULL, n, p);
  if (m) {
    ck_assert_msg(rc == 0, "protobuf-c decodes %zu bytes the scan refused", n);
    ck_assert_uint_eq(h.n_launches, m->n_launches);
    ck_assert_uint_eq(h.n_tape, m->n_tape);
    ck_assert_uint_eq(h.sync, m->sync);
    ck_assert_int_eq(h.flush, m->flush != 0);
    ck_assert_uint_eq(h.session_id_len, strlen(m->session_id));
    ck_assert(!h.session_id_len || !memcmp(h.session_id, m->session_id, h.session_id_len));
    fusebox__v1__session_request__free_unpacked(m, NULL);
    return 1;
  }
  if (rc) {
    ck_assert_int_eq(rc, FBP_SCAN_MALFORMED);
    ck_assert_uint_eq(h.n_launches + h.n_tape + h.sync + (uint64_t)h.flush, 0);
  }
  return 0;
}

/* A random SessionRequest packed by protobuf-c, with unknown fields of
 * every wire type appended now and then. */
static size_t random_request(uint8_t **out) {
  Fusebox__V1__SessionRequest m = FUSEBOX__V1__SESSION_REQUEST__INIT;
  char id[40];
  size_t idn = rnd() % 3 ? 32 : rnd() % 40;
  for (size_t i = 0; i < idn; i++) id[i] = (char)('a' + rnd() % 26);
  if (idn && rnd() % 8 == 0) id[rnd() % idn] = 0; /* protobuf-c's string ends at a NUL */
  id[idn] = 0;
  m.session_id = id;
  size_t nl = rnd() % 4 ? rnd() % 20 : rnd() % 300, nt = rnd() % 3 ? 0 : rnd() % 5;
  Fusebox__V1__Launch *ls = calloc(nl + 1, sizeof *ls), **lp = calloc(nl + 1, sizeof *lp);
  Fusebox__V1__Value *vs = calloc(nl * 3 + 1, sizeof *vs), **vp = calloc(nl * 3 + 1, sizeof *vp);
  Fusebox__V1__TapeMark *ts = calloc(nt + 1, sizeof *ts), **tp = calloc(nt + 1, sizeof *tp);
  for (size_t i = 0; i < nl; i++) {
    fusebox__v1__launch__init(&ls[i]);
    ls[i].kernel = (int32_t)(rnd() % 9) - 1;
    ls[i].n_args = rnd() % 4;
    ls[i].args = &vp[i * 3];
    for (size_t a = 0; a < ls[i].n_args; a++) {
      fusebox__v1__value__init(&vs[i * 3 + a]);
      vs[i * 3 + a].i = (int64_t)rnd();
      vs[i * 3 + a].f_bits = rnd();
      vp[i * 3 + a] = &vs[i * 3 + a];
    }
    lp[i] = &ls[i];
  }
  for (size_t i = 0; i < nt; i++) {
    fusebox__v1__tape_mark__init(&ts[i]);
    ts[i].at = (uint32_t)(rnd() % (nl + 2));
    ts[i].end = rnd() & 1;
    ts[i].loss = (int32_t)(rnd() % 5);
    tp[i] = &ts[i];
  }
  m.n_launches = nl;
  m.launches = lp;
  m.n_tape = nt;
  m.tape = tp;
  m.flush = rnd() & 1;
  m.sync = rnd() % 3 == 0 ? 0 : rnd() % 2 ? rnd() % 1000 : rnd();
  size_t n = fusebox__v1__session_request__get_packed_size(&m);
  uint8_t *b = malloc(n + 64);
  fusebox__v1__session_request__pack(&m, b);
  if (rnd() % 4 == 0) { /* unknown fields: varint, 64-bit, bytes, 32-bit */
    static const uint8_t unk[] = {0x30, 0x96, 0x01, 0x39, 1, 2, 3, 4, 5, 6, 7, 8,
                                  0x42, 0x03, 'x', 'y', 'z', 0x4d, 9, 9, 9, 9,
                                  0xf8, 0x07, 0x01 /* field 127, varint */};
    memcpy(b + n, unk, sizeof unk);
    n += sizeof unk;
  }
  free(ls);
  free(lp);
  free(vs);
  free(vp);
  free(ts);
  free(tp);
  *out = b;
  return n;
}

START_TEST(session_scan_matches_protobuf_c) {
  int decoded = 0, mutated_decoded = 0;
  for (int k = 0; k < 400; k++) {
    uint8_t *b;
    size_t n = random_request(&b);
    decoded += scan_agrees(b, n);
    /* every truncation of the small ones, a few of the large ones */
    for (size_t cut = 0; cut < n; cut += n < 200 ? 1 : 1 + rnd() % 37) scan_agrees(b, cut);
    /* garbage: a few bytes changed at random */
    for (int t = 0; t < 20; t++) {
      uint8_t *c = malloc(n ? n : 1);
      memcpy(c, b, n);
      for (int f = 0, nf = 1 + (int)(rnd() % 3); n && f < nf; f++) c[rnd() % n] = (uint8_t)rnd();
      mutated_decoded += scan_agrees(c, n);
      free(c);
    }
    free(b);
  }
  ck_assert_int_eq(decoded, 400); /* every message protobuf-c packed decodes */
  ck_assert_int_gt(mutated_decoded, 0); /* some garbage is valid protobuf too */
  for (int k = 0; k < 20000; k++) { /* pure garbage, short */
    uint8_t g[24];
    size_t n = rnd() % sizeof g;
    for (size_t i = 0; i < n; i++) g[i] = (uint8_t)rnd();
    scan_agrees(g, n);
  }
}
END_TEST

/* The refusals by name, each refused by protobuf-c too. */
START_TEST(session_scan_refusals) {
  static const struct {
    const char *what;
    uint8_t b[16];
    size_t n;
  } bad[] = {
      {"field 0", {0x00, 0x00}, 2},
      {"a key that does not end", {0x80}, 1},
      {"a key of six bytes", {0x88, 0x80, 0x80, 0x80, 0x80, 0x00}, 6},
      {"a varint of eleven bytes (sync)", {0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 12},
      {"a varint cut short (flush)", {0x18, 0x80}, 2},
      {"a length past the end", {0x12, 0x05, 0x08, 0x01}, 4},
      {"a length prefix that does not end", {0x0a, 0x80, 0x80}, 3},
      {"a group", {0x1b, 0x1c}, 2},
      {"wire type 7", {0x0f}, 1},
      {"launches as a varint", {0x10, 0x01}, 2},
      {"the session id as 32 bits", {0x0d, 1, 2, 3, 4}, 5},
      {"sync in 64 bits", {0x21, 1, 2, 3, 4, 5, 6, 7, 8}, 9},
      {"tape as a varint", {0x28, 0x01}, 2},
      {"64 bits cut short", {0x31, 1, 2, 3}, 4},
      {"32 bits cut short", {0x35, 1, 2}, 3},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fbp_session_head h;
    ck_assert_msg(fbp_session_scan(bad[i].b, bad[i].n, &h) == FBP_SCAN_MALFORMED, "%s accepted",
                  bad[i].what);
    Fusebox__V1__SessionRequest *m = fusebox__v1__session_request__unpack(NULL, bad[i].n, bad[i].b);
    ck_assert_msg(m == NULL, "protobuf-c decodes %s", bad[i].what);
  }
  /* and the routing fields of a message as a client sends it */
  static const uint8_t ok[] = {0x0a, 0x03, 'a', 0x00, 'b', 0x12, 0x00, 0x12, 0x02, 0x08, 0x01,
                               0x2a, 0x00, 0x18, 0x02, 0x20, 0xff, 0xff, 0xff, 0xff, 0xff,
                               0xff, 0xff, 0xff, 0xff, 0x01};
  fbp_session_head h;
  ck_assert_int_eq(fbp_session_scan(ok, sizeof ok, &h), 0);
  ck_assert_uint_eq(h.session_id_len, 1); /* up to the NUL */
  ck_assert_uint_eq(h.n_launches, 2);
  ck_assert_uint_eq(h.n_tape, 1);
  ck_assert_int_eq(h.flush, 1);
  ck_assert(h.sync == UINT64_MAX);
  ck_assert_int_eq(scan_agrees(ok, sizeof ok), 1);
  ck_assert_int_eq(fbp_session_scan(NULL, 0, &h), 0); /* the empty message */
  /* protobuf-c takes a bool in any wire type: set when a byte of the value
     (a length prefix included) has one of its low seven bits set */
  static const struct {
    uint8_t b[8];
    size_t n;
    int flush;
  } bools[] = {{{0x1a, 0x01, 0x00}, 3, 1}, {{0x1a, 0x00}, 2, 0}, {{0x1d, 0x80, 0x80, 0x80, 0x80}, 5, 0},
               {{0x1d, 0x80, 0x80, 0x80, 0x81}, 5, 1}, {{0x18, 0x80, 0x00}, 3, 0}};
  for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
    ck_assert_int_eq(fbp_session_scan(bools[i].b, bools[i].n, &h), 0);
    ck_assert_int_eq(h.flush, bools[i].flush);
    ck_assert_int_eq(scan_agrees(bools[i].b, bools[i].n), 1);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("proto");
  TCase *tc = tcase_create("convert");
  tcase_add_test(tc, ir_files_round_trip);
  tcase_add_test(tc, layout_kinds_round_trip);
  tcase_add_test(tc, layout_refusals);
  tcase_add_test(tc, dynamic_axis_split_above_refused);
  tcase_add_test(tc, kernel_refusals);
  tcase_add_test(tc, kernel_semantics_left_to_verifier);
  tcase_add_test(tc, values_bit_exact);
  tcase_add_test(tc, launch_encoding_matches_protobuf_c);
  tcase_add_test(tc, chunk_encoding_both_ways);
  tcase_add_test(tc, chunk_malformed);
  tcase_add_test(tc, status_mapping);
  tcase_add_test(tc, arena_reuse);
  tcase_add_test(tc, arena_limit);
  tcase_add_test(tc, legitimate_decoded_ratio);
  tcase_add_test(tc, counters_round_trip);
  tcase_add_test(tc, counters_list_is_the_protocol);
  tcase_add_test(tc, counters_since_by_kind);
  tcase_add_test(tc, every_counter_round_trips);
  tcase_add_test(tc, bb_copy_across_slices);
  tcase_add_test(tc, take_chunk_both_paths);
  tcase_add_test(tc, session_scan_matches_protobuf_c);
  tcase_add_test(tc, session_scan_refusals);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
