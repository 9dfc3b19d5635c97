/* The CUDA backend's host side through the public engine API, against the
 * fake driver of tests/fakecuda (FB_CUDA_LIBRARY names it): backend
 * selection and the messages without a driver or a GPU, one stream per
 * session, modules cached by IR, launch shapes, managed session memory,
 * the memory limit, and driver failures: a plain launch error fails one
 * launch, a sticky one ends the sessions of the context, marks the engine
 * unhealthy and, once they are closed, the context is made again.
 *
 * The fake runs no kernel, so nothing here checks what kernels compute on
 * a GPU: that is the CUDA half of the other suites (FB_TEST_BACKEND=cuda,
 * run where a GPU is present). */
#include <dlfcn.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fusebox/engine.h"
#include "fusebox/lang.h"
#include "runtime/cuda.h"
#include "runtime/runtime.h"
#include "support.h"

static struct {
  void (*reset)(void);
  void (*fail_launch)(long, int);
  void (*fail_alloc)(long);
  void (*stats)(fakecuda_stats *);
} fake;

static void load_fake(void) {
  const char *path = getenv("FB_CUDA_LIBRARY");
  ck_assert_msg(path && *path, "FB_CUDA_LIBRARY must name libfakecuda.so");
  void *h = dlopen(path, RTLD_NOW); /* the same handle the engine gets */
  ck_assert_msg(h != NULL, "%s", dlerror());
  *(void **)&fake.reset = dlsym(h, "fakecuda_reset");
  *(void **)&fake.fail_launch = dlsym(h, "fakecuda_fail_launch");
  *(void **)&fake.fail_alloc = dlsym(h, "fakecuda_fail_alloc");
  *(void **)&fake.stats = dlsym(h, "fakecuda_get_stats");
  ck_assert(fake.reset && fake.fail_launch && fake.fail_alloc && fake.stats);
}

static fakecuda_stats stats(void) {
  fakecuda_stats st;
  fake.stats(&st);
  return st;
}

static const char *SRC = "layout {\n"
                         "  dense(i: 1000) { place a: f32, b: f32 }\n"
                         "  place total: f32\n"
                         "}\n"
                         "kernel scale(k: f32) {\n"
                         "  for i in a { b[i] = a[i] * k }\n"
                         "}\n"
                         "kernel both(n: i32) {\n"
                         "  total[] = 0.0\n"
                         "  for i in 0 .. n { b[i] = 1.0 }\n"
                         "}\n"
                         "kernel acc(k: f32) {\n"
                         "  for i in a { b[i] += a[i] * k }\n"
                         "}\n";

typedef struct env {
  fb_engine *e;
  fb_program *p;
  fb_kernel *scale, *both;
} env;

static fb_kernel *inst(fb_program *p, const char *name) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(p, name, NULL, 0, &k, &d);
  fb_diags_free(&d);
  ck_assert_msg(rc == 0, "instantiate %s", name);
  return k;
}

static void env_open(env *x, const char *backend) {
  fake.reset();
  char err[512] = "";
  fb_engine_config cfg = {backend, 1, 1};
  int rc = fb_engine_create(&cfg, &x->e, err, sizeof err);
  ck_assert_msg(rc == 0, "engine: %s", err);
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse("cuda.fbk", SRC, &x->p, &d), 0);
  fb_diags_free(&d);
  x->scale = inst(x->p, "scale");
  x->both = inst(x->p, "both");
}

static void env_close(env *x) {
  fb_program_free(x->p); /* and its kernels */
  fb_engine_destroy(x->e);
}

static fb_session *open_session(env *x, const char *mode, uint64_t limit) {
  fb_session_config sc = {.mode = mode, .seed = 1, .memory_limit = limit};
  fb_session *s = NULL;
  char err[512] = "";
  int rc = fb_session_create(x->e, &sc, fb_program_layout(x->p), &s, err, sizeof err);
  ck_assert_msg(rc == 0, "session: %s", err);
  return s;
}

static int add(fb_session *s, const fb_kernel *k) {
  int id = fb_session_add_kernel(s, k);
  ck_assert_msg(id >= 0, "add %s: %s", k->name, fb_session_errmsg(s));
  return id;
}

static int field_id(env *x, const char *name) {
  return fb_program_field(x->p, fb_program_find_field(x->p, name))->places[0];
}

/* ---------------------------------------------------------------- selection */

START_TEST(backend_cuda_on_fake_driver) {
  env x;
  env_open(&x, "cuda");
  ck_assert_str_eq(fb_engine_backend(x.e), "cuda");
  const char *dev = fb_engine_device(x.e);
  ck_assert_msg(strstr(dev, "Fusebox fake GPU") && strstr(dev, "sm_90") && strstr(dev, "132 SMs"),
                "device: %s", dev);
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 1);
  env_close(&x);
  env_open(&x, "auto"); /* auto takes the GPU when there is one */
  ck_assert_str_eq(fb_engine_backend(x.e), "cuda");
  env_close(&x);
}
END_TEST

/* The engine's one route to a device: its table by name (runtime.h). */
START_TEST(device_tables_by_name) {
  const fb_device_ops *cpu = fb_device_ops_for("cpu"), *cuda = fb_device_ops_for("cuda");
  ck_assert(cpu && cuda && cpu != cuda);
  ck_assert_str_eq(cpu->backend, "cpu");
  ck_assert_int_eq(cpu->queued, 0);
  ck_assert_str_eq(cuda->backend, "cuda");
  ck_assert_int_eq(cuda->queued, 1);
  ck_assert_ptr_null(fb_device_ops_for("auto")); /* a choice, not a device */
  ck_assert_ptr_null(fb_device_ops_for("gpu"));
  ck_assert_ptr_null(fb_device_ops_for(NULL));
}
END_TEST

