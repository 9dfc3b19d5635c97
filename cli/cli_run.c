/* `fusebox run SESSION.json`: load a JSON session, run setup and one step,
 * evaluate its checks. Exit 0 when every check passes, 1 when one fails,
 * 2 for bad usage or input (with a message naming the problem).
 * `fusebox graph` is run with the SFG written as Graphviz DOT before and
 * after each optimizer pass of a chosen flush. */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_session.h"

typedef struct run_args {
  const char *file, *graph_dir, *trace;
  uint64_t flush;
  int graphs_written, quiet, json;
  fb_sess_opts o;
  json_t *params;
} run_args;

static int help(FILE *f, int graph) {
  if (graph)
    fprintf(f, "usage: fusebox graph SESSION.json [--flush N] [--out DIR] [--param NAME=VALUE]...\n"
               "  Runs the session in async mode and writes the state-flow graph of flush\n"
               "  N (default 1; 0 = every flush) as Graphviz DOT, before and after each\n"
               "  optimizer pass, into DIR (default: graphs/), one file per step, in order:\n"
               "  flush<N>-<seq>-it<iteration>-<pass>-<before|after>.dot (pass \"window\":\n"
               "  the graph as flushed and fully optimized). Render with dot -Tsvg.\n"
               "example: fusebox graph bench/micro/chain_copy.json --out /tmp/g\n");
  else
    fprintf(f,
            "usage: fusebox run SESSION.json [--server ADDR | --local] [--mode sync|async]\n"
            "                   [--param NAME=VALUE]... [--graph DIR [--flush N]] [--trace FILE]\n"
            "                   [-o DIR] [-v] [-q] [--json]\n"
            "                   [--checkpoint-every N --checkpoint-dir DIR] [--resume FILE]\n"
            "                   [--checkpoint-key FILE]\n"
            "  Runs a JSON session (see docs/sessions.md): loads its program, runs\n"
            "  \"setup\" and one \"step\", then evaluates \"checks\" and prints each\n"
            "  outcome. Exit status 0 when all checks pass, 1 when one fails,\n"
            "  2 when the session cannot run or a launch fails (the message names\n"
            "  the problem; for a launch, the kernel, the launch number and the JSON\n"
            "  path of the action that launched it, on every path and in every mode).\n"
            "  The program's warnings (file:line:col: warning: ...) go to stderr;\n"
            "  they never fail the run.\n"
            "  The session runs on the fuseboxd at --server ADDR (host:port or unix:PATH;\n"
            "  default: $FUSEBOX_SERVER when set; ADDR,ADDR,... names replicas: a session\n"
            "  whose replica drains moves to the next by itself, or after the drain's\n"
            "  grace resumes there from the drain's checkpoint when the replicas share\n"
            "  --checkpoint-dir); without either, on a\n"
            "  private fuseboxd started for this run on a unix socket; --local runs the\n"
            "  engine inside this process instead (and ignores $FUSEBOX_SERVER).\n"
            "  --mode   override session.mode     -v  print kernel return values\n"
            "  -q, --quiet  no progress line (shown on a terminal's stderr during a long\n"
            "           setup or step: launches done, rate, ETA)\n"
            "  The last line gives the outcome and the time the whole run took.\n"
            "  --json   print one JSON object instead (file, name, outcome: passed, failed\n"
            "           or error, exit_status, elapsed_s, backend, counters, checks: each\n"
            "           with index, ok and message, error: the message when one)\n"
            "  -o, --output-dir DIR  write the files of \"save\" actions and \"to\" checks\n"
            "           (relative names) into DIR, made if missing (default: beside\n"
            "           SESSION.json); a name ending in .png is a picture of a 2-D field.\n"
            "           Names stay inside DIR: an absolute name, a '..' or a symbolic link on\n"
            "           the way is refused (folders in a name are made)\n"
            "  --param  set a parameter (${NAME} in the program and the session)\n"
            "  --graph  write the SFG of flush N (default 1) before/after each pass (async)\n"
            "  --trace  write a Chrome trace-event timeline (open it in Perfetto)\n"
            "  (--graph and --trace look inside the engine, so they imply --local)\n"
            "  --checkpoint-every N  every N launches (counted over setup and step, the\n"
            "           engine's launch count), a sealed checkpoint of the whole session\n"
            "           into --checkpoint-dir DIR as NAME-<launches>.fbck (written to a\n"
            "           temporary file, synced, renamed; the last two are kept)\n"
            "  --resume FILE  start from a sealed checkpoint of this session file: the\n"
            "           launches it holds are passed over, the rest run, with results\n"
            "           identical to an uninterrupted run (also \"session\": {\"resume\": F})\n"
            "  --checkpoint-key FILE  the key checkpoints are sealed with (mode 0600);\n"
            "           default $XDG_CONFIG_HOME/fusebox/checkpoint.key, made on first use\n"
            "  Without --server, checkpoints are of an in-process session (they imply\n"
            "  --local). With --server ADDR the fuseboxd seals them under its own key\n"
            "  (its --checkpoint-key; --checkpoint-key here is refused) and each streams\n"
            "  into DIR on this side, named as above; --resume FILE uploads one to the\n"
            "  server at ADDR (any replica with the same key) and the run goes on there.\n"
            "  A checkpoint of one kind does not resume as the other (docs/checkpoint.md)\n"
            "  Ctrl-C (or SIGTERM) stops the run at once: the private fuseboxd is\n"
            "  stopped and its socket removed, a --server session is closed; it prints\n"
            "  \"interrupted\" and exits 130 (143 for SIGTERM). A second Ctrl-C does\n"
            "  not wait for the daemon.\n"
            "examples: fusebox run examples/life.json\n"
            "          fusebox run examples/wave.json -o frames/   # frames/wave_0040.png ...\n");
  return f == stdout ? 0 : 2;
}

