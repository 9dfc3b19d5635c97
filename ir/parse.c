/* The IR text parser: reads what ir/print.c writes (docs/ir.md has the
 * grammar) back into a layout and kernels. The format is line oriented, so
 * the parser works one line at a time: a line is lexed into tokens, then
 * handled by the construct it sits in (top level, layout, kernel block).
 * A line that fails is reported as "line:col: message" and skipped; braces
 * at its ends still open and close blocks, so one mistake does not hide the
 * errors after it. Statement types are stored as written: type rules are
 * the verifier's. Statement ids are kept as written; a statement without
 * one takes the id after the previous statement's (see resolve_ids). */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "ir_internal.h"

#define MAX_ID (1 << 20)  /* largest statement id accepted */
#define MAX_DEPTH 200     /* nesting of braces */
#define MAX_ERRORS 50     /* then give up */
#define RECOVERED 1       /* a line handler reported an error and recovered */

/* ---------------------------------------------------------------- state */

enum {
  TK_EOL,
  TK_NAME,
  TK_NUM,
  TK_ID,
  TK_STR,
  TK_PUNCT
};

typedef struct tok {
  int kind;
  int col;       /* 1-based */
  const char *s; /* into the source text */
  int n;
} tok;

/* What an open brace belongs to. */
enum {
  FR_LAYOUT,
  FR_NODE,
  FR_KERNEL,
  FR_THEN,
  FR_ELSE,
  FR_BODY,
  FR_SKIP
};

typedef struct frame {
  int kind;
  int ref;   /* FR_NODE: SNode id (-1: dropped); kernel frames: block id */
  int owner; /* FR_THEN: index of the if statement in kstate.ps */
  int line, col;
  char what[40];
} frame;

/* A statement as parsed, before ids are final. */
typedef struct pstmt {
  fb_stmt s;
  int id; /* as written, -1 when implicit */
  int line, col;
  int acol[FB_MAX_ARGS]; /* column of each operand, for "undefined" */
} pstmt;

typedef struct kstate {
  fb_kernel *k;
  pstmt *ps; /* in text order; blocks hold indices into ps until the end */
  int nps, pcap;
  int *def;  /* def[id] = 1 + index in ps of the statement written as %id */
  int ndef;
} kstate;

typedef struct parser {
  fb_diags diags; /* sorted by position and handed over at the end */
  int nerr;       /* errors seen (a diagnostic may fail to allocate) */
  int gave_up;
  const char *line;
  int lineno, linelen;
  tok *toks;
  int ntok, tcap, ti;
  int module;                /* fb_ir_parse: a layout block comes first */
  fb_layout *own;            /* the layout being built (module mode) */
  const fb_layout *layout;   /* what kernels resolve names against */
  int layout_seen, layout_bad;
  int lay_line, lay_col;
  struct {
    int line, col;
  } *name_pos; /* per SNode: where its name is written */
  int npos, poscap;
  char **lost;               /* names met on layout lines that failed */
  int nlost, lostcap;
  char lastname[256];        /* the name taken last on a layout line */
  frame fr[MAX_DEPTH];
  int nfr;
  kstate *ks;                /* the kernel being parsed */
  fb_kernel **out;
  int nout, outcap;
  int oom;
} parser;

/* ---------------------------------------------------------------- diagnostics */