/* Each device's code cache through its table: the CPU's takes a bound,
 * the GPU's stays unbounded (its modules live as long as their context). */
START_TEST(device_code_caches_through_the_table) {
  fake.reset();
  const fb_device_ops *ops[2] = {fb_device_ops_for("cpu"), fb_device_ops_for("cuda")};
  for (int i = 0; i < 2; i++) {
    void *dev = NULL;
    char err[512] = "";
    ck_assert_msg(ops[i]->open(1, &dev, err, sizeof err) == 0, "%s: %s", ops[i]->backend, err);
    fb_code_cache_info info;
    memset(&info, 0xff, sizeof info);
    ops[i]->code_cache(dev, &info);
    ck_assert_uint_eq(info.entries, 0);
    ck_assert_uint_eq(info.bytes, 0);
    ck_assert_uint_eq(info.limit, 0);
    ops[i]->set_code_cache_bytes(dev, 1 << 20);
    ops[i]->code_cache(dev, &info);
    ck_assert_uint_eq(info.limit, i == 0 ? 1 << 20 : 0);
    ops[i]->close(dev);
  }
}
END_TEST

/* The engine's code cache is its device's: on CUDA the loaded modules
 * (no bound, whatever is asked), on the CPU the JIT's (bounded). */
START_TEST(engine_code_cache_is_the_devices) {
  const char *backends[2] = {"cuda", "cpu"};
  for (int i = 0; i < 2; i++) {
    env x;
    env_open(&x, backends[i]);
    fb_code_cache_usage u;
    fb_engine_set_code_cache_bytes(x.e, 1 << 20);
    fb_engine_code_cache(x.e, &u);
    ck_assert_uint_eq(u.entries, 0);
    ck_assert_uint_eq(u.bytes, 0);
    ck_assert_uint_eq(u.limit, i == 0 ? 0 : 1 << 20);
    long mods = stats().modules_loaded;
    fb_session *s = open_session(&x, "sync", 0);
    add(s, x.scale);
    add(s, x.both);
    fb_engine_code_cache(x.e, &u);
    ck_assert_uint_ge(u.entries, 3); /* scale: 1 task; both: a serial and a loop */
    ck_assert_uint_gt(u.bytes, 0);
    /* the modules loaded are the entries on CUDA; the CPU loads none */
    ck_assert_int_eq(stats().modules_loaded - mods, i == 0 ? (long)u.entries : 0);
    fb_session_destroy(s);
    env_close(&x);
  }
}
END_TEST

START_TEST(no_driver_is_a_clear_error) {
  char *saved = strdup(getenv("FB_CUDA_LIBRARY"));
  setenv("FB_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
  fb_engine *e = NULL;
  char err[512] = "";
  fb_engine_config cuda = {"cuda", 1, 1};
  ck_assert_int_eq(fb_engine_create(&cuda, &e, err, sizeof err), FB_EDEVICE);
  ck_assert_ptr_null(e);
  ck_assert_msg(strstr(err, "cannot load the CUDA driver /nonexistent/libcuda.so.1") &&
                    strstr(err, "--backend cpu"),
                "message: %s", err);
  fb_engine_config autob = {"auto", 1, 1};
  ck_assert_int_eq(fb_engine_create(&autob, &e, err, sizeof err), 0);
  ck_assert_str_eq(fb_engine_backend(e), "cpu"); /* auto falls back to the CPU */
  ck_assert_ptr_nonnull(strstr(fb_engine_device(e), "CPU"));
  fb_engine_destroy(e);
  setenv("FB_CUDA_LIBRARY", saved, 1);
  free(saved);
}
END_TEST

START_TEST(no_gpu_is_a_clear_error) {
  setenv("FAKECUDA_NO_DEVICE", "1", 1);
  fake.reset();
  fb_engine *e = NULL;
  char err[512] = "";
  fb_engine_config cuda = {"cuda", 1, 1};
  ck_assert_int_eq(fb_engine_create(&cuda, &e, err, sizeof err), FB_EDEVICE);
  ck_assert_msg(strstr(err, "finds no GPU"), "message: %s", err);
  fb_engine_config autob = {"auto", 1, 1};
  ck_assert_int_eq(fb_engine_create(&autob, &e, err, sizeof err), 0);
  ck_assert_str_eq(fb_engine_backend(e), "cpu");
  fb_engine_destroy(e);
  unsetenv("FAKECUDA_NO_DEVICE");
  fake.reset();
}
END_TEST

/* fuseboxd --backend cuda without a driver stops at once, saying why. */
START_TEST(server_refuses_cuda_without_driver) {
  const char *bdir = getenv("FB_BUILD_DIR");
  ck_assert_ptr_nonnull(bdir);
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "FB_CUDA_LIBRARY=/nonexistent/libcuda.so.1 '%s/server/fuseboxd' "
           "--backend cuda --listen unix:/tmp/fb_test_cuda_%d.sock 2>&1",
           bdir, (int)getpid());
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  char out[4096] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  int st = pclose(p);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0, "fuseboxd exited %d: %s", st, out);
  ck_assert_msg(strstr(out, "cannot load the CUDA driver /nonexistent/libcuda.so.1"), "output: %s",
                out);
}
END_TEST

/* ---------------------------------------------------------------- sessions */