static int parse_args(int argc, char **argv, int graph, run_args *a) {
  memset(a, 0, sizeof *a);
  a->o.out = stdout;
  a->params = json_object();
  a->flush = 1;
  a->o.private_server = !graph; /* run's default: a private fuseboxd */
  if (graph) {
    a->graph_dir = "graphs";
    a->o.mode = "async";
  }
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    if (!strcmp(argv[i], "--param") && v) {
      if (fb_cli_add_param(a->params, argv[++i])) return -1;
    } else if (!strcmp(argv[i], "--mode") && v && !graph) a->o.mode = argv[++i];
    else if ((!strcmp(argv[i], "--graph") && !graph) || (!strcmp(argv[i], "--out") && graph)) {
      if (!v) return -1;
      a->graph_dir = argv[++i];
    } else if (!strcmp(argv[i], "--flush") && v) a->flush = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--trace") && v) a->trace = argv[++i];
    else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output-dir")) && v && !graph)
      a->o.outdir = argv[++i];
    else if (!strcmp(argv[i], "-v")) a->o.verbose = 1;
    else if (!strcmp(argv[i], "-q") || !strcmp(argv[i], "--quiet")) a->quiet = 1;
    else if (!strcmp(argv[i], "--json") && !graph) a->json = 1;
    else if (!strcmp(argv[i], "--local")) a->o.private_server = 0;
    else if (!strcmp(argv[i], "--checkpoint-every") && v && !graph) {
      char *end;
      a->o.ckpt_every = strtoull(argv[++i], &end, 10);
      if (*end || !a->o.ckpt_every) {
        fprintf(stderr, "fusebox run: --checkpoint-every: expected a count >= 1, not '%s'\n",
                argv[i]);
        return -1;
      }
    } else if (!strcmp(argv[i], "--checkpoint-dir") && v && !graph) a->o.ckpt_dir = argv[++i];
    else if (!strcmp(argv[i], "--checkpoint-key") && v && !graph) a->o.ckpt_key = argv[++i];
    else if (!strcmp(argv[i], "--resume") && v && !graph) a->o.resume = argv[++i];
    else if (!strcmp(argv[i], "--server") && v) a->o.server = argv[++i];
    else if (argv[i][0] != '-' && !a->file) a->file = argv[i];
    else return -1;
  }
  if (!!a->o.ckpt_every != !!a->o.ckpt_dir) {
    fprintf(stderr, "fusebox run: --checkpoint-every and --checkpoint-dir go together\n");
    return -1;
  }
  if (a->o.ckpt_key && a->o.server) {
    fprintf(stderr, "fusebox run: --checkpoint-key is for in-process runs; the fuseboxd at %s "
                    "seals checkpoints with its own key (fuseboxd --checkpoint-key)\n",
            a->o.server);
    return -1;
  }
  if ((a->o.ckpt_every || a->o.resume) && !a->o.server) a->o.private_server = 0; /* in-process */
  if (a->graph_dir || a->trace) { /* they look inside the engine: run it here */
    if (a->o.server) return -1;
    a->o.private_server = 0;
  }
  if (!a->o.server && a->o.private_server) a->o.server = fb_cli_env_server(); /* FUSEBOX_SERVER */
  a->o.progress = !a->quiet && isatty(STDERR_FILENO);
  return a->file ? 0 : -1;
}

