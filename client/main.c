/* fusebox: the command line of Fusebox. Dispatches to the subcommands in
 * client/cli_*.c. Every subcommand takes --help. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: fusebox COMMAND [ARGS...]\n"
          "\n"
          "commands:\n"
          "  check FILE.fbk              check a program; print every error with line:col\n"
          "  ir FILE.fbk [--kernel NAME] print the IR of each kernel and of its tasks\n"
          "  run SESSION.json            run a JSON session once and evaluate its checks\n"
          "  bench SESSION.json...       run sessions in several engine modes; compare\n"
          "  graph SESSION.json          write the state-flow graph before/after each pass\n"
          "  ping --server ADDR          health check of a fuseboxd\n"
          "  stats --server ADDR         a fuseboxd's counters, sessions and memory\n"
          "  help                        this text\n"
          "\n"
          "Run 'fusebox COMMAND --help' for the options of a command.\n"
          "examples:\n"
          "  fusebox check examples/heat.fbk\n"
          "  fusebox ir examples/saxpy.fbk --kernel init\n"
          "  fusebox run examples/life.json                 # on a private fuseboxd\n"
          "  fusebox run examples/life.json --server 127.0.0.1:7070\n"
          "  fusebox bench examples/heat.json --modes sync,async\n");
}

char *fb_cli_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
    n += got;
    if (cap - n - 1 == 0) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) { free(buf); buf = NULL; }
      buf = nb;
    }
  }
  int e = ferror(f);
  fclose(f);
  if (!buf || e) { free(buf); errno = e ? EIO : ENOMEM; return NULL; }
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

int fb_cli_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) { usage(stderr); return 2; }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) { usage(stdout); return 0; }
  if (!strcmp(cmd, "check")) return fb_cli_check(argc - 1, argv + 1);
  if (!strcmp(cmd, "ir")) return fb_cli_ir(argc - 1, argv + 1);
  if (!strcmp(cmd, "run")) return fb_cli_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return fb_cli_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "graph")) return fb_cli_graph(argc - 1, argv + 1);
  if (!strcmp(cmd, "ping")) return fb_cli_ping(argc - 1, argv + 1);
  if (!strcmp(cmd, "stats")) return fb_cli_stats(argc - 1, argv + 1);
  fprintf(stderr, "fusebox: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