/* ---------------------------------------------------------------- code store
 * PTX in a code store (fusebox/codestore.h, docs/code-cache.md): a fresh
 * engine finds every task's PTX there and compiles nothing; the driver
 * still loads each module; PTX with a NUL in it is compiled anew. */
typedef struct mem_entry {
  char *target, *ir;
  size_t irlen;
  uint8_t *code;
  size_t len;
} mem_entry;

typedef struct mem_store {
  mem_entry v[64];
  int n, gets, hits, puts;
  int poison; /* hand out PTX with a NUL inside */
} mem_store;

static int mem_get(void *user, uint64_t partition, const char *target, const char *ir,
                   size_t irlen, uint8_t **code, size_t *len) {
  mem_store *m = user;
  (void)partition;
  m->gets++;
  for (int i = 0; i < m->n; i++)
    if (!strcmp(m->v[i].target, target) && m->v[i].irlen == irlen &&
        !memcmp(m->v[i].ir, ir, irlen)) {
      *code = malloc(m->v[i].len + 1);
      memcpy(*code, m->v[i].code, m->v[i].len);
      if (m->poison && m->v[i].len > 10) (*code)[5] = 0;
      *len = m->v[i].len;
      m->hits++;
      return 1;
    }
  return 0;
}

static void mem_put(void *user, uint64_t partition, const char *target, const char *ir,
                    size_t irlen, const uint8_t *code, size_t len) {
  mem_store *m = user;
  (void)partition;
  m->puts++;
  if (m->n == 64) return;
  mem_entry *e = &m->v[m->n++];
  e->target = strdup(target);
  e->ir = malloc(irlen);
  memcpy(e->ir, ir, irlen);
  e->irlen = irlen;
  e->code = malloc(len);
  memcpy(e->code, code, len);
  e->len = len;
}

static void mem_free(mem_store *m) {
  for (int i = 0; i < m->n; i++) {
    free(m->v[i].target);
    free(m->v[i].ir);
    free(m->v[i].code);
  }
}

/* A fresh engine on the store: add scale and both, launch scale; the
 * session's counters. */
static fb_counters store_round(mem_store *m) {
  env x;
  env_open(&x, "cuda");
  fb_code_store st = {mem_get, mem_put, m};
  ck_assert_int_eq(fb_engine_set_code_store(x.e, &st), 0);
  fb_session *s = open_session(&x, "sync", 0);
  long mods = stats().modules_loaded;
  int ks = add(s, x.scale);
  add(s, x.both);
  ck_assert_int_ge(stats().modules_loaded - mods, 3); /* the driver loads every module */
  fb_value k = fb_value_f32(2.0f);
  ck_assert_int_eq(fb_launch(s, ks, &k, 1, NULL), 0);
  fb_counters c;
  fb_session_counters(s, &c);
  fb_session_destroy(s);
  env_close(&x);
  return c;
}

START_TEST(ptx_from_a_code_store) {
  mem_store m;
  memset(&m, 0, sizeof m);
  fb_counters c = store_round(&m);
  ck_assert_uint_ge(c.tasks_compiled, 3);
  ck_assert_int_eq(m.puts, (int)c.tasks_compiled);
  ck_assert_int_eq(m.hits, 0);
  ck_assert_ptr_nonnull(strstr(m.v[0].target, "back end cuda"));
  ck_assert_ptr_nonnull(strstr(m.v[0].target, "sm sm_90"));
  ck_assert_ptr_nonnull(strstr((const char *)m.v[0].code, ".entry fb_body"));
  int compiled = (int)c.tasks_compiled;
  /* what the store keeps is PTX that ptxas assembles (where there is one:
   * /usr/local/cuda's or PATH's; this machine has no GPU to load it on) */
  const char *ptxas = access("/usr/local/cuda/bin/ptxas", X_OK) == 0 ? "/usr/local/cuda/bin/ptxas"
                      : system("command -v ptxas >/dev/null 2>&1") == 0 ? "ptxas"
                                                                       : NULL;
  for (int i = 0; ptxas && i < m.n; i++) {
    char path[] = "/tmp/fb_store_ptx_XXXXXX", cmd[512];
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, m.v[i].code, m.v[i].len), (ssize_t)m.v[i].len);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s --gpu-name sm_90 -o /dev/null %s", ptxas, path);
    int st = system(cmd);
    unlink(path);
    ck_assert_msg(st == 0, "ptxas refused stored PTX %d", i);
  }
  c = store_round(&m); /* a restart: nothing compiled */
  ck_assert_uint_eq(c.tasks_compiled, 0);
  ck_assert_uint_eq(c.cache_hits, (uint64_t)compiled);
  ck_assert_int_eq(m.hits, compiled);
  m.poison = 1; /* PTX that is not text: compiled again */
  c = store_round(&m);
  ck_assert_uint_eq(c.tasks_compiled, (uint64_t)compiled);
  mem_free(&m);
}
END_TEST

