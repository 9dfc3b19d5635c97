/* Documentation that must follow the code: the op table of docs/ir.md
 * ("Statements") lists every op of include/fusebox/ops.h exactly once, names
 * no other op, and puts each op in the row whose text form the printer uses
 * for it (fb__text_form, ir/print.c). A new op fails this test until
 * docs/ir.md lists it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"
#include "ir/ir_internal.h"
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

int main(void) {
  Suite *s = suite_create("docs");
  TCase *tc = tcase_create("ir_md");
  tcase_add_test(tc, test_ir_md_lists_every_op);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
