/* The perf map of JIT'd task code (FB_PERF_MAP=1; codegen/README.md,
 * "Profiling JIT code with perf").
 *
 * perf resolves samples in anonymous executable memory through
 * /tmp/perf-PID.map, one "START SIZE name" line (hex, no 0x) per function.
 * With FB_PERF_MAP=1 the CPU JIT appends a line for every function of every
 * task object it links: the body as "fb:TASK#ID" (TASK is the task's IR
 * name, e.g. substep.t2, or a fused task's "substep.t1+substep.t2"; ID the
 * compile's number, which tells recompiled variants of one task apart),
 * the bounds function as "fb:TASK#ID:bounds", and the functions LLVM kept
 * apart (the sparse runtime's, outlined ones) as "fb:TASK#ID:SYMBOL".
 * Fused names longer than 200 bytes are cut. Sizes come from the object's symbol
 * table, read before the JIT takes the object; addresses from the body's
 * address after linking (the JIT keeps a section in one piece).
 *
 * The file is opened (and emptied: pids are reused) when a JIT is made
 * (fb_cpu_jit_new), which in a fuseboxd worker is before its seccomp
 * filter refuses open; a process that forks reopens it under its own pid. Code evicted from the cache keeps its
 * lines (perf has no way to forget one). Off by default: it costs a parse
 * of each object and a write per compile. */
#include <errno.h>
#include <fcntl.h>
#include <llvm-c/Object.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cg_internal.h"

#define NAME_MAX_BYTES 240 /* of a label: fused tasks' names can be long */

struct fb_perf_syms {
  size_t n;
  struct perf_sym {
    char *name, *section;
    uint64_t off, size;
  } *v;
};

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_on; /* FB_PERF_MAP=1 */
static pthread_mutex_t map_mu = PTHREAD_MUTEX_INITIALIZER;
static int map_fd = -1;
static pid_t map_pid;
static int map_warned;

static void read_env(void) {
  const char *v = getenv("FB_PERF_MAP");
  if (!v || !v[0] || !strcmp(v, "0")) return;
  if (!strcmp(v, "1")) env_on = 1;
  else fprintf(stderr, "fusebox: FB_PERF_MAP=%s: expected 0 or 1; no perf map is written\n", v);
}

/* This process's pid as perf sees it: the host's. A fuseboxd worker in a
 * PID namespace of its own is pid 1 to getpid(), but the /proc it still
 * sees when its JIT is made is the host's, where "self" names the host pid.
 * getpid() where that link cannot be read. */
static long host_pid(pid_t pid) {
  char buf[32];
  ssize_t n = readlink("/proc/self", buf, sizeof buf - 1);
  if (n <= 0) return (long)pid;
  buf[n] = 0;
  char *end;
  long v = strtol(buf, &end, 10);
  return *end || v <= 0 ? (long)pid : v;
}

/* The open map of this process; -1 when off or it cannot be opened (said
 * once on stderr). Call with map_mu held. */
static int map_open_locked(void) {
  pid_t pid = getpid(); /* tells a forked child, which needs a file of its own */
  if (map_fd >= 0 && map_pid == pid) return map_fd;
  if (map_fd >= 0) close(map_fd); /* inherited over fork: the parent's file */
  map_fd = -1;
  char path[64];
  snprintf(path, sizeof path, "/tmp/perf-%ld.map", host_pid(pid));
  /* /tmp is shared: never follow a link someone planted, never append to a
   * file that is not a plain one of ours (perf wants that owner, too), and
   * let no other user read it (task names and code addresses of tenants'
   * kernels: perf runs as this user or root) */
  map_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  struct stat st;
  const char *why = map_fd < 0 ? strerror(errno) : NULL;
  if (!why && (fstat(map_fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
               st.st_nlink != 1))
    why = "not a plain file of this user";
  /* a file of an earlier process with this pid (pids are reused): its
   * lines name code that is not ours */
  if (!why && (ftruncate(map_fd, 0) || fchmod(map_fd, 0600))) why = strerror(errno);
  if (why) {
    if (map_fd >= 0) close(map_fd);
    map_fd = -1;
    if (!map_warned) fprintf(stderr, "fusebox: FB_PERF_MAP=1: cannot use %s: %s\n", path, why);
    map_warned = 1;
  }
  map_pid = pid;
  return map_fd;
}

int fb_cg_perf_map_on(void) {
  pthread_once(&env_once, read_env);
  if (!env_on) return 0;
  pthread_mutex_lock(&map_mu);
  int fd = map_open_locked();
  pthread_mutex_unlock(&map_mu);
  return fd >= 0;
}

void fb_cg_perf_syms_free(fb_perf_syms *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) {
    free(s->v[i].name);
    free(s->v[i].section);
  }
  free(s->v);
  free(s);
}

