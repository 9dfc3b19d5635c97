/* Documentation that must follow the code:
 * - the op table of docs/ir.md ("Statements") lists every op of
 *   include/fusebox/ops.h exactly once, names no other op, and puts each op
 *   in the row whose text form the printer uses for it (fb__text_form,
 *   ir/print.c). A new op fails this test until docs/ir.md lists it;
 * - every option `fuseboxd --help` prints is in deploy/README.md (as the
 *   flag or as its config-file key), and every option `fusebox run --help`
 *   prints is in docs/sessions.md (the page of `fusebox run`);
 * - docs/codes.md has a row for every error code of include/fusebox/errors.h
 *   and every counter of FB_COUNTERS (include/fusebox/counters.h, with the
 *   list's unit and meaning), and no other row; deploy/README.md names each
 *   counter's /metrics family;
 * - every repository path named in the docs (docs, README.md and the
 *   folders' READMEs) exists: `backticked` paths that start with a top
 *   folder, and Markdown link targets (allow-list below, with reasons); a
 *   planted doc shows what counts as a path and that a wrong one fails. */
#include <ctype.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fusebox/counters.h"
#include "fusebox/ir.h"
#include "ir/ir_internal.h"
#include "proto/convert.h"
#include "support/support.h"

/* Every op name, from the X-macro (not from fb_op_table, so the test reads
 * ops.h itself). */
static const char *const op_names[] = {
#define FB_OP(e, name, nargs, cls, flags) name,
#include "fusebox/ops.h"
#undef FB_OP
};
#define NOPS ((int)(sizeof op_names / sizeof op_names[0]))

/* The form column of docs/ir.md and fb__text_form's letter for it. */
static const struct {
  const char *form;
  int letter;
} forms[] = {
    {"op %a, %b, ...", 'p'},    {"op %a, ..., INT", 'i'},     {"op INT", 'i'},
    {"const.T LITERAL", 'c'},   {"op F[%i, ...]", 'g'},       {"op F[]", 'g'},
    {"op F[%i, ...], %v", 'v'}, {"op %v covers F", 'h'},      {"if %c {", 'f'},
    {"while {", 'w'},           {"op %N in %a .. %b {", 'r'}, {"struct_for %N over F {", 's'},
};

static int op_index(const char *name, size_t len) {
  for (int i = 0; i < NOPS; i++)
    if (strlen(op_names[i]) == len && strncmp(op_names[i], name, len) == 0) return i;
  return -1;
}

/* The letter of a form cell ("`op F[]`", backticks and spaces around), or 0. */
static int form_letter(const char *cell, size_t len) {
  while (len && (*cell == ' ' || *cell == '`')) cell++, len--;
  while (len && (cell[len - 1] == ' ' || cell[len - 1] == '`')) len--;
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
    if (strlen(forms[i].form) == len && strncmp(forms[i].form, cell, len) == 0)
      return forms[i].letter;
  return 0;
}