static int perr_at(parser *P, int line, int col, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static int perr_at(parser *P, int line, int col, const char *fmt, ...) {
  if (P->gave_up) return -1;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  for (char *c = msg; *c; c++) /* names and tokens may hold control bytes */
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
  P->nerr++;
  const fb_diag *last = P->diags.n ? &P->diags.v[P->diags.n - 1] : NULL;
  if (last && last->line == line && last->col == col && strstr(last->msg, msg))
    return -1; /* the same error again, from the recovery of its line */
  if (P->nerr > MAX_ERRORS) {
    fb_diags_add(&P->diags, -1, line, col, "%d:%d: too many errors; giving up", line, col);
    P->gave_up = 1;
    return -1;
  }
  fb_diags_add(&P->diags, -1, line, col, "%d:%d: %s", line, col, msg);
  return -1;
}

#define perr(P, col, ...) perr_at((P), (P)->lineno, (col), __VA_ARGS__)

/* Describe a token for "found ..." messages. */
static const char *tokdesc(const tok *t, char *buf, size_t n) {
  if (t->kind == TK_EOL) return "end of line";
  snprintf(buf, n, "'%.*s'", t->n > 30 ? 30 : t->n, t->s);
  return buf;
}

static int expected(parser *P, const tok *t, const char *what) {
  char b[48];
  return perr(P, t->col, "expected %s, found %s", what, tokdesc(t, b, sizeof b));
}

static int nomem(parser *P) {
  P->oom = 1;
  return perr(P, 1, "out of memory");
}

/* ---------------------------------------------------------------- lexer */

static int push_tok(parser *P, int kind, const char *s, int n) {
  if (FB_GROW(P->toks, P->ntok, P->tcap)) return nomem(P);
  tok *t = &P->toks[P->ntok++];
  t->kind = kind;
  t->col = (int)(s - P->line) + 1;
  t->s = s;
  t->n = n;
  return 0;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_id_char(int c) { return fb__text_name_char(c, 0) && c != '.'; } /* after '%' */

/* Length of a quoted name starting at s (the opening quote), or -1 when it
 * does not end on this line. */
static int string_len(const char *s, const char *end) {
  for (const char *p = s + 1; p < end; p++) {
    if (*p == '\\' && p + 1 < end) p++;
    else if (*p == '"') return (int)(p - s) + 1;
  }
  return -1;
}

/* Split the current line into tokens (plus a final TK_EOL). A bad
 * character is reported and skipped, so the braces at the line's ends are
 * still known to the recovery. Returns 0 or -1. */
static int lex_line(parser *P) {
  const char *p = P->line, *end = P->line + P->linelen;
  int rc = 0;
  P->ntok = 0;
  P->ti = 0;
  while (p < end) {
    unsigned char c = (unsigned char)*p;
    const char *q = p + 1;
    int kind = TK_PUNCT;
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      p++;
      continue;
    }
    if (c == '#') break;
    if (fb__text_name_char(c, 1)) {
      kind = TK_NAME;
      while (q < end && fb__text_name_char((unsigned char)*q, 0)) q++;
    } else if (is_digit(c) || (c == '.' && q < end && is_digit((unsigned char)*q)) ||
               ((c == '-' || c == '+') && q < end && (fb__text_name_char((unsigned char)*q, 0)))) {
      kind = TK_NUM;
      while (q < end && fb__text_name_char((unsigned char)*q, 0)) q++;
    } else if (c == '%') {
      kind = TK_ID;
      while (q < end && is_id_char((unsigned char)*q)) q++;
    } else if (c == '"') {
      int n = string_len(p, end);
      if (n < 0) {
        rc = perr(P, (int)(p - P->line) + 1, "unterminated quoted name");
        break;
      }
      kind = TK_STR;
      q = p + n;
    } else if ((c == '.' && q < end && *q == '.') || (c == '-' && q < end && *q == '>')) {
      q++;
    } else if (!strchr("{}()[],:=@", c) || c == 0) {
      if (rc == 0) {
        int col = (int)(p - P->line) + 1;
        if (c >= 0x21 && c < 0x7f) rc = perr(P, col, "unexpected character '%c'", c);
        else rc = perr(P, col, "unexpected byte 0x%02x", c);
      }
      p++;
      continue;
    }
    if (push_tok(P, kind, p, (int)(q - p))) return -1;
    p = q;
  }
  if (push_tok(P, TK_EOL, end, 0)) return -1;
  return rc;
}

/* ---------------------------------------------------------------- token helpers */

static tok *cur(parser *P) { return &P->toks[P->ti]; }
static void adv(parser *P) {
  if (P->toks[P->ti].kind != TK_EOL) P->ti++;
}
static int is_punct(const tok *t, const char *s) {
  return t->kind == TK_PUNCT && (size_t)t->n == strlen(s) && memcmp(t->s, s, (size_t)t->n) == 0;
}
static int is_word(const tok *t, const char *s) {
  return t->kind == TK_NAME && (size_t)t->n == strlen(s) && memcmp(t->s, s, (size_t)t->n) == 0;
}

static int expect_punct(parser *P, const char *s) {
  char what[8];
  if (is_punct(cur(P), s)) {
    adv(P);
    return 0;
  }
  snprintf(what, sizeof what, "'%s'", s);
  return expected(P, cur(P), what);
}

static int expect_word(parser *P, const char *s) {
  char what[24];
  if (is_word(cur(P), s)) {
    adv(P);
    return 0;
  }
  snprintf(what, sizeof what, "'%s'", s);
  return expected(P, cur(P), what);
}

static int expect_eol(parser *P) {
  return cur(P)->kind == TK_EOL ? 0 : expected(P, cur(P), "end of line");
}

/* A name: bare or quoted. Writes a NUL-terminated copy into buf. */
static int take_name_(parser *P, char *buf, size_t n, const char *what) {
  tok *t = cur(P);
  size_t o = 0;
  if (t->kind == TK_NAME) {
    if ((size_t)t->n >= n) return perr(P, t->col, "name too long (at most %zu bytes)", n - 1);
    memcpy(buf, t->s, (size_t)t->n);
    buf[t->n] = 0;
    adv(P);
    return 0;
  }
  if (t->kind != TK_STR) return expected(P, t, what);
  for (int i = 1; i < t->n - 1; i++) {
    int c = (unsigned char)t->s[i];
    if (c == '\\') {
      int e = t->s[++i];
      if (e == 'x' && i + 2 < t->n - 1 && isxdigit((unsigned char)t->s[i + 1]) &&
          isxdigit((unsigned char)t->s[i + 2])) {
        char hex[3] = {t->s[i + 1], t->s[i + 2], 0};
        c = (int)strtol(hex, NULL, 16);
        i += 2;
      } else if (e == '"' || e == '\\') {
        c = e;
      } else {
        return perr(P, t->col + i - 1, "bad escape in quoted name (use \\\", \\\\ or \\xHH)");
      }
    }
    if (c == 0) return perr(P, t->col, "a name cannot contain a NUL byte");
    if (o + 1 >= n) return perr(P, t->col, "name too long (at most %zu bytes)", n - 1);
    buf[o++] = (char)c;
  }
  if (o == 0) return perr(P, t->col, "empty name");
  buf[o] = 0;
  adv(P);
  return 0;
}

static int take_name(parser *P, char *buf, size_t n, const char *what) {
  if (take_name_(P, buf, n, what) == 0) return 0;
  buf[0] = 0;
  return -1;
}

/* Integers: decimal or 0x hex, optional sign. */
static int parse_int_text(const char *s, int n, int64_t *out, uint64_t *uout, int *neg) {
  int i = 0, base = 10;
  *neg = 0;
  if (i < n && (s[i] == '-' || s[i] == '+')) *neg = s[i++] == '-';
  if (i + 1 < n && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
    base = 16;
    i += 2;
  }
  if (i >= n) return -1;
  uint64_t v = 0;
  for (; i < n; i++) {
    int c = (unsigned char)s[i], d;
    if (is_digit(c)) d = c - '0';
    else if (base == 16 && isxdigit(c)) d = (c | 0x20) - 'a' + 10;
    else return -1;
    if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return -2;
    v = v * (uint64_t)base + (uint64_t)d;
  }
  if (*neg && v > (uint64_t)INT64_MAX + 1) return -2;
  *uout = v;
  *out = *neg ? (int64_t)(0 - v) : (int64_t)v;
  return 0;
}

/* An integer token within [lo, hi]. */
static int take_int(parser *P, int64_t lo, int64_t hi, int64_t *out, const char *what) {
  tok *t = cur(P);
  int64_t v;
  uint64_t u;
  int neg;
  if (t->kind != TK_NUM) return expected(P, t, what);
  int rc = parse_int_text(t->s, t->n, &v, &u, &neg);
  if (rc == -1) return perr(P, t->col, "bad number '%.*s'", t->n, t->s);
  if (rc == -2 || (!neg && u > (uint64_t)INT64_MAX) || v < lo || v > hi)
    return perr(P, t->col, "number '%.*s' out of range for %s (%lld to %lld)", t->n, t->s, what,
                (long long)lo, (long long)hi);
  *out = v;
  adv(P);
  return 0;
}

static int take_type(parser *P, int *out) {
  tok *t = cur(P);
  if (t->kind != TK_NAME) return expected(P, t, "a type");
  int ty = fb_type_from_name(t->s, (size_t)t->n);
  if (ty < 0) return perr(P, t->col, "unknown type '%.*s'", t->n, t->s);
  *out = ty;
  adv(P);
  return 0;
}

/* ---------------------------------------------------------------- frames */

static int push_frame(parser *P, int kind, int ref, int col, const char *what) {
  if (P->nfr >= MAX_DEPTH) return perr(P, col, "blocks nested too deeply (at most %d)", MAX_DEPTH);
  frame *f = &P->fr[P->nfr++];
  f->kind = kind;
  f->ref = ref;
  f->owner = -1;
  f->line = P->lineno;
  f->col = col;
  snprintf(f->what, sizeof f->what, "%s", what);
  return 0;
}

static frame *top(parser *P) { return P->nfr ? &P->fr[P->nfr - 1] : NULL; }

static void finish_layout(parser *P);
static void finish_kernel(parser *P);

static void pop_frame(parser *P) {
  if (!P->nfr) return;
  int kind = P->fr[--P->nfr].kind;
  if (kind == FR_LAYOUT) finish_layout(P);
  else if (kind == FR_KERNEL) finish_kernel(P);
}

/* ---------------------------------------------------------------- layout */

static int layout_header(parser *P) {
  tok *t = cur(P);
  adv(P);
  if (!P->module)
    return perr(P, t->col,
                "a layout block is not allowed here: kernels are parsed against a given layout");
  if (P->layout_seen && !P->lay_line)
    return perr(P, t->col, "the layout block must come before the kernels");
  if (P->layout_seen) return perr(P, t->col, "only one layout block is allowed");
  P->layout_seen = 1;
  P->lay_line = P->lineno;
  P->lay_col = t->col;
  if (expect_punct(P, "{") || expect_eol(P)) return -1;
  return push_frame(P, FR_LAYOUT, 0, t->col, "layout");
}

static int check_name_free(parser *P, const char *name, int col) {
  int id = fb_layout_find(P->own, name);
  if (id < 0) return 0;
  int fl = id < P->npos ? P->name_pos[id].line : 0, fc = id < P->npos ? P->name_pos[id].col : 0;
  return perr(P, col, "duplicate name '%s' (first at %d:%d)", name, fl, fc);
}

static int note_name(parser *P, int id, int col) {
  if (id < 0) return 0;
  while (P->npos <= id) {
    if (FB_GROW(P->name_pos, P->npos, P->poscap)) return nomem(P);
    P->name_pos[P->npos].line = P->name_pos[P->npos].col = 0;
    P->npos++;
  }
  P->name_pos[id].line = P->lineno;
  P->name_pos[id].col = col;
  return 0;
}

/* A name the layout would have had but for an error: kernels that use it
 * get no "unknown field" error of their own. */
static int lose_name(parser *P, const char *name) {
  char *c = fb__strdup(name);
  if (!c || FB_GROW(P->lost, P->nlost, P->lostcap)) {
    free(c);
    return nomem(P);
  }
  P->lost[P->nlost++] = c;
  return 0;
}

static int name_lost(const parser *P, const char *name) {
  for (int i = 0; i < P->nlost; i++)
    if (strcmp(P->lost[i], name) == 0) return 1;
  return 0;
}

static int layout_place(parser *P, int parent) {
  char *name = P->lastname;
  int ty, col;
  adv(P); /* place */
  col = cur(P)->col;
  if (take_name(P, name, sizeof P->lastname, "a field name") || expect_punct(P, ":")) return -1;
  int tcol = cur(P)->col;
  if (take_type(P, &ty) || expect_eol(P)) return -1;
  if (ty == FB_T_VOID) return perr(P, tcol, "a field cannot have type void");
  if (check_name_free(P, name, col)) return -1;
  if (parent < 0) return lose_name(P, name);
  int id = fb_layout_place(P->own, parent, name, (fb_type)ty);
  if (id < 0) return id == FB_ENOMEM ? nomem(P) : perr(P, col, "cannot place '%s' here", name);
  return note_name(P, id, col);
}

/* "ij: 8, 8" (and ", chunk: 64" for dynamic) inside the parentheses. */
static int node_shape(parser *P, int kind, char *axes, int64_t *sizes, int64_t *chunk) {
  tok *t = cur(P);
  unsigned mask = 0;
  if (t->kind != TK_NAME) return expected(P, t, "axes (letters from ijkl)");
  for (int i = 0; i < t->n; i++) {
    int a = t->s[i] - 'i';
    if (t->n > FB_MAX_AXES || a < 0 || a >= FB_MAX_AXES || (mask & (1u << a)))
      return perr(P, t->col, "bad axes '%.*s': use up to 4 of the letters ijkl, each once", t->n,
                  t->s);
    mask |= 1u << a;
    axes[i] = t->s[i];
  }
  int na = t->n;
  axes[na] = 0;
  adv(P);
  if (expect_punct(P, ":")) return -1;
  int n = 0;
  *chunk = 0;
  for (;;) {
    if (is_word(cur(P), "chunk")) {
      int ccol = cur(P)->col;
      adv(P);
      if (expect_punct(P, ":") || take_int(P, 1, INT32_MAX, chunk, "a chunk")) return -1;
      if (kind != FB_SN_DYNAMIC) return perr(P, ccol, "only dynamic SNodes take a chunk");
      break;
    }
    int scol = cur(P)->col;
    if (n == na) return perr(P, scol, "more sizes than axes '%s'", axes);
    if (take_int(P, 1, INT32_MAX, &sizes[n], "a size")) return -1;
    n++;
    if (!is_punct(cur(P), ",")) break;
    adv(P);
  }
  if (n != na) return perr(P, cur(P)->col, "axes '%s' need %d sizes, found %d", axes, na, n);
  if (kind == FB_SN_DYNAMIC) {
    if (na != 1) return perr(P, t->col, "a dynamic SNode has exactly one axis");
    if (*chunk == 0) return expected(P, cur(P), "', chunk: N' for a dynamic SNode");
    if (*chunk > sizes[0])
      return perr(P, cur(P)->col, "chunk %lld is larger than the size %lld", (long long)*chunk,
                  (long long)sizes[0]);
  }
  return 0;
}

static int layout_node(parser *P, int parent) {
  static const char *const kinds[] = {"dense", "bitmasked", "pointer", "dynamic"};
  tok *t = cur(P);
  int kind = -1, kcol = t->col;
  for (int i = 0; i < 4; i++)
    if (is_word(t, kinds[i])) kind = FB_SN_DENSE + i;
  if (kind < 0) {
    char b[48];
    if (t->kind == TK_NAME) return perr(P, t->col, "unknown SNode kind '%.*s'", t->n, t->s);
    return perr(P, t->col,
                "expected an SNode (dense, bitmasked, pointer, dynamic) or 'place', found %s",
                tokdesc(t, b, sizeof b));
  }
  adv(P);
  char axes[FB_MAX_AXES + 1], *name = P->lastname;
  int64_t sizes[FB_MAX_AXES], chunk;
  int ncol = 0;
  if (expect_punct(P, "(") || node_shape(P, kind, axes, sizes, &chunk) || expect_punct(P, ")"))
    return -1;
  if (is_word(cur(P), "as")) {
    adv(P);
    ncol = cur(P)->col;
    if (take_name(P, name, sizeof P->lastname, "an SNode name") || check_name_free(P, name, ncol))
      return -1;
  }
  if (expect_punct(P, "{") || expect_eol(P)) return -1;
  int id = -1;
  if (parent >= 0) {
    id = fb_layout_add(P->own, parent, (fb_snode_kind)kind, axes, sizes, chunk, ncol ? name : NULL);
    if (id < 0) return id == FB_ENOMEM ? nomem(P) : perr(P, kcol, "cannot add this SNode here");
    if (ncol && note_name(P, id, ncol)) return -1;
  } else if (ncol && lose_name(P, name)) {
    return -1;
  }
  return push_frame(P, FR_NODE, id, kcol, kinds[kind - FB_SN_DENSE]);
}

static int layout_line(parser *P) {
  frame *f = top(P);
  tok *t = cur(P);
  int parent = f->kind == FR_LAYOUT ? 0 : f->ref;
  if (is_punct(t, "}")) {
    adv(P);
    if (expect_eol(P)) return -1;
    pop_frame(P);
    return 0;
  }
  if (is_word(t, "place")) return layout_place(P, parent);
  return layout_node(P, parent);
}

static void finish_layout(parser *P) {
  char err[200] = "";
  if (P->layout_bad || !P->own) return;
  if (fb_layout_finalize(P->own, err, sizeof err) == 0) return;
  P->layout_bad = 1;
  perr_at(P, P->lay_line, P->lay_col, "layout: %s", err[0] ? err : "invalid layout");
}

/* ---------------------------------------------------------------- kernels */

static fb_stmt blank_stmt(int op) {
  fb_stmt s;
  memset(&s, 0, sizeof s);
  s.op = (uint16_t)op;
  s.snode = -1;
  s.body = s.orelse = -1;
  for (int i = 0; i < FB_MAX_ARGS; i++) s.args[i] = -1;
  return s;
}

static void kstate_free(kstate *K) {
  if (!K) return;
  fb_kernel_free(K->k);
  free(K->ps);
  free(K->def);
  free(K);
}

static int kernel_header(parser *P) {
  tok *kw = cur(P);
  char name[256];
  fb_type params[64];
  int np = 0, ret = FB_T_VOID;
  adv(P);
  if (take_name(P, name, sizeof name, "a kernel name") || expect_punct(P, "(")) return -1;
  while (!is_punct(cur(P), ")") || np > 0) {
    int ty;
    if (np == 64) return perr(P, cur(P)->col, "too many parameters (at most 64)");
    if (take_type(P, &ty)) return -1;
    params[np++] = (fb_type)ty;
    if (!is_punct(cur(P), ",")) break;
    adv(P);
  }
  if (expect_punct(P, ")")) return -1;
  if (is_punct(cur(P), "->")) {
    adv(P);
    if (take_type(P, &ret)) return -1;
  }
  if (expect_punct(P, "{") || expect_eol(P)) return -1;
  kstate *K = calloc(1, sizeof *K);
  if (!K || !(K->k = fb_kernel_new(P->layout, name, np, params, (fb_type)ret))) {
    free(K);
    return nomem(P);
  }
  P->ks = K;
  char what[40];
  snprintf(what, sizeof what, "kernel '%.24s'", name);
  return push_frame(P, FR_KERNEL, 0, kw->col, what);
}

/* Module mode: a kernel before any layout gets an empty one (and an error). */
static int need_layout(parser *P, int col) {
  if (!P->module || P->layout_seen) return 0;
  P->layout_seen = P->layout_bad = 1;
  return perr(P, col, "expected a 'layout { ... }' block before the first kernel");
}

static int block_append(parser *P, int blk, int idx) {
  fb_block *b = &P->ks->k->blocks[blk];
  if (FB_GROW(b->ids, b->n, b->cap)) return nomem(P);
  b->ids[b->n++] = idx;
  return 0;
}

static int define_id(parser *P, int id, int col) {
  kstate *K = P->ks;
  if (id < K->ndef && K->def[id]) {
    const pstmt *o = &K->ps[K->def[id] - 1];
    return perr(P, col, "duplicate id %%%d (first defined at %d:%d)", id, o->line, o->col);
  }
  if (id >= K->ndef) {
    int n = id + 1 > K->ndef * 2 ? id + 1 : K->ndef * 2;
    int *d = realloc(K->def, sizeof(int) * (size_t)n);
    if (!d) return nomem(P);
    memset(d + K->ndef, 0, sizeof(int) * (size_t)(n - K->ndef));
    K->def = d;
    K->ndef = n;
  }
  K->def[id] = K->nps + 1;
  return 0;
}

static int take_id(parser *P, int *id) {
  tok *t = cur(P);
  if (t->kind != TK_ID) return expected(P, t, "a statement id like %3");
  long v = 0;
  if (t->n < 2) return perr(P, t->col, "expected digits after '%%'");
  for (int i = 1; i < t->n; i++) {
    if (!is_digit((unsigned char)t->s[i]))
      return perr(P, t->col, "bad statement id '%.*s'", t->n, t->s);
    v = v * 10 + (t->s[i] - '0');
    if (v >= MAX_ID)
      return perr(P, t->col, "statement id '%.*s' too large (at most %d)", t->n, t->s, MAX_ID - 1);
  }
  *id = (int)v;
  adv(P);
  return 0;
}

static int take_operand(parser *P, pstmt *ps) {
  int col = cur(P)->col, v;
  if (ps->s.nargs >= FB_MAX_ARGS)
    return perr(P, col, "too many operands (at most %d)", FB_MAX_ARGS);
  if (take_id(P, &v)) return -1;
  ps->acol[ps->s.nargs] = col;
  ps->s.args[ps->s.nargs++] = v;
  return 0;
}

/* "%a, %b, ..." until something that is not a comma follows. */
static int take_operands(parser *P, pstmt *ps) {
  if (cur(P)->kind != TK_ID) return 0;
  for (;;) {
    if (take_operand(P, ps)) return -1;
    if (!is_punct(cur(P), ",")) return 0;
    adv(P);
  }
}

/* An SNode: a name, @ and a path of child positions, or @ alone (the root). */
static int take_snode(parser *P, int *out) {
  const fb_layout *l = P->layout;
  tok *t = cur(P);
  if (is_punct(t, "@")) {
    int node = 0;
    adv(P);
    tok *pt = cur(P);
    if (pt->kind == TK_NUM && pt->col == t->col + 1) {
      const char *s = pt->s, *e = pt->s + pt->n;
      while (s < e) {
        long v = 0;
        const char *d = s;
        for (; s < e && is_digit((unsigned char)*s); s++) v = v < 1000000 ? v * 10 + (*s - '0') : v;
        if (s == d || (s < e && *s != '.') || (s + 1 == e))
          return perr(P, t->col, "bad SNode path '@%.*s'", pt->n, pt->s);
        if (s < e) s++;
        if (v >= l->nodes[node].nchildren) {
          if (P->layout_bad) return -1;
          return perr(P, t->col, "no SNode at '@%.*s'", pt->n, pt->s);
        }
        node = l->nodes[node].children[v];
      }
      adv(P);
    }
    *out = node;
    return 0;
  }
  char name[256];
  if (take_name(P, name, sizeof name, "a field or SNode name")) return -1;
  *out = fb_layout_find(l, name);
  if (*out >= 0) return 0;
  return name_lost(P, name) ? -1 : perr(P, t->col, "unknown field '%s'", name);
}

/* F[%i, ...] and, for stores and atomics, ", %v". */
static int take_access(parser *P, pstmt *ps, int with_value) {
  int sn;
  if (take_snode(P, &sn)) return -1;
  ps->s.snode = sn;
  if (expect_punct(P, "[") || take_operands(P, ps) || expect_punct(P, "]")) return -1;
  if (!with_value) return 0;
  return expect_punct(P, ",") || take_operand(P, ps);
}

static const char *imm_name(int op) {
  switch (fb_op_table[op].cls) {
  case FB_OPC_ARG: return "a parameter number";
  case FB_OPC_RET: return "a return slot";
  case FB_OPC_LOOPIDX: return "an index number";
  case FB_OPC_GTMP: return "a byte offset";
  case FB_OPC_RAND: return "a call site number";
  default: return "an integer";
  }
}

/* "%a, ..., INT": operands, then the immediate last. */
static int take_imm_operands(parser *P, pstmt *ps) {
  const char *what = imm_name(ps->s.op);
  while (cur(P)->kind == TK_ID) {
    if (take_operand(P, ps)) return -1;
    if (!is_punct(cur(P), ",")) return expected(P, cur(P), "','");
    adv(P);
  }
  return take_int(P, INT64_MIN, INT64_MAX, &ps->s.imm.i, what);
}

/* Float literal syntax: [+-] digits [. digits] [e [+-] digits]. */
static int float_syntax(const char *s, int n) {
  int i = 0, d = 0;
  if (i < n && (s[i] == '+' || s[i] == '-')) i++;
  while (i < n && is_digit((unsigned char)s[i])) i++, d++;
  if (i < n && s[i] == '.') {
    i++;
    while (i < n && is_digit((unsigned char)s[i])) i++, d++;
  }
  if (!d) return 0;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    if (i >= n || !is_digit((unsigned char)s[i])) return 0;
    while (i < n && is_digit((unsigned char)s[i])) i++;
  }
  return i == n;
}

