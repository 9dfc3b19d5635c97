/* fusebox: the command line of Fusebox. Dispatches to the subcommands in
 * cli/cli_*.c. Every subcommand takes --help. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

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
          "  FUSEBOX_TLS_CA=FILE   TLS to a host:port server: the CA of its certificate\n"
          "  FUSEBOX_TLS_CERT=FILE, FUSEBOX_TLS_KEY=FILE   a client certificate (mTLS)\n"
          "  FUSEBOX_TOKEN=TOKEN   sent as 'authorization: Bearer TOKEN' (tenants); never in\n"
          "                        the clear off loopback unless FUSEBOX_INSECURE=1\n"
          "  Every command also takes --tls-ca FILE, --tls-cert FILE, --tls-key FILE and\n"
          "  --token-file FILE (the token, read from a file), which set the variables above.\n"
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
      if (!nb) {
        free(buf);
        buf = NULL;
      }
      buf = nb;
    }
  }
  int e = ferror(f);
  fclose(f);
  if (!buf || e) {
    free(buf);
    errno = e ? EIO : ENOMEM;
    return NULL;
  }
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

/* The security options every command takes: each sets its environment
 * variable (which libfusebox reads) and leaves argv. 0, or 2 after an
 * error message. */
static int security_options(int *argc, char **argv) {
  static const char *const flags[] = {"--tls-ca", "--tls-cert", "--tls-key", "--token-file"};
  static const char *const envs[] = {"FUSEBOX_TLS_CA", "FUSEBOX_TLS_CERT", "FUSEBOX_TLS_KEY",
                                     "FUSEBOX_TOKEN"};
  int out = 1;
  for (int i = 1; i < *argc; i++) {
    int k = -1;
    const char *v = NULL;
    for (int f = 0; f < 4 && k < 0; f++) {
      size_t n = strlen(flags[f]);
      if (!strcmp(argv[i], flags[f])) k = f, v = i + 1 < *argc ? argv[++i] : NULL;
      else if (!strncmp(argv[i], flags[f], n) && argv[i][n] == '=') k = f, v = argv[i] + n + 1;
    }
    if (k < 0) {
      argv[out++] = argv[i];
      continue;
    }
    if (!v || !*v) {
      fprintf(stderr, "fusebox: %s: missing file name\n", flags[k]);
      return 2;
    }
    char *tok = NULL;
    if (k == 3) { /* the token itself never appears on the command line */
      if (!(tok = fb_cli_read_file(v, NULL))) {
        fprintf(stderr, "fusebox: --token-file: cannot read '%s': %s\n", v, strerror(errno));
        return 2;
      }
      size_t n = strlen(tok);
      while (n && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ')) tok[--n] = 0;
      if (!n) {
        fprintf(stderr, "fusebox: --token-file: '%s' is empty\n", v);
        free(tok);
        return 2;
      }
    }
    setenv(envs[k], tok ? tok : v, 1);
    free(tok);
  }
  *argc = out;
  argv[out] = NULL;
  return 0;
}

typedef int (*command_fn)(int argc, char **argv);

static const struct {
  const char *name;
  command_fn fn;
} commands[] = {
    {"check", fb_cli_check}, {"ir", fb_cli_ir},       {"run", fb_cli_run},
    {"bench", fb_cli_bench}, {"graph", fb_cli_graph}, {"ping", fb_cli_ping},
    {"stats", fb_cli_stats},
};

static command_fn find_command(const char *name) {
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(commands[i].name, name)) return commands[i].fn;
  return NULL;
}

static int unknown(const char *what, const char *name) {
  fprintf(stderr,
          "fusebox: unknown %s '%s' (commands: check, ir, run, bench, graph, ping, stats, "
          "help, version; run 'fusebox help' for more)\n",
          what, name);
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
    printf("fusebox %s\n", FB_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    if (argc < 3) {
      usage(stdout);
      return 0;
    }
    command_fn fn = find_command(argv[2]); /* fusebox help CMD: CMD --help */
    if (!fn) return unknown("command", argv[2]);
    char *args[] = {argv[2], "--help", NULL};
    return fn(2, args);
  }
  command_fn fn = find_command(cmd);
  if (fn && security_options(&argc, argv)) return 2;
  if (fn) return fn(argc - 1, argv + 1);
  return unknown(cmd[0] == '-' ? "option" : "command", cmd);
}