START_TEST(stream_modules_and_launch_shapes) {
  env x;
  env_open(&x, "cuda");
  fakecuda_stats st0 = stats();
  fb_session *s = open_session(&x, "sync", 0);
  ck_assert_int_eq(stats().streams_created - st0.streams_created, 1);
  ck_assert_uint_gt(stats().bytes_in_use, st0.bytes_in_use); /* fields in device memory */
  int ks = add(s, x.scale), kb = add(s, x.both);
  long mods = stats().modules_loaded;
  ck_assert_int_ge(mods - st0.modules_loaded, 3); /* scale: 1 task; both: a serial and a loop */

  fb_value k = fb_value_f32(2.0f);
  long l0 = stats().launches;
  ck_assert_int_eq(fb_launch(s, ks, &k, 1, NULL), 0);
  ck_assert_int_eq(stats().launches - l0, 1);
  ck_assert_uint_eq(stats().last_grid, (1000 + 127) / 128); /* 1000 cells, 128 per block */
  ck_assert_uint_eq(stats().last_block, 128);
  fb_value n = fb_value_i32(10);
  ck_assert_int_eq(fb_launch(s, kb, &n, 1, NULL), 0);
  ck_assert_int_eq(stats().launches - l0, 3);
  ck_assert_uint_eq(stats().last_block, 128); /* the loop over 0 .. n: size unknown */
  ck_assert_uint_eq(stats().last_grid, 132 * (2048 / 128)); /* fills the device */

  /* the same kernel in a second session: modules come from the cache */
  fb_session *s2 = open_session(&x, "sync", 0);
  add(s2, x.scale);
  ck_assert_int_eq(stats().modules_loaded, mods);
  fb_counters c;
  fb_session_counters(s2, &c);
  ck_assert_uint_eq(c.cache_hits, 1);
  ck_assert_uint_eq(c.tasks_compiled, 0);

  /* host access: managed memory, written and read back */
  float in[1000], out[1000];
  for (int i = 0; i < 1000; i++) in[i] = (float)i * 0.5f;
  ck_assert_int_eq(fb_field_write(s, field_id(&x, "a"), in, sizeof in), 0);
  ck_assert_int_eq(fb_field_read(s, field_id(&x, "a"), out, sizeof out), 0);
  ck_assert_int_eq(memcmp(in, out, sizeof in), 0);
  fb_session_counters(s, &c);
  ck_assert_uint_eq(c.tasks_launched, 3);
  ck_assert_uint_ge(c.device_bytes, 2 * 1000 * 4);

  fb_session_destroy(s2);
  fb_session_destroy(s);
  ck_assert_int_eq(stats().streams_destroyed - st0.streams_destroyed, 2);
  ck_assert_uint_eq(stats().bytes_in_use, st0.bytes_in_use); /* all returned */
  env_close(&x);
}
END_TEST

START_TEST(async_batches) {
  env x;
  env_open(&x, "cuda");
  fb_session *s = open_session(&x, "async", 0);
  int ks = add(s, x.scale);
  long l0 = stats().launches;
  fb_value k = fb_value_f32(2.0f);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(fb_launch(s, ks, &k, 1, NULL), 0);
  ck_assert_int_eq(fb_sync(s), 0);
  fb_counters c;
  fb_session_counters(s, &c);
  ck_assert_uint_eq(c.launches, 5);
  ck_assert_uint_eq(c.tasks_launched, (uint64_t)(stats().launches - l0));
  ck_assert_uint_ge(c.tasks_launched, 1);
  ck_assert_uint_le(c.tasks_launched, 5); /* the optimizer may merge them */
  fb_session_destroy(s);
  env_close(&x);
}
END_TEST

START_TEST(memory_limit_and_allocation_failure) {
  env x;
  env_open(&x, "cuda");
  fb_session_config sc = {.mode = "sync", .memory_limit = 1000};
  fb_session *s = NULL;
  char err[512] = "";
  ck_assert_int_eq(fb_session_create(x.e, &sc, fb_program_layout(x.p), &s, err, sizeof err),
                   FB_EQUOTA);
  ck_assert_msg(strstr(err, "limit 1000 bytes"), "message: %s", err);
  fake.fail_alloc(1); /* the session's stream state: a driver error, named */
  sc.memory_limit = 0;
  ck_assert_int_eq(fb_session_create(x.e, &sc, fb_program_layout(x.p), &s, err, sizeof err),
                   FB_EDEVICE);
  ck_assert_msg(strstr(err, "CUDA_ERROR_OUT_OF_MEMORY"), "message: %s", err);
  fake.fail_alloc(2); /* then the fields' memory: out of device memory, named */
  ck_assert_int_eq(fb_session_create(x.e, &sc, fb_program_layout(x.p), &s, err, sizeof err),
                   FB_EQUOTA);
  ck_assert_msg(strstr(err, "out of device memory on GPU 0") && strstr(err, "bytes asked"),
                "message: %s", err);
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 1);
  s = open_session(&x, "sync", 0); /* and then the engine goes on */
  fb_value k = fb_value_f32(1.0f);
  ck_assert_int_eq(fb_launch(s, add(s, x.scale), &k, 1, NULL), 0);
  fb_session_destroy(s);
  env_close(&x);
}
END_TEST


/* ---------------------------------------------------------------- device memory
 * Session memory is cuMemAlloc memory, which the fake keeps PROT_NONE
 * outside its own copies: a host touch that is not a copy crashes these. */

static fb_program *parse(const char *src) {
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse("dev.fbk", src, &p, &d), 0);
  fb_diags_free(&d);
  return p;
}

static int place_of(fb_program *p, const char *name) {
  return fb_program_field(p, fb_program_find_field(p, name))->places[0];
}

static fb_session *session_on(fb_engine *e, fb_program *p, const char *mode) {
  fb_session_config sc = {.mode = mode, .seed = 1};
  fb_session *s = NULL;
  char err[512] = "";
  int rc = fb_session_create(e, &sc, fb_program_layout(p), &s, err, sizeof err);
  ck_assert_msg(rc == 0, "session: %s", err);
  return s;
}