START_TEST(test_ir_md_lists_every_op) {
  char *md = fbt_read_file(fbt_path("../docs/ir.md"), NULL);
  ck_assert_msg(md != NULL, "cannot read docs/ir.md");
  const char *p = strstr(md, "\n## Statements\n");
  ck_assert_msg(p != NULL, "docs/ir.md has no '## Statements' section");
  int seen[NOPS];
  memset(seen, 0, sizeof seen);
  int rows = 0, bad = 0, in_table = 0;
  for (p++; *p;) {
    const char *eol = strchr(p, '\n');
    size_t n = eol ? (size_t)(eol - p) : strlen(p);
    if (n > 0 && *p == '|') {
      in_table = 1;
      /* cells: | form | ops | operands | */
      const char *c1 = p + 1, *b1 = memchr(c1, '|', n - 1);
      const char *c2 = b1 ? b1 + 1 : NULL;
      const char *b2 = c2 ? memchr(c2, '|', (size_t)(p + n - c2)) : NULL;
      ck_assert_msg(b2 != NULL, "docs/ir.md: malformed table row: %.*s", (int)n, p);
      if (strncmp(c1, "---", 3) != 0 && strncmp(c2, " ops ", 5) != 0) {
        rows++;
        int letter = form_letter(c1, (size_t)(b1 - c1));
        if (!letter) {
          fprintf(stderr, "docs/ir.md: unknown form %.*s\n", (int)(b1 - c1), c1);
          bad++;
        }
        for (const char *w = c2; w < b2;) {
          while (w < b2 && *w == ' ') w++;
          const char *e = w;
          while (e < b2 && *e != ' ') e++;
          if (e == w) break;
          int op = op_index(w, (size_t)(e - w));
          if (op < 0) {
            fprintf(stderr, "docs/ir.md lists '%.*s', which is not an op of ops.h\n", (int)(e - w),
                    w);
            bad++;
          } else {
            if (seen[op]++) {
              fprintf(stderr, "docs/ir.md lists '%s' twice\n", op_names[op]);
              bad++;
            }
            if (letter && fb__text_form(op) != letter) {
              fprintf(stderr, "docs/ir.md lists '%s' under form %.*s; it prints as '%c'\n",
                      op_names[op], (int)(b1 - c1), c1, fb__text_form(op));
              bad++;
            }
          }
          w = e;
        }
      }
    } else if (in_table) {
      break; /* the end of the first table of the section */
    }
    if (!eol) break;
    p = eol + 1;
  }
  ck_assert_msg(rows > 0, "docs/ir.md: no op table under '## Statements'");
  for (int i = 0; i < NOPS; i++)
    if (!seen[i]) {
      fprintf(stderr, "docs/ir.md does not list the op '%s' of ops.h\n", op_names[i]);
      bad++;
    }
  ck_assert_int_eq(NOPS, FB_OP__COUNT);
  ck_assert_msg(bad == 0, "docs/ir.md and include/fusebox/ops.h disagree (%d problems above)", bad);
  free(md);
}
END_TEST

static char *read_repo(const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "../%s", rel);
  char *text = fbt_read_file(fbt_path(path), NULL);
  ck_assert_msg(text != NULL, "cannot read %s", rel);
  return text;
}

/* Does text hold word as a whole token (not followed by a letter, digit,
 * '-' or '_')? */
static int has_token(const char *text, const char *word) {
  size_t n = strlen(word);
  for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
    char c = p[n];
    if (!isalnum((unsigned char)c) && c != '-' && c != '_') return 1;
  }
  return 0;
}

/* What `exe args --help` prints (exe under FB_BUILD_DIR), which must exit
 * 0. */
static char *help_text(const char *exe, const char *args) {
  const char *build = getenv("FB_BUILD_DIR");
  ck_assert_msg(build != NULL, "FB_BUILD_DIR is not set");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s/%s' %s --help 2>&1", build, exe, args);
  FILE *f = popen(cmd, "r");
  ck_assert_msg(f != NULL, "cannot run %s", cmd);
  size_t cap = 1 << 16, len = 0;
  char *help = malloc(cap);
  ck_assert_ptr_nonnull(help);
  for (size_t r; (r = fread(help + len, 1, cap - 1 - len, f)) > 0;) len += r;
  help[len] = 0;
  int st = pclose(f);
  ck_assert_msg(st == 0, "%s exited with status %d", cmd, st);
  return help;
}

/* Each long option (--word) of help that doc does not name, as the flag
 * or (with_key) as its config-file key in backticks (--max-calls:
 * `max_calls`), is said on stderr and counted. *options: how many. */
static int undocumented(const char *help, const char *doc, const char *md, int with_key,
                        int *options) {
  int bad = 0;
  *options = 0;
  char seen[4096] = " "; /* " --a --b ": each option once */
  for (const char *p = help; (p = strstr(p, "--")) != NULL;) {
    const char *e = p + 2;
    while (islower((unsigned char)*e) || isdigit((unsigned char)*e) || *e == '-') e++;
    if (e - p > 2 && islower((unsigned char)p[2]) && (p == help || !isalnum((unsigned char)p[-1]))) {
      char flag[128], key[130];
      snprintf(flag, sizeof flag, "%.*s", (int)(e - p), p);
      snprintf(key, sizeof key, "`%s`", flag + 2); /* the config file's key */
      for (char *k = key; *k; k++)
        if (*k == '-') *k = '_';
      char once[132];
      snprintf(once, sizeof once, " %s ", flag);
      if (strstr(seen, once) || strlen(seen) + strlen(once) >= sizeof seen) {
        p = e;
        continue;
      }
      strcat(seen, flag);
      strcat(seen, " ");
      (*options)++;
      if (!has_token(md, flag) && !(with_key && strstr(md, key))) {
        fprintf(stderr, "%s does not document %s%s%s\n", doc, flag, with_key ? " (nor the key " : "",
                with_key ? key : "");
        if (with_key) fprintf(stderr, ")\n");
        bad++;
      }
    }
    p = e;
  }
  return bad;
}