static int parse_float_lit(const char *s, int n, int f32, double *out) {
  char buf[80];
  int neg = n > 0 && s[0] == '-', sg = n > 0 && (s[0] == '-' || s[0] == '+');
  if ((n - sg == 3 && memcmp(s + sg, "inf", 3) == 0)) {
    *out = neg ? -INFINITY : INFINITY;
    return 0;
  }
  if (n == 3 && memcmp(s, "nan", 3) == 0) {
    *out = f32 ? (double)NAN : NAN;
    return 0;
  }
  if (n > 6 && memcmp(s, "nan:0x", 6) == 0) {
    int64_t v;
    uint64_t u;
    int ng;
    if (parse_int_text(s + 4, n - 4, &v, &u, &ng) || (f32 && u > UINT32_MAX)) return -1;
    if (f32) {
      uint32_t w = (uint32_t)u;
      float f;
      memcpy(&f, &w, 4);
      if (!isnan(f)) return -1;
      *out = f;
    } else {
      memcpy(out, &u, 8);
      if (!isnan(*out)) return -1;
    }
    return 0;
  }
  if (n >= (int)sizeof buf || !float_syntax(s, n)) return -1;
  memcpy(buf, s, (size_t)n);
  buf[n] = 0;
  *out = f32 ? (double)strtof(buf, NULL) : strtod(buf, NULL);
  return isinf(*out) ? -2 : 0;
}