START_TEST(device_memory_field_round_trips) {
  const char *modes[] = {"sync", "async"};
  for (int m = 0; m < 2; m++) {
    env x;
    env_open(&x, "cuda");
    fb_session *s = open_session(&x, modes[m], 0);
    fakecuda_stats st = stats();
    ck_assert_msg(st.device_bytes > 4000 * 2, "fields on the device: %llu", st.device_bytes);
    ck_assert_int_eq(st.managed_bytes, 0);
    ck_assert_msg(st.pinned_bytes > 0, "a pinned staging buffer");
    int a = field_id(&x, "a"), b = field_id(&x, "b"), t = field_id(&x, "total");
    float in[1000], out[1000];
    for (int i = 0; i < 1000; i++) in[i] = (float)i * 0.5f + 1;
    ck_assert_int_eq(fb_field_write(s, a, in, sizeof in), 0);
    ck_assert_int_eq(fb_field_read(s, a, out, sizeof out), 0);
    ck_assert_mem_eq(in, out, sizeof in);
    ck_assert_int_eq(fb_field_read(s, b, out, sizeof out), 0); /* b lies between a's elements */
    for (int i = 0; i < 1000; i++) ck_assert_float_eq(out[i], 0.0f);
    int64_t i7 = 7;
    ck_assert_int_eq(fb_cell_write(s, b, &i7, 1, fb_value_f32(3.25f)), 0);
    fb_value v;
    ck_assert_int_eq(fb_cell_read(s, b, &i7, 1, &v), 0);
    ck_assert_float_eq(v.v.f, 3.25f);
    ck_assert_int_eq(fb_cell_read(s, a, &i7, 1, &v), 0);
    ck_assert_float_eq(v.v.f, in[7]);
    ck_assert_int_eq(fb_cell_write(s, t, NULL, 0, fb_value_f32(9.0f)), 0);
    ck_assert_int_eq(fb_cell_read(s, t, NULL, 0, &v), 0);
    ck_assert_float_eq(v.v.f, 9.0f);
    fb_value k = fb_value_f32(2.0f);
    ck_assert_int_eq(fb_launch(s, add(s, x.scale), &k, 1, NULL), 0);
    ck_assert_int_eq(fb_field_read(s, a, out, sizeof out), 0); /* after a launch too */
    ck_assert_mem_eq(in, out, sizeof in);
    fakecuda_stats after = stats();
    ck_assert_msg(after.htod_bytes > st.htod_bytes && after.dtoh_bytes > st.dtoh_bytes,
                  "host access copies");
    fb_session_destroy(s);
    ck_assert_int_eq(stats().device_bytes, 0); /* all given back */
    env_close(&x);
  }
}
END_TEST

/* numpy-sized: 4 MiB, four times the staging buffer */
START_TEST(device_memory_large_transfers) {
  env x;
  env_open(&x, "cuda");
  fb_program *p = parse("layout { dense(i: 1048576) { place big: f32 } }\n");
  fb_session *s = session_on(x.e, p, "sync");
  int f = place_of(p, "big");
  size_t n = 1u << 20;
  float *in = malloc(n * 4), *out = malloc(n * 4);
  for (size_t i = 0; i < n; i++) in[i] = (float)(i % 10007) - 5000.0f;
  fakecuda_stats st = stats();
  ck_assert_int_eq(fb_field_write(s, f, in, n * 4), 0);
  ck_assert_int_eq(fb_field_read(s, f, out, n * 4), 0);
  ck_assert_mem_eq(in, out, n * 4);
  fakecuda_stats after = stats();
  ck_assert_uint_eq(after.htod_bytes - st.htod_bytes, n * 4); /* a full write is not fetched first */
  ck_assert_uint_eq(after.dtoh_bytes - st.dtoh_bytes, n * 4);
  free(in);
  free(out);
  fb_session_destroy(s);
  fb_program_free(p);
  env_close(&x);
}
END_TEST

START_TEST(device_memory_sparse_host_access) {
  env x;
  env_open(&x, "cuda");
  fb_program *p = parse("layout {\n"
                        "  pointer(i: 16) as blocks { dense(i: 8) { place x: i32 } }\n"
                        "  pointer(ij: 8, 8) as tiles { bitmasked(ij: 4, 4) as bits { place r: i32 } }\n"
                        "  dense(i: 4) { dynamic(j: 64, chunk: 8) as lists { place d: i32 } }\n"
                        "}\n");
  fb_session *s = session_on(x.e, p, "sync");
  int fx = place_of(p, "x"), fr = place_of(p, "r"), fd = place_of(p, "d");
  int64_t i = 37, ij[2] = {5, 30}, dj[2] = {2, 20};
  fb_value v;
  ck_assert_int_eq(fb_cell_read(s, fx, &i, 1, &v), 0); /* inactive: 0 */
  ck_assert_int_eq(v.v.i, 0);
  ck_assert_int_eq(fb_cell_write(s, fx, &i, 1, fb_value_i32(41)), 0);
  ck_assert_int_eq(fb_cell_write(s, fr, ij, 2, fb_value_i32(-7)), 0);
  ck_assert_int_eq(fb_cell_write(s, fd, dj, 2, fb_value_i32(99)), 0);
  ck_assert_int_eq(fb_cell_read(s, fx, &i, 1, &v), 0);
  ck_assert_int_eq(v.v.i, 41);
  ck_assert_int_eq(fb_cell_read(s, fr, ij, 2, &v), 0);
  ck_assert_int_eq(v.v.i, -7);
  ck_assert_int_eq(fb_cell_read(s, fd, dj, 2, &v), 0);
  ck_assert_int_eq(v.v.i, 99);
  int32_t xs[128];
  ck_assert_int_eq(fb_field_read(s, fx, xs, sizeof xs), 0);
  for (int k = 0; k < 128; k++) ck_assert_int_eq(xs[k], k == 37 ? 41 : 0);
  uint8_t act[128];
  ck_assert_int_eq(fb_field_active(s, fx, act, sizeof act), 0);
  for (int k = 0; k < 128; k++) ck_assert_int_eq(act[k], k / 8 == 37 / 8); /* its block */
  uint8_t ract[32 * 32];
  ck_assert_int_eq(fb_field_active(s, fr, ract, sizeof ract), 0);
  for (int k = 0; k < 32 * 32; k++) ck_assert_int_eq(ract[k], k == 5 * 32 + 30);
  int32_t rs[32 * 32];
  for (int k = 0; k < 32 * 32; k++) rs[k] = k;
  ck_assert_int_eq(fb_field_write(s, fr, rs, sizeof rs), 0); /* activates every cell */
  int32_t back[32 * 32];
  ck_assert_int_eq(fb_field_read(s, fr, back, sizeof back), 0);
  ck_assert_mem_eq(rs, back, sizeof rs);
  ck_assert_int_eq(fb_cell_read(s, fd, dj, 2, &v), 0); /* the others kept theirs */
  ck_assert_int_eq(v.v.i, 99);
  ck_assert_int_eq(stats().managed_bytes, 0);
  fb_session_destroy(s);
  fb_program_free(p);
  env_close(&x);
}
END_TEST

