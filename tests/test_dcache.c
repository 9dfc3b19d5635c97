/* The compile cache on disk (server/dcache.c, docs/code-cache.md): keys
 * that change with every part; entries that survive a reopen; tampering of
 * every kind (a byte of header, IR, payload or HMAC flipped, a truncated
 * entry, two entries swapped, an entry copied into another tenant's
 * directory, a symbolic link, a wrong mode or owner, a hard link) refused,
 * removed and counted, after which a rewrite hits again; a writer killed
 * with SIGKILL mid-write leaves nothing that reads as an entry; two
 * processes writing one directory; the least-recently-used bound; entries
 * of another build removed at open; the key file's rules. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "server/dcache.h"
#include "support/support.h"

static char root[256];
static const uint8_t server_key[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                       17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
#define TAG "format 1; fuseboxd 0.1.0 test; LLVM 19"

static void setup(void) {
  snprintf(root, sizeof root, "/tmp/fb_dcache_test_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
}

static void rm_rf(const char *p) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
  ck_assert_int_eq(system(cmd), 0);
}

static void teardown(void) { rm_rf(root); }

static fbd_dcache *open_t(const char *tenant, uint64_t max) {
  char err[256] = "";
  fbd_dcache *d = NULL;
  int rc = fbd_dcache_open(root, tenant, TAG, server_key, sizeof server_key, max, &d, err,
                           sizeof err);
  ck_assert_msg(rc == 0, "open: %s", err);
  return d;
}

static void key_of(const char *ir, const char *target, uint8_t k[32]) {
  const void *p[3] = {"fmt1", target, ir};
  size_t l[3] = {4, strlen(target), strlen(ir)};
  fbd_dcache_hash_parts(p, l, 3, k);
}

static void path_of(fbd_dcache *d, const uint8_t k[32], char *out, size_t n) {
  /* the one entry file whose name ends with the key's hex */
  char hex[65];
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", k[i]);
  DIR *dir = opendir(fbd_dcache_dir(d));
  ck_assert_ptr_nonnull(dir);
  out[0] = 0;
  for (struct dirent *e; (e = readdir(dir));)
    if (strstr(e->d_name, hex)) snprintf(out, n, "%s/%s", fbd_dcache_dir(d), e->d_name);
  closedir(dir);
  ck_assert_msg(out[0], "no entry file for the key");
}

static int exists(const char *p) {
  struct stat s;
  return lstat(p, &s) == 0;
}

static int get_is(fbd_dcache *d, const uint8_t k[32], const char *ir, const char *want) {
  uint8_t *p = NULL;
  size_t n = 0;
  int hit = fbd_dcache_get(d, k, ir, strlen(ir), &p, &n);
  if (hit) {
    ck_assert_uint_eq(n, strlen(want));
    ck_assert_msg(!memcmp(p, want, n), "payload differs");
  }
  free(p);
  return hit;
}

static void put_s(fbd_dcache *d, const uint8_t k[32], const char *ir, const char *payload) {
  ck_assert_int_eq(fbd_dcache_put(d, k, ir, strlen(ir), payload, strlen(payload)), 0);
}

START_TEST(every_key_part_matters) {
  const char *base[4] = {"fmt1", "x86_64 znver3 +avx2", "O3 cas16", "kernel k { ... }"};
  uint8_t k0[32], k1[32];
  const void *p[4];
  size_t l[4];
  for (int i = 0; i < 4; i++) {
    p[i] = base[i];
    l[i] = strlen(base[i]);
  }
  fbd_dcache_hash_parts(p, l, 4, k0);
  fbd_dcache *d = open_t("alice", 0);
  ck_assert_int_eq(fbd_dcache_put(d, k0, "ir", 2, "code", 4), 0);
  ck_assert_int_eq(get_is(d, k0, "ir", "code"), 1);
  for (int i = 0; i < 4; i++) { /* one character of one part changed: another key, a miss */
    char changed[64];
    snprintf(changed, sizeof changed, "%s", base[i]);
    changed[0] ^= 1;
    const void *q[4] = {p[0], p[1], p[2], p[3]};
    q[i] = changed;
    fbd_dcache_hash_parts(q, l, 4, k1);
    ck_assert_msg(memcmp(k0, k1, 32), "part %d does not change the key", i);
    ck_assert_int_eq(get_is(d, k1, "ir", "code"), 0);
  }
  /* the boundary between parts is part of the key */
  const void *a[2] = {"ab", "c"}, *b[2] = {"a", "bc"};
  size_t la[2] = {2, 1}, lb[2] = {1, 2};
  fbd_dcache_hash_parts(a, la, 2, k0);
  fbd_dcache_hash_parts(b, lb, 2, k1);
  ck_assert(memcmp(k0, k1, 32));
  /* same key, other IR: a miss that keeps the entry */
  fbd_dcache_hash_parts(p, l, 4, k0);
  ck_assert_int_eq(get_is(d, k0, "IR", "code"), 0);
  ck_assert_int_eq(get_is(d, k0, "ir", "code"), 1);
  fbd_dcache_stats st;
  fbd_dcache_stats_get(d, &st);
  ck_assert_uint_eq(st.hits, 2);
  ck_assert_uint_eq(st.misses, 5);
  ck_assert_uint_eq(st.writes, 1);
  ck_assert_uint_eq(st.rejects, 0);
  fbd_dcache_close(d);
}
END_TEST