/* The literal of const.T: the rest of the line. */
static int take_const(parser *P, pstmt *ps) {
  tok *first = cur(P);
  if (first->kind == TK_EOL) return expected(P, first, "a constant");
  tok *last = &P->toks[P->ntok - 2];
  const char *s = first->s;
  int n = (int)(last->s + last->n - s), ty = ps->s.type, rc;
  int64_t v;
  uint64_t u;
  int neg;
  P->ti = P->ntok - 1;
  switch (ty) {
  case FB_T_BOOL:
    if (n == 4 && memcmp(s, "true", 4) == 0) ps->s.imm.u = 1;
    else if (n == 5 && memcmp(s, "false", 5) == 0) ps->s.imm.u = 0;
    else return perr(P, first->col, "bad bool '%.*s' (true or false)", n, s);
    return 0;
  case FB_T_F32:
  case FB_T_F64:
    rc = parse_float_lit(s, n, ty == FB_T_F32, &ps->s.imm.f);
    if (rc == -2)
      return perr(P, first->col, "number '%.*s' out of range for %s", n, s, fb_type_name(ty));
    if (rc) return perr(P, first->col, "bad number '%.*s'", n, s);
    return 0;
  default:
    rc = parse_int_text(s, n, &v, &u, &neg);
    if (rc == -1) return perr(P, first->col, "bad number '%.*s'", n, s);
    int ok = rc == 0;
    switch (ty) {
    case FB_T_I32: ok = ok && v >= INT32_MIN && v <= INT32_MAX && (neg || u <= INT32_MAX); break;
    case FB_T_I64: ok = ok && (neg || u <= (uint64_t)INT64_MAX); break;
    case FB_T_U32: ok = ok && (!neg || u == 0) && u <= UINT32_MAX; break;
    case FB_T_U64: ok = ok && (!neg || u == 0); break;
    default: break; /* void and bad types keep the bits as written */
    }
    if (!ok)
      return perr(P, first->col, "number '%.*s' out of range for %s", n, s, fb_type_name(ty));
    ps->s.imm.u = neg ? (uint64_t)v : u;
    return 0;
  }
}

