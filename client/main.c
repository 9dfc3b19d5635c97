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
          "       fusebox --version\n"
          "\n"
          "commands:\n"
          "  check FILE.fbk              check a program; print every error with line:col\n"
          "  ir FILE.fbk [--kernel NAME] print the IR of each kernel and of its tasks\n"
          "  run SESSION.json            run a JSON session once and evaluate its checks\n"
          "  bench SESSION.json...       run sessions in several engine modes; compare\n"
          "  graph SESSION.json          write the state-flow graph before/after each pass\n"
          "  ping --server ADDR          health check of a fuseboxd\n"
          "  stats --server ADDR [--json] a fuseboxd's counters, sessions and memory\n"
          "  help [COMMAND]              this text, or the help of COMMAND\n"
          "  version                     the version (also --version, -V)\n"
          "\n"
          "Run 'fusebox help COMMAND' or 'fusebox COMMAND --help' for the options of a command.\n"
          "environment:\n"
          "  FUSEBOX_SERVER=ADDR   the default of --server (run, bench, ping, stats);\n"
          "                        run --local / bench --local ignore it\n"
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

const char *fb_cli_env_server(void) {
  const char *s = getenv("FUSEBOX_SERVER");
  return s && *s ? s : NULL;
}

typedef int (*command_fn)(int argc, char **argv);

static const struct {
  const char *name;
  command_fn fn;
} commands[] = {
    {"check", fb_cli_check}, {"ir", fb_cli_ir},     {"run", fb_cli_run},    {"bench", fb_cli_bench},
    {"graph", fb_cli_graph}, {"ping", fb_cli_ping}, {"stats", fb_cli_stats},
};

static command_fn find_command(const char *name) {
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(commands[i].name, name)) return commands[i].fn;
  return NULL;
}

static int unknown(const char *what, const char *name) {
  fprintf(stderr, "fusebox: unknown %s '%s' (commands: check, ir, run, bench, graph, ping, stats, "
          "help, version; run 'fusebox help' for more)\n", what, name);
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) { usage(stderr); return 2; }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
    printf("fusebox %s\n", FB_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    if (argc < 3) { usage(stdout); return 0; }
    command_fn fn = find_command(argv[2]); /* fusebox help CMD: CMD --help */
    if (!fn) return unknown("command", argv[2]);
    char *args[] = {argv[2], "--help", NULL};
    return fn(2, args);
  }
  command_fn fn = find_command(cmd);
  if (fn) return fn(argc - 1, argv + 1);
  return unknown(cmd[0] == '-' ? "option" : "command", cmd);
}