START_TEST(survives_reopen) {
  uint8_t k[32];
  key_of("kernel a", "x86", k);
  fbd_dcache *d = open_t("alice", 0);
  put_s(d, k, "kernel a", "object bytes");
  fbd_dcache_close(d);
  d = open_t("alice", 0);
  fbd_dcache_stats st;
  fbd_dcache_stats_get(d, &st);
  ck_assert_uint_gt(st.bytes, strlen("object bytes"));
  ck_assert_int_eq(get_is(d, k, "kernel a", "object bytes"), 1);
  fbd_dcache_close(d);
  /* another build's cache removes the entry at open: never read by it */
  char err[256];
  fbd_dcache *o = NULL;
  ck_assert_int_eq(fbd_dcache_open(root, "alice", "another build", server_key, 32, 0, &o, err,
                                   sizeof err), 0);
  fbd_dcache_stats_get(o, &st);
  ck_assert_uint_eq(st.bytes, 0);
  fbd_dcache_close(o);
  d = open_t("alice", 0);
  ck_assert_int_eq(get_is(d, k, "kernel a", "object bytes"), 0);
  fbd_dcache_close(d);
  /* the sweep at start does the same for every tenant directory */
  d = open_t("alice", 0);
  put_s(d, k, "kernel a", "object bytes");
  char ap[512];
  path_of(d, k, ap, sizeof ap);
  fbd_dcache_close(d);
  ck_assert_int_eq(fbd_dcache_sweep(root, TAG), 1);
  ck_assert(exists(ap)); /* this build's stays */
  ck_assert_int_eq(fbd_dcache_sweep(root, "a newer build"), 1);
  ck_assert(!exists(ap)); /* another build's goes */
  /* another server key: the entry is refused (its HMAC fails) */
  d = open_t("alice", 0);
  put_s(d, k, "kernel a", "object bytes");
  fbd_dcache_close(d);
  uint8_t other[32];
  memcpy(other, server_key, 32);
  other[5] ^= 0x40;
  ck_assert_int_eq(fbd_dcache_open(root, "alice", TAG, other, 32, 0, &o, err, sizeof err), 0);
  ck_assert_int_eq(get_is(o, k, "kernel a", "object bytes"), 0);
  fbd_dcache_stats_get(o, &st);
  ck_assert_uint_eq(st.rejects, 1);
  fbd_dcache_close(o);
}
END_TEST

/* Flip one byte at offset off (negative: from the end) of the entry file. */
static void flip(const char *path, long off) {
  int fd = open(path, O_RDWR);
  ck_assert_int_ge(fd, 0);
  struct stat s;
  ck_assert_int_eq(fstat(fd, &s), 0);
  off_t at = off >= 0 ? off : s.st_size + off;
  uint8_t c;
  ck_assert_int_eq(pread(fd, &c, 1, at), 1);
  c ^= 0x10;
  ck_assert_int_eq(pwrite(fd, &c, 1, at), 1);
  close(fd);
}

/* The entry was refused: a miss, one more reject, the file gone; written
 * again it hits. */
static void refused_then_rewritten(fbd_dcache *d, const uint8_t k[32], const char *path,
                                   uint64_t *rejects, const char *what) {
  ck_assert_msg(get_is(d, k, "kernel t", "the code") == 0, "%s: not refused", what);
  fbd_dcache_stats st;
  fbd_dcache_stats_get(d, &st);
  ck_assert_msg(st.rejects == *rejects + 1, "%s: rejects %llu, want %llu", what,
                (unsigned long long)st.rejects, (unsigned long long)(*rejects + 1));
  *rejects = st.rejects;
  ck_assert_msg(!exists(path), "%s: the bad entry is still there", what);
  put_s(d, k, "kernel t", "the code");
  ck_assert_msg(get_is(d, k, "kernel t", "the code") == 1, "%s: no hit after the rewrite", what);
}