/* The op name with its optional ".TYPE": "add.f32". */
static int take_op(parser *P, int *op, int *ty) {
  tok *t = cur(P);
  if (t->kind != TK_NAME) return expected(P, t, "an op");
  const char *dot = memchr(t->s, '.', (size_t)t->n);
  int on = dot ? (int)(dot - t->s) : t->n;
  *op = fb_op_from_name(t->s, (size_t)on);
  if (*op < 0) return perr(P, t->col, "unknown op '%.*s'", on, t->s);
  *ty = -1;
  if (dot) {
    int tn = t->n - on - 1;
    *ty = fb_type_from_name(dot + 1, (size_t)tn);
    if (*ty < 0) return perr(P, t->col + on + 1, "unknown type '%.*s'", tn, dot + 1);
  }
  adv(P);
  return 0;
}

/* After the op (and a loop's own id): the operands of each form. */
static int stmt_operands(parser *P, pstmt *ps, int form) {
  int sn = -1, rc;
  switch (form) {
  case 'c': return take_const(P, ps);
  case 'i': return take_imm_operands(P, ps);
  case 'g': return take_access(P, ps, 0);
  case 'v': return take_access(P, ps, 1);
  case 'h':
    rc = take_operand(P, ps) || expect_word(P, "covers") || take_snode(P, &sn);
    ps->s.snode = sn;
    return rc;
  case 'f': return take_operand(P, ps);
  case 'w': return 0;
  case 'r':
    return expect_word(P, "in") || take_operand(P, ps) || expect_punct(P, "..") ||
           take_operand(P, ps);
  case 's':
    rc = expect_word(P, "over") || take_snode(P, &sn);
    ps->s.snode = sn;
    return rc;
  default: return take_operands(P, ps);
  }
}

