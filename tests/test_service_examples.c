/* Every example session (the JSON files under examples/) run twice: in
 * process through the engine, and through fuseboxd with libfusebox (the
 * program parsed on the client, its IR sent to the server, launches
 * pipelined). Both runs must agree exactly: the same launches fail with the
 * same codes, every field reads back byte for byte the same (or fails the
 * same way), and the session's checks hold on what the server returned.
 * The server runs each example twice, in the session's mode and in async
 * mode (the optimizer must not change results). Both sides use one CPU
 * thread. The one exception to "byte for byte" is a float place that a
 * kernel adds to atomically (a sum over iterations, `volume[] += ...`):
 * the order of such a sum is unspecified (codegen/reduce.c lets LLVM
 * reassociate the accumulator, and whether it vectorises the loop, and
 * how wide, depends on the task's whole body, which fusion changes), so
 * those places compare value by value within the tolerance that
 * `same_across_modes` uses (docs/sessions.md). The server runs on a unix
 * socket here (test_service.c covers TCP). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fusebox/client.h"
#include "fusebox/engine.h"
#include "fusebox/lang.h"
#include "tests/support/support.h"

#define MAX_FAILS 64

/* ---------------------------------------------------------------- the two runners */

typedef struct run {
  fb_program *p;
  /* in process */
  fb_engine *e;
  fb_session *s;
  const fb_kernel *kptr[64];
  int kid[64], nk;
  /* per place: a kernel adds to it with a float atomic add or sub */
  unsigned char fsum[1024];
  /* remote */
  fb_remote *r;
  char what[128]; /* example and server mode, for messages */
  /* launches that failed: seq and code, on each side */
  uint64_t seq;
  uint64_t lseq[MAX_FAILS], rseq[MAX_FAILS];
  int lcode[MAX_FAILS], rcode[MAX_FAILS];
  int nl, nr;
} run;

/* The float places k sums into atomically (the order of such sums is
 * unspecified, see the top of the file). */
static void mark_float_sums(run *x, const fb_kernel *k) {
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *s = &k->stmts[i];
    int sum = s->op == FB_OP_ATOMIC_ADD || s->op == FB_OP_ATOMIC_SUB ||
              s->op == FB_OP_ATOMIC_ADD_NA || s->op == FB_OP_ATOMIC_SUB_NA;
    if (sum && s->snode >= 0 && s->snode < (int)sizeof x->fsum) x->fsum[s->snode] = 1;
  }
}

/* a and b (n values of type t) agree value by value within the
 * `same_across_modes` default tolerance: |a - b| <= 1e-6 + 1e-5 max(|a|, |b|). */
static int floats_close(fb_type t, const unsigned char *a, const unsigned char *b, size_t n) {
  size_t esz = fb_type_size(t);
  for (size_t i = 0; i < n; i++) {
    double u = fb_value_as_f64(fb_value_load(t, a + i * esz));
    double v = fb_value_as_f64(fb_value_load(t, b + i * esz));
    if (!(fabs(u - v) <= 1e-6 + 1e-5 * fmax(fabs(u), fabs(v)))) return 0;
  }
  return 1;
}

static int local_kernel(run *x, const char *name, const char *const *b, int nb) {
  fb_kernel *k = NULL;
  int rc = fb_program_instantiate(x->p, name, b, nb, &k, NULL);
  ck_assert_msg(rc == 0, "instantiate %s: %s", name, fb_strerror(rc));
  for (int i = 0; i < x->nk; i++)
    if (x->kptr[i] == k) return x->kid[i];
  mark_float_sums(x, k);
  int id = fb_session_add_kernel(x->s, k);
  ck_assert_msg(id >= 0, "add %s: %s", name, fb_session_errmsg(x->s));
  ck_assert_int_lt(x->nk, 64);
  x->kptr[x->nk] = k;
  x->kid[x->nk++] = id;
  return id;
}

/* One launch step, on both sides. */
static void launch(run *x, json_t *step) {
  const char *name = json_string_value(json_object_get(step, "launch"));
  json_t *args = json_object_get(step, "args");
  int ki = fb_program_find_kernel(x->p, name);
  ck_assert_msg(ki >= 0, "no kernel %s", name);
  const fb_lang_kernel *lk = fb_program_kernel(x->p, ki);
  const char *bind[8];
  fb_value vals[16];
  int nb = 0, nv = 0;
  ck_assert_int_eq(json_array_size(args), (size_t)lk->nparams);
  for (int i = 0; i < lk->nparams; i++) {
    json_t *a = json_array_get(args, (size_t)i);
    if (lk->params[i].is_field) {
      ck_assert(json_is_string(a));
      bind[nb++] = json_string_value(a);
    } else {
      ck_assert(json_is_number(a));
      fb_value v = json_is_integer(a) ? fb_value_i64(json_integer_value(a))
                                      : fb_value_f64(json_real_value(a));
      vals[nv++] = fb_value_cast(v, lk->params[i].type);
    }
  }
  int lid = local_kernel(x, name, bind, nb);
  int rid = fb_remote_kernel(x->r, name, bind, nb);
  ck_assert_msg(rid >= 0, "remote kernel %s: %s", name, fb_remote_errmsg(x->r));
  x->seq++;
  int rc = fb_launch(x->s, lid, vals, nv, NULL);
  if (rc && x->nl < MAX_FAILS) {
    x->lseq[x->nl] = x->seq;
    x->lcode[x->nl++] = rc;
  }
  int64_t seq = fb_remote_launch(x->r, rid, vals, nv);
  ck_assert_msg(seq == (int64_t)x->seq, "remote launch: %s", fb_remote_errmsg(x->r));
}