START_TEST(tampering_is_refused) {
  uint8_t k[32], k2[32];
  key_of("kernel t", "x86", k);
  key_of("kernel u", "x86", k2);
  fbd_dcache *d = open_t("alice", 0);
  put_s(d, k, "kernel t", "the code");
  char path[512], path2[512];
  path_of(d, k, path, sizeof path);
  uint64_t rejects = 0;
  const long offsets[] = {0, 5, 20, 45, 56 + 3 /* IR */, 56 + 8 + 2 /* payload */, -1, -20};
  const char *names[] = {"magic", "format", "key", "lengths", "IR", "payload", "HMAC", "HMAC"};
  for (int i = 0; i < 8; i++) {
    flip(path, offsets[i]);
    refused_then_rewritten(d, k, path, &rejects, names[i]);
  }
  ck_assert_int_eq(truncate(path, 60), 0);
  refused_then_rewritten(d, k, path, &rejects, "truncated");
  ck_assert_int_eq(truncate(path, 0), 0);
  refused_then_rewritten(d, k, path, &rejects, "empty");
  /* swapped: entry u renamed to t's name */
  put_s(d, k2, "kernel u", "other code");
  path_of(d, k2, path2, sizeof path2);
  ck_assert_int_eq(rename(path2, path), 0);
  refused_then_rewritten(d, k, path, &rejects, "swapped");
  /* mode: readable by others */
  ck_assert_int_eq(chmod(path, 0644), 0);
  refused_then_rewritten(d, k, path, &rejects, "mode 0644");
  /* owner: another user's entry (the test runs as root where it can chown) */
  if (geteuid() == 0) {
    ck_assert_int_eq(chown(path, 12345, 12345), 0);
    refused_then_rewritten(d, k, path, &rejects, "owner");
  }
  /* a hard link: a second name another user could keep */
  char hl[600];
  snprintf(hl, sizeof hl, "%s.hard", path);
  ck_assert_int_eq(link(path, hl), 0);
  refused_then_rewritten(d, k, path, &rejects, "hard link");
  unlink(hl);
  /* symlink to a sound entry elsewhere */
  char target[600];
  snprintf(target, sizeof target, "%s/elsewhere", root);
  ck_assert_int_eq(rename(path, target), 0);
  ck_assert_int_eq(symlink(target, path), 0);
  refused_then_rewritten(d, k, path, &rejects, "symlink");
  ck_assert_msg(exists(target), "the link's target was removed, not the link");
  /* copied from another tenant's directory */
  fbd_dcache *b = open_t("bob", 0);
  put_s(b, k, "kernel t", "bob's code");
  char bpath[512];
  path_of(b, k, bpath, sizeof bpath);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp -p '%s' '%s'", bpath, path);
  ck_assert_int_eq(system(cmd), 0);
  refused_then_rewritten(d, k, path, &rejects, "copied from bob");
  ck_assert_int_eq(get_is(b, k, "kernel t", "bob's code"), 1);
  fbd_dcache_close(b);
  fbd_dcache_close(d);
}
END_TEST

START_TEST(tenants_apart) {
  uint8_t k[32];
  key_of("kernel x", "x86", k);
  fbd_dcache *a = open_t("alice", 0), *b = open_t("bob", 0);
  ck_assert_str_ne(fbd_dcache_dir(a), fbd_dcache_dir(b));
  put_s(a, k, "kernel x", "alice's");
  ck_assert_int_eq(get_is(b, k, "kernel x", "alice's"), 0);
  fbd_dcache_stats st;
  fbd_dcache_stats_get(b, &st);
  ck_assert_uint_eq(st.hits, 0);
  ck_assert_uint_eq(st.misses, 1);
  fbd_dcache_close(a);
  fbd_dcache_close(b);
}
END_TEST