/* The fake has 256 MiB; the default budget is 80% of it. */
START_TEST(device_memory_out_of_memory_names_device_and_bytes) {
  setenv("FAKECUDA_TOTAL_MEM", "268435456", 1);
  env x;
  env_open(&x, "cuda");
  fb_session *s = open_session(&x, "sync", 0);
  fb_program *big = parse("layout { dense(i: 67108864) { place huge: f32 } }\n"); /* 256 MiB */
  fb_session_config sc = {.mode = "sync"};
  fb_session *s2 = NULL;
  char err[512] = "";
  ck_assert_int_eq(fb_session_create(x.e, &sc, fb_program_layout(big), &s2, err, sizeof err),
                   FB_EQUOTA);
  ck_assert_msg(strstr(err, "out of device memory on GPU 0 (") &&
                    strstr(err, "268435456 bytes asked") && strstr(err, "bytes free"),
                "message: %s", err);
  fb_value k = fb_value_f32(1.0f); /* the other session goes on */
  ck_assert_int_eq(fb_launch(s, add(s, x.scale), &k, 1, NULL), 0);
  int a = field_id(&x, "a");
  float in[1000] = {1, 2, 3}, out[1000];
  ck_assert_int_eq(fb_field_write(s, a, in, sizeof in), 0);
  ck_assert_int_eq(fb_field_read(s, a, out, sizeof out), 0);
  ck_assert_mem_eq(in, out, sizeof in);
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 1);
  fb_session_destroy(s);
  fb_program_free(big);
  env_close(&x);
  unsetenv("FAKECUDA_TOTAL_MEM");
}
END_TEST

START_TEST(device_budget_against_mem_get_info) {
  char err[512] = "";
  fb_cuda_device *d = NULL;
  fake.reset();
  setenv("FB_CUDA_BUDGET", "2147483648", 1); /* 2 GiB on a 1 GiB fake */
  ck_assert_int_eq(fb_cuda_device_new(&d, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "device budget of 2147483648 bytes is more than the") &&
                    strstr(err, "--device-budget"),
                "message: %s", err);
  setenv("FB_CUDA_BUDGET", "lots", 1);
  ck_assert_int_eq(fb_cuda_device_new(&d, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "not a byte count"), "message: %s", err);
  unsetenv("FB_CUDA_BUDGET");
  ck_assert_int_eq(fb_cuda_device_new(&d, err, sizeof err), 0);
  fb_cuda_memory_info mi;
  fb_cuda_device_memory(d, &mi);
  ck_assert_uint_eq(mi.budget, (1ull << 30) / 100 * 80); /* the default: 80% */
  ck_assert_int_eq(mi.managed, 0);
  fb_cuda_device_free(d);
  /* a 48 MiB budget: a session of 24 MiB fits, a second does not (out of
   * device memory), one of 12 MiB does, and then less than a session's
   * minimum is left: a fourth is refused at once */
  setenv("FB_CUDA_BUDGET", "50331648", 1);
  fb_engine *e = NULL;
  fb_engine_config cfg = {"cuda", 1, 1};
  fake.reset();
  ck_assert_int_eq(fb_engine_create(&cfg, &e, err, sizeof err), 0);
  fb_program *p = parse("layout { dense(i: 6291456) { place m: f32 } }\n");
  fb_session *s1 = session_on(e, p, "sync"), *s2 = NULL, *s4 = NULL;
  fb_session_config sc = {.mode = "sync"};
  ck_assert_int_eq(fb_session_create(e, &sc, fb_program_layout(p), &s2, err, sizeof err),
                   FB_EQUOTA);
  ck_assert_msg(strstr(err, "25165824 bytes asked") && strstr(err, "device budget 50331648"),
                "message: %s", err);
  fb_program *p2 = parse("layout { dense(i: 3145728) { place m: f32 } }\n"); /* 12 MiB */
  fb_session *s3 = session_on(e, p2, "sync");
  ck_assert_int_eq(fb_session_create(e, &sc, fb_program_layout(p2), &s4, err, sizeof err),
                   FB_EQUOTA);
  ck_assert_msg(strstr(err, "no device memory for another session"), "message: %s", err);
  fb_session_destroy(s3);
  fb_session_destroy(s1); /* given back: room again */
  s2 = session_on(e, p, "sync");
  fb_session_destroy(s2);
  fb_program_free(p);
  fb_program_free(p2);
  fb_engine_destroy(e);
  unsetenv("FB_CUDA_BUDGET");
}
END_TEST