static void remote_sync(run *x) {
  fb_sync_result res;
  fb_remote_sync(x->r, &res);
  ck_assert_uint_eq(res.seq, x->seq);
  for (int i = 0; i < res.nerrors && x->nr < MAX_FAILS; i++) {
    x->rseq[x->nr] = res.errors[i].seq;
    x->rcode[x->nr++] = res.errors[i].code;
  }
}

static void steps(run *x, json_t *list) {
  size_t i;
  json_t *st;
  json_array_foreach(list, i, st) {
    if (json_object_get(st, "launch")) {
      launch(x, st);
    } else if (json_object_get(st, "repeat")) {
      json_int_t n = json_integer_value(json_object_get(st, "repeat"));
      for (json_int_t k = 0; k < n; k++) steps(x, json_object_get(st, "do"));
    } else if (json_object_get(st, "save")) {
      /* a snapshot reads a field: the comparison at the end reads them all */
    } else if (json_object_get(st, "sync") || json_object_get(st, "flush")) {
      ck_assert_int_eq(fb_sync(x->s), 0);
      remote_sync(x);
    } else {
      ck_abort_msg("step %zu: not a step this test runs", i);
    }
  }
}

/* ---------------------------------------------------------------- comparing */

/* Every component of every field: the same bytes, or the same refusal.
 * Returns how many components both sides could read. */
static int compare_fields(run *x) {
  int readable = 0;
  for (int f = 0; f < fb_program_nfields(x->p); f++) {
    const fb_lang_field *lf = fb_program_field(x->p, f);
    for (int c = 0; c < lf->ncomp; c++) {
      size_t bytes = 0;
      ck_assert_int_eq(fb_remote_field_bytes(x->r, lf->places[c], &bytes), 0);
      void *a = malloc(bytes), *b = malloc(bytes);
      int la = fb_field_read(x->s, lf->places[c], a, bytes);
      int rb = fb_remote_field_read(x->r, lf->places[c], b, bytes);
      ck_assert_msg(la == rb, "field %s: in process %s, through the server %s (%s)", lf->name,
                    fb_strerror(la), fb_strerror(rb), fb_remote_errmsg(x->r));
      if (!la) {
        int place = lf->places[c];
        int sum = fb_type_is_float(lf->type) && place >= 0 && place < (int)sizeof x->fsum &&
                  x->fsum[place];
        if (sum)
          ck_assert_msg(floats_close(lf->type, a, b, bytes / fb_type_size(lf->type)),
                        "%s: field %s[%d] (a float sum) differs past the tolerance", x->what,
                        lf->name, c);
        else
          ck_assert_msg(memcmp(a, b, bytes) == 0, "%s: field %s[%d] differs", x->what, lf->name,
                        c);
        readable++;
      }
      free(a);
      free(b);
    }
  }
  return readable;
}

static double field_sum(run *x, const char *name, int *ok) {
  int f = fb_program_find_field(x->p, name);
  ck_assert_msg(f >= 0, "no field %s", name);
  const fb_lang_field *lf = fb_program_field(x->p, f);
  double sum = 0;
  *ok = 1;
  for (int c = 0; c < lf->ncomp && *ok; c++) {
    size_t bytes = 0;
    fb_remote_field_bytes(x->r, lf->places[c], &bytes);
    size_t esz = fb_type_size(lf->type), n = bytes / esz;
    unsigned char *buf = malloc(bytes);
    *ok = fb_remote_field_read(x->r, lf->places[c], buf, bytes) == 0;
    for (size_t i = 0; *ok && i < n; i++)
      sum += fb_value_as_f64(fb_value_load(lf->type, buf + i * esz));
    free(buf);
  }
  return sum;
}

/* The session's checks on the server's data; 0 when a field was unreadable. */
static int checks(run *x, json_t *list, const char *name) {
  size_t i;
  json_t *ck;
  int all = 1;
  json_array_foreach(list, i, ck) {
    const char *field = json_string_value(json_object_get(ck, "read"));
    if (!field) continue;
    json_t *sum = json_object_get(ck, "sum"), *eq = json_object_get(ck, "equals");
    json_t *rt = json_object_get(ck, "rtol");
    if (!sum && !eq) continue;
    int ok;
    double got = field_sum(x, field, &ok);
    if (!ok) {
      all = 0;
      continue;
    }
    double want = json_number_value(sum ? sum : eq);
    double rtol = rt ? json_number_value(rt) : sum ? 1e-6 : 0;
    ck_assert_msg(fabs(got - want) <= rtol * fabs(want) + (rtol ? 1e-9 : 0),
                  "%s: check %zu on %s: got %.9g, want %.9g (rtol %g)", name, i, field, got, want,
                  rtol);
  }
  return all;
}