START_TEST(kill_during_write) {
  uint8_t k[32];
  key_of("kernel big", "x86", k);
  size_t n = (size_t)48 << 20;
  char *big = malloc(n);
  ck_assert_ptr_nonnull(big);
  memset(big, 'z', n);
  for (int round = 0; round < 4; round++) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      fbd_dcache *d = open_t("alice", 0);
      for (;;) (void)fbd_dcache_put(d, k, "kernel big", 10, big, n);
    }
    struct timespec ts = {0, (long)(20 + 37 * round) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    fbd_dcache *d = open_t("alice", 0);
    uint8_t *p = NULL;
    size_t len = 0;
    int hit = fbd_dcache_get(d, k, "kernel big", 10, &p, &len);
    if (hit) { /* only a whole entry reads */
      ck_assert_uint_eq(len, n);
      ck_assert(!memcmp(p, big, n));
    }
    free(p);
    fbd_dcache_stats s;
    fbd_dcache_stats_get(d, &s);
    ck_assert_uint_eq(s.rejects, 0); /* nothing half-written ever carries the entry's name */
    fbd_dcache_close(d);
  }
  /* the dead writers' temporary files go once stale */
  DIR *dir;
  char tdir[512] = "";
  fbd_dcache *d = open_t("alice", 0);
  snprintf(tdir, sizeof tdir, "%s", fbd_dcache_dir(d));
  fbd_dcache_close(d);
  int tmps = 0;
  dir = opendir(tdir);
  for (struct dirent *e; (e = readdir(dir));)
    if (!strncmp(e->d_name, ".tmp-", 5)) {
      tmps++;
      struct timespec old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
      utimensat(dirfd(dir), e->d_name, old, AT_SYMLINK_NOFOLLOW);
    }
  closedir(dir);
  d = open_t("alice", 0);
  fbd_dcache_close(d);
  dir = opendir(tdir);
  int left = 0;
  for (struct dirent *e; (e = readdir(dir));) left += !strncmp(e->d_name, ".tmp-", 5);
  closedir(dir);
  ck_assert_int_eq(left, 0);
  (void)tmps;
  free(big);
}
END_TEST

START_TEST(two_processes_share) {
  enum { KEYS = 24, ROUNDS = 30 };
  pid_t kids[2];
  for (int c = 0; c < 2; c++) {
    kids[c] = fork();
    ck_assert_int_ge(kids[c], 0);
    if (kids[c] == 0) {
      fbd_dcache *d = open_t("alice", 0);
      int bad = 0;
      for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < KEYS; i++) {
          char ir[32], code[64];
          uint8_t k[32];
          snprintf(ir, sizeof ir, "kernel %d", i);
          snprintf(code, sizeof code, "code of kernel %d, long enough to matter", i);
          key_of(ir, "x86", k);
          uint8_t *p = NULL;
          size_t n = 0;
          if (fbd_dcache_get(d, k, ir, strlen(ir), &p, &n)) {
            bad += n != strlen(code) || memcmp(p, code, n);
          } else if (fbd_dcache_put(d, k, ir, strlen(ir), code, strlen(code))) {
            bad++;
          }
          free(p);
        }
      fbd_dcache_stats st;
      fbd_dcache_stats_get(d, &st);
      bad += st.rejects != 0;
      fbd_dcache_close(d);
      _exit(bad ? 1 : 0);
    }
  }
  for (int c = 0; c < 2; c++) {
    int st = 0;
    ck_assert_int_eq(waitpid(kids[c], &st, 0), kids[c]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %d saw a bad entry", c);
  }
  fbd_dcache *d = open_t("alice", 0);
  for (int i = 0; i < KEYS; i++) {
    char ir[32], code[64];
    uint8_t k[32];
    snprintf(ir, sizeof ir, "kernel %d", i);
    snprintf(code, sizeof code, "code of kernel %d, long enough to matter", i);
    key_of(ir, "x86", k);
    ck_assert_int_eq(get_is(d, k, ir, code), 1);
  }
  fbd_dcache_close(d);
}
END_TEST