START_TEST(managed_memory_option_still_works) {
  setenv("FB_CUDA_MEMORY", "managed", 1);
  env x;
  env_open(&x, "cuda");
  fb_session *s = open_session(&x, "sync", 0);
  int a = field_id(&x, "a");
  float in[1000], out[1000];
  for (int i = 0; i < 1000; i++) in[i] = (float)i;
  fakecuda_stats st = stats();
  ck_assert_msg(st.managed_bytes > 8000, "fields in managed memory");
  ck_assert_int_eq(fb_field_write(s, a, in, sizeof in), 0);
  ck_assert_int_eq(fb_field_read(s, a, out, sizeof out), 0);
  ck_assert_mem_eq(in, out, sizeof in);
  ck_assert_uint_eq(stats().htod_bytes, st.htod_bytes); /* read in place: no copies */
  fb_value k = fb_value_f32(1.0f);
  ck_assert_int_eq(fb_launch(s, add(s, x.scale), &k, 1, NULL), 0);
  fb_session_destroy(s);
  env_close(&x);
  setenv("FB_CUDA_MEMORY", "shared", 1);
  fb_engine *e = NULL;
  fb_engine_config cfg = {"cuda", 1, 1};
  char err[512] = "";
  ck_assert_int_ne(fb_engine_create(&cfg, &e, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "FB_CUDA_MEMORY=shared; use device or managed"), "message: %s", err);
  unsetenv("FB_CUDA_MEMORY");
}
END_TEST

/* ---------------------------------------------------------------- faults */

START_TEST(plain_launch_error_fails_one_launch) {
  env x;
  env_open(&x, "cuda");
  fb_session *s = open_session(&x, "sync", 0);
  int ks = add(s, x.scale);
  fb_value k = fb_value_f32(1.0f);
  fake.fail_launch(1, 701); /* CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: not sticky */
  ck_assert_int_eq(fb_launch(s, ks, &k, 1, NULL), FB_EDEVICE);
  ck_assert_msg(strstr(fb_session_errmsg(s), "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES") &&
                    strstr(fb_session_errmsg(s), "scale"),
                "message: %s", fb_session_errmsg(s));
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 1);
  ck_assert_int_eq(fb_launch(s, ks, &k, 1, NULL), 0); /* the session goes on */
  fb_session_destroy(s);
  env_close(&x);
}
END_TEST

START_TEST(sticky_error_ends_sessions_then_recovers) {
  env x;
  env_open(&x, "cuda");
  fb_session *s1 = open_session(&x, "sync", 0);
  fb_session *s2 = open_session(&x, "async", 0);
  int k1 = add(s1, x.scale), k2 = add(s2, x.scale);
  fb_value k = fb_value_f32(1.0f);
  fake.fail_launch(1, 700); /* CUDA_ERROR_ILLEGAL_ADDRESS: the context is gone */
  ck_assert_int_eq(fb_launch(s1, k1, &k, 1, NULL), FB_EDEVICE);
  ck_assert_msg(strstr(fb_session_errmsg(s1), "CUDA_ERROR_ILLEGAL_ADDRESS") &&
                    strstr(fb_session_errmsg(s1), "open a new one"),
                "message: %s", fb_session_errmsg(s1));
  char why[512] = "";
  ck_assert_int_eq(fb_engine_healthy(x.e, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "CUDA_ERROR_ILLEGAL_ADDRESS"), "why: %s", why);
  /* every session of the context has ended, with nothing half-done */
  ck_assert_int_eq(fb_launch(s1, k1, &k, 1, NULL), FB_EDEVICE);
  ck_assert_int_eq(fb_launch(s2, k2, &k, 1, NULL), FB_EDEVICE);
  float buf[1000];
  ck_assert_int_eq(fb_field_read(s2, field_id(&x, "a"), buf, sizeof buf), FB_EDEVICE);
  fb_session_config sc = {.mode = "sync"};
  fb_session *s3 = NULL;
  char err[512] = "";
  ck_assert_int_eq(fb_session_create(x.e, &sc, fb_program_layout(x.p), &s3, err, sizeof err),
                   FB_EDEVICE);
  long resets = stats().ctx_resets;
  fb_session_destroy(s1);
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 0); /* s2 still holds the context */
  fb_session_destroy(s2);
  ck_assert_int_eq(stats().ctx_resets, resets + 1);
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 1);
  s3 = open_session(&x, "sync", 0);
  int k3 = add(s3, x.scale); /* compiled again for the new context */
  ck_assert_int_eq(fb_launch(s3, k3, &k, 1, NULL), 0);
  fb_session_destroy(s3);
  env_close(&x);
}
END_TEST