static void write_graph(void *user, uint64_t flush, int iteration, const char *pass,
                        const char *when, const char *dot) {
  run_args *a = user;
  char *path = NULL;
  if (asprintf(&path, "%s/flush%llu-%03d-it%02d-%s-%s.dot", a->graph_dir, (unsigned long long)flush,
               a->graphs_written, iteration < 0 ? 0 : iteration, pass, when) < 0)
    return;
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(dot, f);
    fclose(f);
    a->graphs_written++;
  } else {
    fprintf(stderr, "fusebox: %s: %s\n", path, strerror(errno));
  }
  free(path);
}

/* Graph and timeline hooks on the running session. */
static int observe(run_args *a, fb_sess_run *r, char **err) {
  fb_session *s = fb_sess_session(r);
  if (a->graph_dir) {
    if (mkdir(a->graph_dir, 0777) && errno != EEXIST) {
      *err = strdup(strerror(errno));
      return FB_EIO;
    }
    int rc = fb_session_trace_graph(s, a->flush, write_graph, a);
    if (rc) {
      if (asprintf(err, "--graph: the SFG exists in async mode only (%s)", fb_strerror(rc)) < 0)
        *err = NULL;
      return rc;
    }
  }
  if (a->trace && fb_session_trace_begin(s, a->trace)) {
    if (asprintf(err, "--trace: cannot write %s", a->trace) < 0) *err = NULL;
    return FB_EIO;
  }
  return 0;
}

static int finish_observe(run_args *a, fb_sess_run *r) {
  if (!r) return 0;
  fb_session *s = fb_sess_session(r);
  int rc = 0;
  if (a->trace) {
    char *e = NULL;
    fb_sess_sync(r, &e);
    free(e);
    rc = fb_session_trace_end(s);
    if (!rc)
      fprintf(stderr, "timeline written to %s (open it in https://ui.perfetto.dev)\n", a->trace);
  }
  if (a->graph_dir)
    fprintf(stderr, "%d graph%s written to %s/\n", a->graphs_written,
            a->graphs_written == 1 ? "" : "s", a->graph_dir);
  return rc;
}

/* run --json: the outcome as one object. The check lines the runner wrote
 * (into a memory stream) become {index, ok, message}; other lines (-v's
 * return values) go to "output". */