START_TEST(test_help_options_in_deploy_readme) {
  char *help = help_text("server/fuseboxd", "");
  char *md = read_repo("deploy/README.md");
  int options, bad = undocumented(help, "deploy/README.md", md, 1, &options);
  ck_assert_msg(options >= 40, "fuseboxd --help shows only %d options", options);
  ck_assert_msg(bad == 0, "%d options of fuseboxd --help are not in deploy/README.md", bad);
  free(md);
  free(help);
}
END_TEST

/* `fusebox run --help`: docs/sessions.md is the page of `fusebox run`. */
START_TEST(test_run_help_options_in_sessions_md) {
  char *help = help_text("client/fusebox", "run");
  char *md = read_repo("docs/sessions.md");
  int options, bad = undocumented(help, "docs/sessions.md", md, 0, &options);
  ck_assert_msg(options >= 12, "fusebox run --help shows only %d options", options);
  ck_assert_msg(bad == 0, "%d options of fusebox run --help are not in docs/sessions.md", bad);
  /* the check sees an option the page lacks */
  int n;
  ck_assert_int_eq(undocumented("  --no-such-option  x\n  --server ADDR\n", "a page",
                                "`--server`", 0, &n), 1);
  ck_assert_int_eq(n, 2);
  free(md);
  free(help);
}
END_TEST

/* The names in `backticks` at the start of the table rows after heading,
 * up to the next heading: how many, and whether name is among them. */
static int table_rows(const char *md, const char *heading, const char *name, int *found) {
  const char *p = strstr(md, heading);
  ck_assert_msg(p != NULL, "docs/codes.md has no '%s'", heading);
  int rows = 0;
  *found = 0;
  for (p += strlen(heading) - 1; p && p[1] && p[1] != '#'; p = strchr(p + 1, '\n')) {
    if (strncmp(p + 1, "| `", 3) != 0) continue;
    const char *b = p + 4, *e = strchr(b, '`');
    if (!e) continue;
    rows++;
    if (name && strlen(name) == (size_t)(e - b) && strncmp(b, name, (size_t)(e - b)) == 0)
      (*found)++;
  }
  return rows;
}

static const char *const code_names[] = {
#define FB_ERR(name, value, msg, status) "FB_" #name,
#include "fusebox/errors.h"
#undef FB_ERR
};

/* The counters with their unit and meaning, from the list itself. */
static const struct {
  const char *name, *unit, *meaning;
} counter_list[] = {
#define FB_COUNTER_DOC_(name, type, kind, unit, meaning) {#name, unit, meaning},
    FB_COUNTERS(FB_COUNTER_DOC_)
#undef FB_COUNTER_DOC_
};

START_TEST(test_codes_and_counters_documented) {
  char *md = read_repo("docs/codes.md");
  int bad = 0, found, n = 0;
  for (size_t i = 0; i < sizeof code_names / sizeof code_names[0]; i++) {
    if (strcmp(code_names[i], "FB_OK") == 0) continue;
    n++;
    table_rows(md, "\n## Error codes\n", code_names[i], &found);
    if (found != 1) {
      fprintf(stderr, "docs/codes.md has %d rows for the error code %s\n", found, code_names[i]);
      bad++;
    }
  }
  int rows = table_rows(md, "\n## Error codes\n", NULL, &found);
  if (rows != n) {
    fprintf(stderr, "docs/codes.md lists %d error codes; errors.h has %d\n", rows, n);
    bad++;
  }
  /* counters: one row per entry of FB_COUNTERS (test_proto holds the
     protocol's Counters to the same list), whose unit and meaning are the
     list's, word for word */
  int nc = 0;
  for (size_t i = 0; i < sizeof counter_list / sizeof counter_list[0]; i++, nc++) {
    const char *name = counter_list[i].name;
    table_rows(md, "\n## Counters\n", name, &found);
    if (found != 1) {
      fprintf(stderr, "docs/codes.md has %d rows for the counter %s\n", found, name);
      bad++;
      continue;
    }
    char want[512];
    snprintf(want, sizeof want, "| `%s` | %s | %s |\n", name, counter_list[i].unit,
             counter_list[i].meaning);
    if (!strstr(md, want)) {
      fprintf(stderr, "docs/codes.md: the row of %s is not '%.*s' (FB_COUNTERS, counters.h)\n",
              name, (int)strlen(want) - 1, want);
      bad++;
    }
  }
  rows = table_rows(md, "\n## Counters\n", NULL, &found);
  if (rows != nc) {
    fprintf(stderr, "docs/codes.md lists %d counters; FB_COUNTERS has %d\n", rows, nc);
    bad++;
  }
  ck_assert_msg(n >= 15 && nc >= 18, "too few codes (%d) or counters (%d)", n, nc);
  ck_assert_msg(bad == 0, "docs/codes.md is out of date (%d problems above)", bad);
  free(md);
}
END_TEST