START_TEST(sticky_error_in_async_batch) {
  env x;
  env_open(&x, "cuda");
  fb_session *s = open_session(&x, "async", 0);
  int ks = add(s, x.scale);
  fb_value k = fb_value_f32(1.0f);
  fake.fail_launch(1, 719); /* CUDA_ERROR_LAUNCH_FAILED */
  ck_assert_int_eq(fb_launch(s, ks, &k, 1, NULL), 0); /* queued */
  ck_assert_int_eq(fb_sync(s), FB_EDEVICE);
  ck_assert_msg(strstr(fb_session_errmsg(s), "CUDA_ERROR_LAUNCH_FAILED"), "message: %s",
                fb_session_errmsg(s));
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 0);
  fb_session_destroy(s);
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 1);
  env_close(&x);
}
END_TEST

/* A device failure in the user's terms (tests/test_blame.c has the other
 * classes): the kernel by its name, in async mode its launch, and no
 * internal task name ("both.t1"), IR value or "task <name>". The 2nd
 * launch of `both` is its loop (after the serial `total[] = 0.0`). */
static void no_internal_names(const char *msg, const char *who) {
  regex_t re;
  ck_assert_int_eq(regcomp(&re, "\\.t[0-9]|%[0-9]|(^|[^A-Za-z_])task [A-Za-z_'\"]",
                           REG_EXTENDED | REG_NOSUB),
                   0);
  int hit = regexec(&re, msg, 0, NULL, 0) == 0;
  regfree(&re);
  ck_assert_msg(!hit && strstr(msg, who), "message: %s (want %s)", msg, who);
}

START_TEST(device_failure_names_no_task) {
  env x;
  env_open(&x, "cuda");
  const char *modes[] = {"sync", "async"};
  for (int m = 0; m < 2; m++) {
    fb_session *s = open_session(&x, modes[m], 0);
    int kb = add(s, x.both);
    fb_value n = fb_value_i32(10);
    fake.fail_launch(2, 701); /* CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: not sticky */
    int rc = fb_launch(s, kb, &n, 1, NULL);
    if (!rc) rc = fb_sync(s);
    ck_assert_int_eq(rc, FB_EDEVICE);
    no_internal_names(fb_session_errmsg(s), m ? "kernel 'both' (launch 0)" : "kernel 'both'");
    ck_assert_msg(strstr(fb_session_errmsg(s), "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"), "%s",
                  fb_session_errmsg(s));
    fb_session_destroy(s);
  }
  env_close(&x);
}
END_TEST

/* No lost work (docs/optimizer.md): a fused task whose launch the driver refuses for
 * its size (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: registers, parameter
 * space) did not run, so its parts run instead, each a launch of its own. */
START_TEST(fused_launch_refused_runs_the_parts) {
  env x;
  env_open(&x, "cuda");
  fb_session_config sc = {.mode = "async", .seed = 1, .flush_every = -1};
  fb_session *s = NULL;
  char err[512] = "";
  ck_assert_int_eq(fb_session_create(x.e, &sc, fb_program_layout(x.p), &s, err, sizeof err), 0);
  fb_kernel *acc = inst(x.p, "acc");
  int ks = add(s, acc);
  fb_value k = fb_value_f32(2.0f);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(fb_launch(s, ks, &k, 1, NULL), 0);
  ck_assert_int_eq(fb_sync(s), 0); /* one fused task: the five launches */
  fb_counters c0;
  fb_session_counters(s, &c0);
  ck_assert_uint_eq(c0.tasks_fused, 4);
  ck_assert_uint_eq(c0.tasks_launched, 1);
  long l0 = stats().launches;
  fake.fail_launch(1, 701);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(fb_launch(s, ks, &k, 1, NULL), 0);
  ck_assert_msg(fb_sync(s) == 0, "%s", fb_session_errmsg(s));
  fb_counters c;
  fb_session_counters(s, &c);
  ck_assert_uint_eq(c.tasks_fused, 8);
  ck_assert_uint_eq(c.fuse_fallbacks, 1);
  ck_assert_uint_eq(c.tasks_launched - c0.tasks_launched, 5); /* every part, once */
  ck_assert_int_eq(stats().launches - l0, 5);
  ck_assert_int_eq(fb_engine_healthy(x.e, NULL, 0), 1);
  fb_session_destroy(s);
  env_close(&x);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda");
  TCase *t = tcase_create("fake driver");
  tcase_add_checked_fixture(t, load_fake, NULL);
  tcase_add_test(t, backend_cuda_on_fake_driver);
  tcase_add_test(t, device_tables_by_name);
  tcase_add_test(t, device_code_caches_through_the_table);
  tcase_add_test(t, engine_code_cache_is_the_devices);
  tcase_add_test(t, no_driver_is_a_clear_error);
  tcase_add_test(t, no_gpu_is_a_clear_error);
  tcase_add_test(t, server_refuses_cuda_without_driver);
  tcase_add_test(t, stream_modules_and_launch_shapes);
  tcase_add_test(t, ptx_from_a_code_store);
  tcase_add_test(t, async_batches);
  tcase_add_test(t, memory_limit_and_allocation_failure);
  tcase_add_test(t, plain_launch_error_fails_one_launch);
  tcase_add_test(t, sticky_error_ends_sessions_then_recovers);
  tcase_add_test(t, sticky_error_in_async_batch);
  tcase_add_test(t, device_failure_names_no_task);
  tcase_add_test(t, fused_launch_refused_runs_the_parts);
  tcase_add_test(t, device_memory_field_round_trips);
  tcase_add_test(t, device_memory_large_transfers);
  tcase_add_test(t, device_memory_sparse_host_access);
  tcase_add_test(t, device_memory_out_of_memory_names_device_and_bytes);
  tcase_add_test(t, device_budget_against_mem_get_info);
  tcase_add_test(t, managed_memory_option_still_works);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return fbt_run(suite()); }