static void print_json(run_args *a, fb_sess_file *f, fb_sess_run *r, const char *lines, int status,
                       double elapsed, const char *err) {
  json_t *o = json_object(), *checks = json_array(), *output = json_array();
  json_object_set_new(o, "file", json_string(a->file));
  if (f->name) json_object_set_new(o, "name", json_string(f->name));
  json_object_set_new(o, "outcome",
                      json_string(status == 0   ? "passed"
                                  : status == 1 ? "failed"
                                                : "error"));
  json_object_set_new(o, "exit_status", json_integer(status));
  json_object_set_new(o, "elapsed_s", json_real(elapsed));
  if (r) {
    char backend[64];
    fb_counters c;
    fb_sess_backend(r, backend, sizeof backend);
    fb_sess_counters(r, &c);
    json_object_set_new(o, "backend", json_string(backend));
    json_object_set_new(o, "counters", fb_cli_counters_json(&c));
  }
  for (const char *p = lines ? lines : ""; *p;) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    char *line = strndup(p, n);
    unsigned long idx;
    char word[8];
    if (line && sscanf(line, "%7s checks[%lu]", word, &idx) == 2 &&
        (!strcmp(word, "ok") || !strcmp(word, "FAIL"))) {
      const char *msg = line + strlen(word);
      while (*msg == ' ') msg++;
      json_array_append_new(checks, json_pack("{sI sb ss}", "index", (json_int_t)idx, "ok",
                                              !strcmp(word, "ok"), "message", msg));
    } else if (line) {
      json_array_append_new(output, json_string(line));
    }
    free(line);
    p += n + (nl != NULL);
  }
  json_object_set_new(o, "checks", checks);
  if (json_array_size(output)) json_object_set(o, "output", output);
  json_decref(output);
  if (err) json_object_set_new(o, "error", json_string(err));
  json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
  fputc('\n', stdout);
  json_decref(o);
}

static int run_common(int argc, char **argv, int graph) {
  run_args a;
  int pr = parse_args(argc, argv, graph, &a);
  if (pr) {
    json_decref(a.params);
    return help(pr > 0 ? stdout : stderr, graph);
  }
  fb_cli_on_interrupt(graph ? "graph" : "run", a.o.progress); /* Ctrl-C: stop, clean up, exit 130 */
  fb_sess_file f;
  fb_sess_run *r = NULL;
  char *err = NULL, *lines = NULL;
  size_t nlines = 0;
  FILE *mem = a.json ? open_memstream(&lines, &nlines) : NULL;
  if (mem) a.o.out = mem; /* the check lines, for print_json */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = fb_sess_load(a.file, a.params, &f, &err);
  json_decref(a.params);
  if (!rc && fb_program_warnings(f.prog)->n) { /* advice only, as `fusebox check` prints it */
    char *w = fb_program_warnings_render(f.prog);
    fputs(w ? w : "", stderr);
    free(w);
  }
  if (!rc && a.o.outdir && mkdir(a.o.outdir, 0777) && errno != EEXIST) {
    if (asprintf(&err, "--output-dir %s: %s", a.o.outdir, strerror(errno)) < 0) err = NULL;
    rc = FB_EIO;
  }
  if (!rc && a.o.ckpt_dir && mkdir(a.o.ckpt_dir, 0777) && errno != EEXIST) {
    if (asprintf(&err, "--checkpoint-dir %s: %s", a.o.ckpt_dir, strerror(errno)) < 0) err = NULL;
    rc = FB_EIO;
  }
  if (!rc) rc = fb_sess_start(&f, &a.o, &r, &err);
  if (!rc) rc = observe(&a, r, &err);
  if (!rc) rc = fb_sess_actions(r, "setup", &err);
  if (!rc) rc = fb_sess_actions(r, "step", &err);
  if (!rc) rc = fb_sess_sync(r, &err); /* every launch ran: a failed one fails the run */
  int failed = 0;
  if (!rc) {
    failed = fb_sess_checks(r, &err);
    if (failed < 0) rc = failed;
  }
  if (finish_observe(&a, r) && !rc) rc = FB_EIO;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double elapsed = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  int status = rc ? 2 : failed ? 1 : 0;
  if (rc) fprintf(stderr, "fusebox %s: %s\n", graph ? "graph" : "run", err ? err : fb_strerror(rc));
  if (mem) {
    fclose(mem);
    print_json(&a, &f, r, lines, status, elapsed, rc ? (err ? err : fb_strerror(rc)) : NULL);
    free(lines);
  } else if (!rc) {
    printf("%s: %s (%.2f s)\n", f.name, failed ? "checks FAILED" : "all checks passed", elapsed);
  }
  free(err);
  fb_sess_stop(r);
  fb_sess_free(&f);
  return status;
}

int fb_cli_run(int argc, char **argv) { return run_common(argc, argv, 0); }
int fb_cli_graph(int argc, char **argv) { return run_common(argc, argv, 1); }