/* ---------------------------------------------------------------- one example */

static fb_daemon D;
static fb_client *C;

/* Run one example with the server session in remote_mode (NULL: the
 * session's own mode); the in-process run always uses the session's mode. */
static int run_example(const char *json_path, const char *name, const char *remote_mode) {
  json_error_t je;
  json_t *root = json_load_file(json_path, 0, &je);
  ck_assert_msg(root != NULL, "%s: %s", json_path, je.text);
  char rel[512];
  snprintf(rel, sizeof rel, "../examples/%s", json_string_value(json_object_get(root, "program")));
  char *src = fbt_read_file(fbt_path(rel), NULL);
  ck_assert_ptr_nonnull(src);
  run x;
  memset(&x, 0, sizeof x);
  snprintf(x.what, sizeof x.what, "%s, server in %s mode", name, remote_mode ? remote_mode : "its");
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse(rel, src, &x.p, &d), 0);
  fb_diags_free(&d);
  json_t *sess = json_object_get(root, "session");
  const char *mode = json_string_value(json_object_get(sess, "mode"));
  uint64_t seed = (uint64_t)json_integer_value(json_object_get(sess, "seed"));
  char err[512];
  fb_engine_config ec;
  memset(&ec, 0, sizeof ec);
  ec.backend = "cpu";
  ec.cpu_threads = 1;
  ck_assert_msg(fb_engine_create(&ec, &x.e, err, sizeof err) == 0, "%s", err);
  fb_session_config sc;
  memset(&sc, 0, sizeof sc);
  sc.mode = mode ? mode : "sync";
  sc.seed = seed;
  ck_assert_msg(fb_session_create(x.e, &sc, fb_program_layout(x.p), &x.s, err, sizeof err) == 0,
                "%s", err);
  fb_remote_options o;
  fb_remote_options_init(&o);
  o.mode = remote_mode ? remote_mode : mode;
  o.seed = seed;
  ck_assert_msg(fb_remote_open_program(C, &o, x.p, &x.r) == 0, "%s", fb_client_errmsg(C));
  steps(&x, json_object_get(root, "setup"));
  steps(&x, json_object_get(root, "step"));
  ck_assert_int_eq(fb_sync(x.s), 0);
  remote_sync(&x);
  ck_assert_msg(x.nl == x.nr, "%s (%s): %d launches failed in process, %d through the server", name,
                o.mode ? o.mode : "sync", x.nl, x.nr);
  for (int i = 0; i < x.nl; i++) {
    ck_assert_uint_eq(x.lseq[i], x.rseq[i]);
    ck_assert_int_eq(x.lcode[i], x.rcode[i]);
  }
  int readable = compare_fields(&x);
  int all = checks(&x, json_object_get(root, "checks"), name) && x.nl == 0;
  ck_assert_int_eq(fb_remote_close(x.r), 0);
  fb_session_destroy(x.s);
  fb_engine_destroy(x.e);
  fb_program_free(x.p);
  free(src);
  json_decref(root);
  ck_assert_int_gt(readable, 0);
  return all;
}

START_TEST(examples_through_server) {
  DIR *dir = opendir(fbt_path("../examples"));
  ck_assert_ptr_nonnull(dir);
  int ran = 0, passed = 0;
  for (struct dirent *e; (e = readdir(dir));) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0) continue;
    char rel[512];
    snprintf(rel, sizeof rel, "../examples/%s", e->d_name);
    passed += run_example(fbt_path(rel), e->d_name, NULL);
    /* async mode on the server must give the same results as the engine's sync */
    passed += run_example(fbt_path(rel), e->d_name, "async");
    ran += 2;
  }
  closedir(dir);
  ck_assert_int_ge(ran, 14);
  ck_assert_int_eq(passed, ran); /* every check of every example, in both modes */
  fb_server_stats s;
  ck_assert_int_eq(fb_client_stats(C, &s), 0);
  ck_assert_uint_eq(s.sessions_created, (uint64_t)ran);
  ck_assert_uint_eq(s.sessions_active, 0);
  fb_server_stats_free(&s);
}
END_TEST

static void setup(void) {
  char listen[128], err[512];
  snprintf(listen, sizeof listen, "unix:/tmp/fusebox-examples-%d.sock", (int)getpid());
  static char exe[1024];
  const char *b = getenv("FB_BUILD_DIR");
  snprintf(exe, sizeof exe, "%s/server/fuseboxd", b ? b : "build");
  const char *args[] = {"--log-level", "warn", "--cpu-threads", "1", NULL};
  ck_assert_msg(fb_daemon_start(exe, listen, args, &D, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(fb_client_connect(D.address, NULL, &C, err, sizeof err), 0);
}

static void teardown(void) {
  fb_client_close(C);
  int st = -1;
  fb_daemon_stop(&D, 30, &st);
  ck_assert_msg(st == 0, "fuseboxd exited with status %d", st);
}

int main(void) {
  Suite *s = suite_create("service_examples");
  TCase *tc = tcase_create("examples");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, examples_through_server);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