/* Every counter's /metrics family (server/metrics.c: NAME, "_s" spelled
 * "_seconds" for seconds, "_total" for a cumulative one) is named in
 * deploy/README.md, as `fusebox_FAMILY` or as the suffix `_FAMILY`. */
START_TEST(test_metrics_families_in_deploy_readme) {
  char *md = read_repo("deploy/README.md");
  int bad = 0;
  static const int level[] = {
#define FB_COUNTER_LEVEL_SUM 0
#define FB_COUNTER_LEVEL_LEVEL 1
#define FB_COUNTER_KIND_(name, type, kind, unit, meaning) FB_COUNTER_LEVEL_##kind,
      FB_COUNTERS(FB_COUNTER_KIND_)
#undef FB_COUNTER_KIND_
  };
  for (size_t i = 0; i < sizeof counter_list / sizeof counter_list[0]; i++) {
    const char *name = counter_list[i].name;
    size_t len = strlen(name);
    int secs = !strcmp(counter_list[i].unit, "seconds") && len > 2 && !strcmp(name + len - 2, "_s");
    char fam[128], full[140], suffix[140];
    snprintf(fam, sizeof fam, "%.*s%s%s", (int)(secs ? len - 2 : len), name,
             secs ? "_seconds" : "", level[i] ? "" : "_total");
    snprintf(full, sizeof full, "`fusebox_%s`", fam);
    snprintf(suffix, sizeof suffix, "`_%s`", fam);
    if (!strstr(md, full) && !strstr(md, suffix)) {
      fprintf(stderr, "deploy/README.md does not name the /metrics family of the counter %s "
              "(%s or %s)\n", name, full, suffix);
      bad++;
    }
  }
  ck_assert_msg(bad == 0, "%d counters' /metrics families are not in deploy/README.md", bad);
  free(md);
}
END_TEST

/* Paths in the docs that are not in this tree, on purpose. */
static const struct {
  const char *path, *why;
} not_in_tree[] = {
    {"tests/test_differential", "the built test executable, in the build folder"},
    {"tests/fakecuda/libfakecuda.so", "the built fake driver, in the build folder"},
    {"tests/python/", "Taichi's repository (its own tests), not this one"},
    {"examples/autodiff/minimization.py", "an example of the taichi wheel"},
    {"examples/autodiff/simple_derivative.py", "an example of the taichi wheel"},
    {"examples/diffmpm.py", "DiffTaichi's repository"},
    {"examples/autodiff/jacobian.py", "an example of the taichi wheel"},
    {"examples/heat_async", "a step name of the GPU check (docs/gpu.md), not a file"},
    {"share/doc/fusebox", "where `cmake --install` puts the docs"},
    {"share/bash-completion/completions/fusebox", "where `cmake --install` puts the completion"},
};

static int path_exists(const char *rel, const char *doc_dir) {
  char path[1024];
  struct stat st;
  snprintf(path, sizeof path, "%s/../%s", getenv("FB_TEST_DIR"), rel);
  if (stat(path, &st) == 0) return 1;
  snprintf(path, sizeof path, "%s/../%s/%s", getenv("FB_TEST_DIR"), doc_dir, rel);
  if (stat(path, &st) == 0) return 1;
  /* a stem that names NAME.fbk and NAME.json alike (bench/large/mpm3d) */
  snprintf(path, sizeof path, "%s/../%s.*", getenv("FB_TEST_DIR"), rel);
  glob_t g;
  int ok = glob(path, 0, NULL, &g) == 0 && g.gl_pathc > 0;
  globfree(&g);
  return ok;
}