/* Give ps the id written for it; it counts as defined even when the rest
 * of the line fails, so its uses do not add errors of their own. */
static int claim_id(parser *P, pstmt *ps, int id, int col, int *reg) {
  ps->id = id;
  ps->line = P->lineno;
  ps->col = col;
  if (define_id(P, id, col)) return -1;
  *reg = 1;
  return 0;
}

/* "%N =" or "%N:" before the op; a loop's own "%N" after it. */
static int stmt_head(parser *P, pstmt *ps, int *form, int *reg) {
  int id = -1, named = 0, op = FB_OP_CONST, ty = -1, col = cur(P)->col;
  ps->s = blank_stmt(FB_OP_CONST);
  ps->id = -1;
  if (cur(P)->kind == TK_ID) {
    if (take_id(P, &id)) return -1;
    named = is_punct(cur(P), "=") ? 1 : is_punct(cur(P), ":") ? 2 : 0;
    if (!named) return expected(P, cur(P), "'=' or ':' after the id");
    adv(P);
    if (claim_id(P, ps, id, col, reg)) return -1;
  }
  int opcol = cur(P)->col;
  if (take_op(P, &op, &ty)) return -1;
  const char *name = fb_op_table[op].name;
  *form = fb__text_form(op);
  int loop = *form == 'r' || *form == 's';
  if (loop && named) return perr(P, col, "a loop names itself after the op: '%s %%N ...'", name);
  if (named == 1 && ty < 0)
    return perr(P, opcol, "'%%%d =' needs a result type: '%s.TYPE'", id, name);
  if (named != 1 && !loop && ty >= 0)
    return perr(P, opcol, "a result of type %s needs a name: '%%N = %s.%s'", fb_type_name(ty), name,
                fb_type_name(ty));
  ps->s = blank_stmt(op);
  ps->s.type = (uint8_t)(ty < 0 ? FB_T_VOID : ty);
  ps->line = P->lineno;
  ps->col = named ? col : opcol;
  if (!loop) return 0;
  col = cur(P)->col;
  return take_id(P, &id) || claim_id(P, ps, id, col, reg);
}

static int stmt_line(parser *P) {
  kstate *K = P->ks;
  frame *f = top(P);
  pstmt ps;
  int form = 0, reg = 0, rc;
  memset(&ps, 0, sizeof ps);
  int64_t part = 0; /* "part N" before the statement: its fused part */
  if (is_word(cur(P), "part")) {
    adv(P);
    if (take_int(P, 0, FB_IR_MAX_PART, &part, "a fused part")) return -1;
  }
  rc = stmt_head(P, &ps, &form, &reg);
  ps.s.part = (int32_t)part;
  if (!rc) rc = stmt_operands(P, &ps, form);
  int blocky = form == 'f' || form == 'w' || form == 'r' || form == 's';
  if (!rc && blocky) rc = expect_punct(P, "{");
  if (!rc) rc = expect_eol(P);
  if (rc && !reg) return -1; /* nothing worth keeping */
  if (FB_GROW(K->ps, K->nps, K->pcap)) return nomem(P);
  int idx = K->nps++;
  K->ps[idx] = ps;
  if (block_append(P, f->ref, idx) || rc) return -1;
  if (!blocky) return 0;
  int nb = fb_block_new(K->k);
  if (nb < 0) return nomem(P);
  K->ps[idx].s.body = nb;
  if (push_frame(P, form == 'f' ? FR_THEN : FR_BODY, nb, P->toks[0].col, fb_op_table[ps.s.op].name))
    return -1;
  top(P)->owner = idx;
  return 0;
}