static int syms_add(fb_perf_syms *s, size_t *cap, const char *name, const char *section,
                    uint64_t off, uint64_t size) {
  if (s->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 8;
    struct perf_sym *v = realloc(s->v, nc * sizeof *v);
    if (!v) return -1;
    s->v = v;
    *cap = nc;
  }
  struct perf_sym *p = &s->v[s->n];
  p->name = strdup(name);
  p->section = strdup(section);
  p->off = off;
  p->size = size;
  if (!p->name || !p->section) {
    free(p->name);
    free(p->section);
    return -1;
  }
  s->n++;
  return 0;
}

fb_perf_syms *fb_cg_perf_syms(LLVMMemoryBufferRef obj) {
  if (!obj || !fb_cg_perf_map_on()) return NULL;
  char *msg = NULL;
  LLVMBinaryRef b = LLVMCreateBinary(obj, NULL, &msg); /* reads obj, does not take it */
  LLVMDisposeMessage(msg);
  if (!b) return NULL;
  fb_perf_syms *s = calloc(1, sizeof *s);
  size_t cap = 0;
  LLVMSymbolIteratorRef si = LLVMObjectFileCopySymbolIterator(b);
  LLVMSectionIteratorRef sec = LLVMObjectFileCopySectionIterator(b);
  for (; s && si && sec && !LLVMObjectFileIsSymbolIteratorAtEnd(b, si); LLVMMoveToNextSymbol(si)) {
    const char *name = LLVMGetSymbolName(si);
    uint64_t size = LLVMGetSymbolSize(si);
    if (!name || !name[0] || !size) continue; /* section and file symbols */
    LLVMMoveToContainingSection(sec, si);
    if (LLVMObjectFileIsSectionIteratorAtEnd(b, sec)) continue; /* undefined */
    const char *sname = LLVMGetSectionName(sec);
    if (!sname || strncmp(sname, ".text", 5)) continue; /* data, not code */
    if (syms_add(s, &cap, name, sname, LLVMGetSymbolAddress(si), size)) {
      fb_cg_perf_syms_free(s);
      s = NULL;
    }
  }
  if (sec) LLVMDisposeSectionIterator(sec);
  if (si) LLVMDisposeSymbolIterator(si);
  LLVMDisposeBinary(b);
  return s;
}

/* Append label with anything that would break a line or a column made '?'. */
static size_t put_label(char *dst, const char *label) {
  size_t n = 0;
  for (; label && label[n] && n < NAME_MAX_BYTES; n++) {
    unsigned char c = (unsigned char)label[n];
    dst[n] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  if (label && label[n]) {
    memcpy(dst + n, "...", 3);
    n += 3;
  }
  return n;
}

void fb_cg_perf_announce(const fb_perf_syms *s, const char *body_sym, const char *bounds_sym,
                         uint64_t body_addr, const char *label) {
  if (!s || !body_addr) return;
  const struct perf_sym *body = NULL;
  for (size_t i = 0; i < s->n && !body; i++)
    if (!strcmp(s->v[i].name, body_sym)) body = &s->v[i];
  if (!body || body->off > body_addr) return;
  uint64_t base = body_addr - body->off; /* the body's section in memory */
  size_t line = 64 + 2 * NAME_MAX_BYTES + 16, cap = line * s->n, len = 0;
  char *buf = malloc(cap);
  if (!buf) return;
  for (size_t i = 0; i < s->n; i++) {
    const struct perf_sym *p = &s->v[i];
    if (strcmp(p->section, body->section)) continue; /* placed apart by the JIT */
    len += (size_t)snprintf(buf + len, cap - len, "%llx %llx fb:",
                            (unsigned long long)(base + p->off), (unsigned long long)p->size);
    len += put_label(buf + len, label ? label : "task");
    if (p != body) {
      buf[len++] = ':';
      len += put_label(buf + len, bounds_sym && !strcmp(p->name, bounds_sym) ? "bounds" : p->name);
    }
    buf[len++] = '\n';
  }
  pthread_mutex_lock(&map_mu);
  int fd = map_open_locked();
  /* one write per object under O_APPEND: lines of two compiles never mix */
  for (size_t at = 0; fd >= 0 && at < len;) {
    ssize_t w = write(fd, buf + at, len - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    at += (size_t)w;
  }
  pthread_mutex_unlock(&map_mu);
  free(buf);
}