/* The top folders of this repository a path in the docs may start with:
 * these (so that a doc naming a folder that went away is still read as a
 * path, and fails), and every folder at the top of the tree now (so that a
 * folder added later is checked without a change here). */
static int top_folder(const char *tok) {
  static const char *const tops[] = {"base/",    "bench/",  "client/", "codegen/", "deploy/",
                                     "docs/",    "engine/", "examples/", "include/", "ir/",
                                     "lang/",    "optimizer/", "proto/", "python/", "runtime/",
                                     "scripts/", "server/", "share/",  "tests/",   ".ci/"};
  for (size_t i = 0; i < sizeof tops / sizeof tops[0]; i++)
    if (strncmp(tok, tops[i], strlen(tops[i])) == 0) return 1;
  const char *slash = strchr(tok, '/');
  if (!slash || slash == tok || tok[0] == '.' || strncmp(tok, "build", 5) == 0) return 0;
  char path[1024];
  struct stat st;
  snprintf(path, sizeof path, "%s/../%.*s", getenv("FB_TEST_DIR"), (int)(slash - tok), tok);
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Does a `token` look like a path in this repository: a top folder of it
 * first, no placeholder (NAME, *, <...>, $VAR, ...)? */
static int repo_path(const char *tok) {
  if (!top_folder(tok)) return 0;
  for (const char *c = tok; *c; c++)
    if (strchr("*<>${} ", *c)) return 0;
  return !strstr(tok, "NAME") && !strstr(tok, "...");
}

/* A Markdown link's target ([text](TARGET)) that names a file of the tree,
 * relative to the doc's folder: no URL, no anchor alone, only path
 * characters, and a folder or an extension in it (not `f(0.0)` in prose). */
static int link_path(const char *t) {
  if (!*t || strstr(t, "://") || !strncmp(t, "mailto:", 7)) return 0;
  for (const char *c = t; *c; c++)
    if (!isalnum((unsigned char)*c) && !strchr("_./-", *c)) return 0;
  if (strchr(t, '/')) return 1;
  const char *dot = strrchr(t, '.');
  return dot && isalpha((unsigned char)dot[1]);
}

static int allowed_missing(const char *tok) {
  for (size_t a = 0; a < sizeof not_in_tree / sizeof not_in_tree[0]; a++)
    if (strcmp(tok, not_in_tree[a].path) == 0) return 1;
  return 0;
}

/* The paths named in one doc (rel, in folder dir, text md) that are not in
 * the tree, said on stderr and counted; *paths counts those read:
 *  - `backticked` tokens that start with a top folder (repo_path), taken
 *    from the top of the tree or from the doc's folder, a :line or #anchor
 *    and trailing punctuation dropped;
 *  - the targets of Markdown links outside ``` blocks (link_path), taken
 *    from the doc's folder as a Markdown viewer does. */
static int missing_paths(const char *rel, const char *dir, const char *md, int *paths) {
  int bad = 0;
  for (const char *p = strchr(md, '`'); p; p = strchr(p + 1, '`')) {
    const char *e = strchr(p + 1, '`');
    if (!e) break;
    char tok[512];
    size_t n = (size_t)(e - p - 1);
    if (n == 0 || n >= sizeof tok || memchr(p + 1, '\n', n)) {
      p = e;
      continue;
    }
    memcpy(tok, p + 1, n);
    tok[n] = 0;
    p = e;
    tok[strcspn(tok, ":#")] = 0; /* file:line, file#anchor */
    for (size_t l = strlen(tok); l && strchr(".,;)", tok[l - 1]); l--) tok[l - 1] = 0;
    if (!strchr(tok, '/') || !repo_path(tok)) continue;
    (*paths)++;
    if (!allowed_missing(tok) && !path_exists(tok, dir)) {
      fprintf(stderr, "%s names %s, which is not in the tree\n", rel, tok);
      bad++;
    }
  }
  int fenced = 0;
  for (const char *line = md; line && *line;) {
    const char *eol = strchr(line, '\n');
    size_t len = eol ? (size_t)(eol - line) : strlen(line);
    const char *l = line;
    while (l < line + len && *l == ' ') l++;
    if (!strncmp(l, "```", 3)) fenced = !fenced;
    for (const char *q = line; !fenced && (q = strstr(q, "](")) != NULL && q < line + len; q += 2) {
      const char *t = q + 2, *close = memchr(t, ')', (size_t)(line + len - t));
      if (!close) break;
      char tok[512];
      size_t n = (size_t)(close - t);
      if (n == 0 || n >= sizeof tok) continue;
      memcpy(tok, t, n);
      tok[n] = 0;
      tok[strcspn(tok, "#")] = 0;
      if (!link_path(tok)) continue;
      (*paths)++;
      char from_dir[1024];
      struct stat st;
      snprintf(from_dir, sizeof from_dir, "%s/../%s/%s", getenv("FB_TEST_DIR"), dir, tok);
      if (stat(from_dir, &st) != 0) {
        fprintf(stderr, "%s links to %s, which is not in the tree (from %s/)\n", rel, tok, dir);
        bad++;
      }
    }
    line = eol ? eol + 1 : NULL;
  }
  return bad;
}

START_TEST(test_doc_paths_exist) {
  static const char *const patterns[] = {"docs/*.md", "README.md", "*/README.md", "*/*/README.md",
                                         "*/*/*/README.md"};
  glob_t g;
  int files = 0, paths = 0, bad = 0;
  for (size_t k = 0; k < sizeof patterns / sizeof patterns[0]; k++) {
    char pat[1024];
    snprintf(pat, sizeof pat, "%s/../%s", getenv("FB_TEST_DIR"), patterns[k]);
    if (glob(pat, 0, NULL, &g) != 0) continue;
    for (size_t i = 0; i < g.gl_pathc; i++) {
      const char *rel = g.gl_pathv[i] + strlen(getenv("FB_TEST_DIR")) + 4;
      if (strncmp(rel, "build", 5) == 0) continue; /* build folders inside the tree */
      char *md = fbt_read_file(g.gl_pathv[i], NULL);
      ck_assert_msg(md != NULL, "cannot read %s", rel);
      files++;
      char dir[512];
      snprintf(dir, sizeof dir, "%s", rel);
      char *slash = strrchr(dir, '/');
      if (slash) *slash = 0;
      else strcpy(dir, ".");
      bad += missing_paths(rel, dir, md, &paths);
      free(md);
    }
    globfree(&g);
  }
  ck_assert_msg(files >= 20 && paths >= 200, "only %d docs, %d paths read", files, paths);
  ck_assert_msg(bad == 0, "%d paths named in the docs do not exist (above)", bad);
}
END_TEST

/* The check on a planted doc: what it reads as a path, and what it finds
 * missing. */
START_TEST(test_doc_paths_planted) {
  static const char planted[] =
      "The metrics are in `server/metrics.c` (see `server/metrics.c:120`), the\n"
      "codes in `docs/codes.md#counters`. A wrong one: `server/no_such_file.c`.\n"
      "Placeholders are not paths: `server/NAME.c`, `tests/*.c`, `docs/<page>.md`.\n"
      "Not in the tree, on purpose: `tests/test_differential`.\n"
      "Links: [sessions](sessions.md), [the top](../README.md), [gone](gone.md),\n"
      "[a folder gone](../no_such_folder/x.c), a web page [p](https://example.org/a/b),\n"
      "an anchor [a](#counters) and prose f(x) or f[i](0.0).\n"
      "```\n"
      "x[i](a/b/c)  # code, not a link\n"
      "```\n";
  int paths = 0;
  int bad = missing_paths("docs/planted.md", "docs", planted, &paths);
  ck_assert_int_eq(bad, 3);    /* no_such_file.c, gone.md, ../no_such_folder/x.c */
  ck_assert_int_eq(paths, 9);  /* 5 in backticks, 4 links */
  /* a folder of the tree now that the fixed list lacks is read as one; a
     word before a slash that is no folder of the tree is not */
  ck_assert(top_folder("tests/x") && top_folder("server/x"));
  ck_assert(!top_folder("and/or") && !top_folder("build/x"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("docs");
  TCase *tc = tcase_create("ir_md");
  tcase_add_test(tc, test_ir_md_lists_every_op);
  tcase_add_test(tc, test_help_options_in_deploy_readme);
  tcase_add_test(tc, test_run_help_options_in_sessions_md);
  tcase_add_test(tc, test_codes_and_counters_documented);
  tcase_add_test(tc, test_metrics_families_in_deploy_readme);
  tcase_add_test(tc, test_doc_paths_exist);
  tcase_add_test(tc, test_doc_paths_planted);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