/* "}" or "} else {" inside a kernel. */
static int close_line(parser *P) {
  frame *f = top(P);
  adv(P);
  if (is_word(cur(P), "else")) {
    tok *e = cur(P);
    adv(P);
    if (expect_punct(P, "{") || expect_eol(P)) return -1;
    if (f->kind != FR_THEN) {
      /* "} {" leaves the depth as it was: keep the kernel open, and
       * parse what follows as a block of its own. */
      perr(P, e->col, "'else' without a matching 'if'");
      if (f->kind == FR_KERNEL) return RECOVERED;
      pop_frame(P);
      int nb = fb_block_new(P->ks->k);
      if (nb < 0) return nomem(P);
      push_frame(P, FR_BODY, nb, e->col, "else");
      return RECOVERED;
    }
    int owner = f->owner, nb = fb_block_new(P->ks->k);
    if (nb < 0) return nomem(P);
    P->ks->ps[owner].s.orelse = nb;
    pop_frame(P);
    return push_frame(P, FR_ELSE, nb, e->col, "else");
  }
  if (expect_eol(P)) return -1;
  pop_frame(P);
  return 0;
}

/* Final ids: a statement written without one takes the previous
 * statement's id + 1, or, when that id is written elsewhere in the kernel,
 * the first id above every id in use. Holes become placeholders (const of
 * type void) that sit in no block. */
static int resolve_ids(parser *P, kstate *K, int **fin_out, unsigned char **taken_out) {
  size_t cap = (size_t)K->ndef + (size_t)K->nps + 1;
  unsigned char *taken = calloc(cap, 1);
  int *fin = malloc(sizeof(int) * (size_t)(K->nps ? K->nps : 1));
  if (!taken || !fin) {
    free(taken);
    free(fin);
    return nomem(P);
  }
  int topid = -1, prev = -1;
  for (int id = 0; id < K->ndef; id++)
    if (K->def[id]) {
      taken[id] = 1;
      topid = id;
    }
  for (int i = 0; i < K->nps; i++) {
    int id = K->ps[i].id;
    if (id < 0) {
      id = prev + 1;
      if (taken[id]) id = topid + 1;
      taken[id] = 1;
      if (id >= MAX_ID) { /* keep every id the printer may write readable */
        perr_at(P, K->ps[i].line, K->ps[i].col, "statement id %d too large (at most %d)", id,
                MAX_ID - 1);
        free(taken);
        free(fin);
        return -1;
      }
    }
    fin[i] = prev = id;
    if (id > topid) topid = id;
  }
  fb_kernel *k = K->k;
  k->nstmts = k->cap = topid + 1;
  if (topid >= 0 && !(k->stmts = malloc(sizeof(fb_stmt) * (size_t)(topid + 1)))) {
    k->nstmts = k->cap = 0;
    free(taken);
    free(fin);
    return nomem(P);
  }
  for (int id = 0; id <= topid; id++) k->stmts[id] = blank_stmt(FB_OP_CONST);
  for (int i = 0; i < K->nps; i++) k->stmts[fin[i]] = K->ps[i].s;
  *fin_out = fin;
  *taken_out = taken;
  return 0;
}

static void finish_kernel(parser *P) {
  kstate *K = P->ks;
  int *fin = NULL;
  unsigned char *taken = NULL;
  P->ks = NULL;
  if (!K) return;
  if (P->gave_up || resolve_ids(P, K, &fin, &taken)) {
    kstate_free(K);
    return;
  }
  fb_kernel *k = K->k;
  for (int b = 0; b < k->nblocks; b++)
    for (int j = 0; j < k->blocks[b].n; j++) k->blocks[b].ids[j] = fin[k->blocks[b].ids[j]];
  for (int i = 0; i < K->nps; i++) {
    const pstmt *ps = &K->ps[i];
    for (int a = 0; a < ps->s.nargs; a++) {
      int v = ps->s.args[a];
      if (v >= k->nstmts || !taken[v]) perr_at(P, ps->line, ps->acol[a], "undefined %%%d", v);
    }
  }
  free(fin);
  free(taken);
  if (FB_GROW(P->out, P->nout, P->outcap)) {
    nomem(P);
    kstate_free(K);
    return;
  }
  P->out[P->nout++] = K->k;
  K->k = NULL;
  kstate_free(K);
}

/* ---------------------------------------------------------------- lines */

static int top_line(parser *P) {
  tok *t = cur(P);
  if (is_word(t, "layout")) return layout_header(P);
  if (is_word(t, "kernel")) {
    need_layout(P, t->col);
    return kernel_header(P);
  }
  if (is_punct(t, "}")) return perr(P, t->col, "unexpected '}'");
  return expected(P, t, P->module ? "'layout' or 'kernel'" : "'kernel'");
}

/* A 'layout' or 'kernel' line inside a block means a '}' is missing. */
static int starts_unit(parser *P) {
  return is_word(&P->toks[0], "kernel") || is_word(&P->toks[0], "layout");
}

static void close_all(parser *P, int line, int col, const char *why) {
  frame *f = top(P);
  if (f)
    perr_at(P, line, col, "%smissing '}' to close %s opened at %d:%d", why, f->what, f->line,
            f->col);
  while (P->nfr) pop_frame(P);
}

static int dispatch(parser *P) {
  frame *f = top(P);
  if (f && starts_unit(P)) {
    close_all(P, P->lineno, P->toks[0].col, "");
    f = NULL;
  }
  if (!f) return top_line(P);
  switch (f->kind) {
  case FR_LAYOUT:
  case FR_NODE: return layout_line(P);
  case FR_SKIP:
    if (is_punct(cur(P), "}")) pop_frame(P);
    if (is_punct(&P->toks[P->ntok - 2], "{")) push_frame(P, FR_SKIP, -1, 1, "block");
    return 0;
  default:
    if (is_punct(cur(P), "}")) return close_line(P);
    return stmt_line(P);
  }
}