START_TEST(lru_bound) {
  /* each entry: 56 header + 8 IR + 1000 payload + 32 HMAC = 1096 bytes */
  char payload[1001];
  memset(payload, 'p', 1000);
  payload[1000] = 0;
  fbd_dcache *d = open_t("alice", 3 * 1096 + 100);
  uint8_t k[6][32];
  char ir[6][16];
  for (int i = 0; i < 6; i++) {
    snprintf(ir[i], sizeof ir[i], "kernel %d", i);
    key_of(ir[i], "x86", k[i]);
  }
  for (int i = 0; i < 3; i++) {
    put_s(d, k[i], ir[i], payload);
    struct timespec ts = {0, 20 * 1000000L}; /* distinct mtimes */
    nanosleep(&ts, NULL);
  }
  ck_assert_int_eq(get_is(d, k[0], ir[0], payload), 1); /* 0 is now the most recent */
  struct timespec ts = {0, 20 * 1000000L};
  nanosleep(&ts, NULL);
  put_s(d, k[3], ir[3], payload); /* evicts 1, the least recently used */
  fbd_dcache_stats st;
  fbd_dcache_stats_get(d, &st);
  ck_assert_uint_eq(st.evictions, 1);
  ck_assert_uint_le(st.bytes, 3 * 1096 + 100);
  ck_assert_int_eq(get_is(d, k[1], ir[1], payload), 0);
  ck_assert_int_eq(get_is(d, k[0], ir[0], payload), 1);
  ck_assert_int_eq(get_is(d, k[2], ir[2], payload), 1);
  ck_assert_int_eq(get_is(d, k[3], ir[3], payload), 1);
  /* an entry larger than the whole share is not written */
  char *huge = malloc(8000);
  memset(huge, 'h', 8000);
  ck_assert_int_eq(fbd_dcache_put(d, k[4], ir[4], strlen(ir[4]), huge, 8000), -1);
  free(huge);
  fbd_dcache_close(d);
}
END_TEST

START_TEST(key_file_rules) {
  char err[256] = "", kp[400], inside[400];
  uint8_t *key = NULL;
  size_t n = 0;
  snprintf(kp, sizeof kp, "%s/../%s.key", root, strrchr(root, '/') + 1);
  unlink(kp);
  /* made when missing, 0600 */
  ck_assert_int_eq(fbd_dcache_key_load(kp, root, 1, &key, &n, err, sizeof err), 0);
  ck_assert_uint_eq(n, 32);
  struct stat s;
  ck_assert_int_eq(stat(kp, &s), 0);
  ck_assert_uint_eq(s.st_mode & 0777, 0600);
  uint8_t first[32];
  memcpy(first, key, 32);
  free(key);
  ck_assert_int_eq(fbd_dcache_key_load(kp, root, 1, &key, &n, err, sizeof err), 0);
  ck_assert(!memcmp(first, key, 32)); /* the same key next time */
  free(key);
  chmod(kp, 0640);
  ck_assert_int_ne(fbd_dcache_key_load(kp, root, 1, &key, &n, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "mode"));
  chmod(kp, 0600);
  char ln[420];
  snprintf(ln, sizeof ln, "%s.link", kp);
  unlink(ln);
  ck_assert_int_eq(symlink(kp, ln), 0);
  ck_assert_int_ne(fbd_dcache_key_load(ln, NULL, 0, &key, &n, err, sizeof err), 0);
  unlink(ln);
  snprintf(inside, sizeof inside, "%s/server.key", root);
  ck_assert_int_ne(fbd_dcache_key_load(inside, root, 1, &key, &n, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "inside the cache directory"));
  unlink(kp);
  /* a cache directory others may write is refused */
  ck_assert_int_eq(chmod(root, 0777), 0);
  fbd_dcache *d = NULL;
  ck_assert_int_ne(fbd_dcache_open(root, "alice", TAG, server_key, 32, 0, &d, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "mode"));
  ck_assert_int_eq(chmod(root, 0700), 0);
  /* and a tenant directory that is a link */
  d = open_t("alice", 0);
  char tdir[512], moved[520];
  snprintf(tdir, sizeof tdir, "%s", fbd_dcache_dir(d));
  fbd_dcache_close(d);
  snprintf(moved, sizeof moved, "%s.moved", tdir);
  ck_assert_int_eq(rename(tdir, moved), 0);
  ck_assert_int_eq(symlink(moved, tdir), 0);
  ck_assert_int_ne(fbd_dcache_open(root, "alice", TAG, server_key, 32, 0, &d, err, sizeof err), 0);
}
END_TEST

static Suite *dcache_suite(void) {
  Suite *s = suite_create("dcache");
  TCase *t = tcase_create("dcache");
  tcase_add_checked_fixture(t, setup, teardown);
  tcase_set_timeout(t, 120);
  tcase_add_test(t, every_key_part_matters);
  tcase_add_test(t, survives_reopen);
  tcase_add_test(t, tampering_is_refused);
  tcase_add_test(t, tenants_apart);
  tcase_add_test(t, kill_during_write);
  tcase_add_test(t, two_processes_share);
  tcase_add_test(t, lru_bound);
  tcase_add_test(t, key_file_rules);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return fbt_run(dcache_suite()); }