/* After a failed line: a leading '}' still closes and a trailing '{'
 * still opens, so the blocks after it line up. */
static int opens(parser *P) {
  const tok *first = &P->toks[0];
  if (P->ntok < 2) return 0;
  if (is_punct(&P->toks[P->ntok - 2], "{")) return 1;
  if (!is_word(first, "kernel") && !is_word(first, "layout")) return 0;
  for (int i = 1; i < P->ntok; i++) /* "kernel k() { junk" */
    if (is_punct(&P->toks[i], "{")) return 1;
  return 0;
}

static void recover(parser *P) {
  const tok *first = &P->toks[0];
  if (is_punct(first, "}") && P->ntok > 1) pop_frame(P);
  if (!opens(P)) return;
  frame *f = top(P);
  int skip = 1;
  if (!f && is_word(first, "layout") && P->module && P->lay_line == P->lineno) {
    push_frame(P, FR_LAYOUT, 0, first->col, "layout"); /* a bad header; parse the body */
    return;
  }
  if (!f && is_word(first, "kernel")) {
    need_layout(P, first->col);
    kstate *K = calloc(1, sizeof *K);
    if (K && (K->k = fb_kernel_new(P->layout, "?", 0, NULL, FB_T_VOID))) {
      P->ks = K;
      push_frame(P, FR_KERNEL, 0, first->col, "kernel");
      return;
    }
    free(K);
  } else if (f && (f->kind == FR_LAYOUT || f->kind == FR_NODE)) {
    push_frame(P, FR_NODE, -1, first->col, "SNode");
    skip = 0;
  } else if (f && f->kind != FR_SKIP) {
    int nb = fb_block_new(P->ks->k);
    if (nb >= 0) {
      push_frame(P, FR_BODY, nb, first->col, "block");
      skip = 0;
    }
  }
  if (skip) push_frame(P, FR_SKIP, -1, first->col, "block");
}

static void do_line(parser *P) {
  int in_layout = top(P) && (top(P)->kind == FR_LAYOUT || top(P)->kind == FR_NODE);
  int seen = P->layout_seen;
  P->lastname[0] = 0;
  int rc = lex_line(P);
  if (P->oom) return;
  if (P->ntok == 1 && rc == 0) return; /* blank */
  if (P->ntok > 1 && !rc) rc = dispatch(P);
  if (rc == 0 || rc == RECOVERED) return;
  if (in_layout || (P->module && !seen && P->layout_seen)) P->layout_bad = 1;
  if (in_layout && P->lastname[0] && !name_lost(P, P->lastname)) lose_name(P, P->lastname);
  recover(P);
}

static void run(parser *P, const char *text) {
  const char *p = text;
  while (*p && !P->gave_up && !P->oom) {
    const char *e = strchr(p, '\n');
    if (!e) e = p + strlen(p);
    P->lineno++;
    P->line = p;
    P->linelen = (int)(e - p);
    do_line(P);
    p = *e ? e + 1 : e;
  }
  if (P->nfr && !P->gave_up) {
    int line = P->lineno, col = P->linelen + 1;
    if (p > text && p[-1] == '\n') line++, col = 1;
    close_all(P, line ? line : 1, col, "unexpected end of file: ");
  }
  while (P->nfr) pop_frame(P);
}

/* ---------------------------------------------------------------- entry points */

/* Diagnostics in source order (those found at a kernel's end, like
 * undefined ids, come in late); stable, and there are at most 51. */
static void sort_diags(fb_diags *d) {
  for (int i = 1; i < d->n; i++) {
    fb_diag x = d->v[i];
    int j = i;
    for (; j > 0 &&
           (d->v[j - 1].line > x.line || (d->v[j - 1].line == x.line && d->v[j - 1].col > x.col));
         j--)
      d->v[j] = d->v[j - 1];
    d->v[j] = x;
  }
}

static int finish(parser *P, fb_diags *diags, fb_kernel ***kernels, int *nkernels) {
  int rc = P->oom ? FB_ENOMEM : P->nerr ? FB_EPARSE : 0;
  sort_diags(&P->diags);
  for (int i = 0; i < P->diags.n; i++)
    fb_diags_add(diags, -1, P->diags.v[i].line, P->diags.v[i].col, "%s", P->diags.v[i].msg);
  fb_diags_free(&P->diags);
  free(P->toks);
  free(P->name_pos);
  for (int i = 0; i < P->nlost; i++) free(P->lost[i]);
  free(P->lost);
  kstate_free(P->ks);
  if (rc) {
    for (int i = 0; i < P->nout; i++) fb_kernel_free(P->out[i]);
    free(P->out);
    return rc;
  }
  *kernels = P->out;
  *nkernels = P->nout;
  return 0;
}

int fb_ir_parse(const char *text, fb_layout **layout, fb_kernel ***kernels, int *nkernels,
                fb_diags *diags) {
  if (!layout || !kernels || !nkernels) return FB_EINVAL;
  *layout = NULL;
  *kernels = NULL;
  *nkernels = 0;
  if (!text) return FB_EINVAL;
  parser P;
  memset(&P, 0, sizeof P);
  P.module = 1;
  if (!(P.own = fb_layout_new())) return FB_ENOMEM;
  P.layout = P.own;
  run(&P, text);
  if (!P.layout_seen && !P.gave_up && !P.oom)
    perr_at(&P, 1, 1, "expected a 'layout { ... }' block");
  int rc = finish(&P, diags, kernels, nkernels);
  if (rc) fb_layout_free(P.own);
  else *layout = P.own;
  return rc;
}

int fb_ir_parse_kernels(const char *text, const fb_layout *layout, fb_kernel ***kernels,
                        int *nkernels, fb_diags *diags) {
  if (!kernels || !nkernels) return FB_EINVAL;
  *kernels = NULL;
  *nkernels = 0;
  if (!text || !layout || layout->nnodes < 1) return FB_EINVAL;
  parser P;
  memset(&P, 0, sizeof P);
  P.layout = layout;
  run(&P, text);
  return finish(&P, diags, kernels, nkernels);
}
