/* Lexer of the .fbk language: source text to a token array with 1-based
 * line:col positions. Comments run from '#' to the end of the line. A newline
 * becomes a T_NEWLINE token only where it can end a statement, so that long
 * expressions may continue on the next line after an operator or inside
 * brackets, or on a next line that starts with a binary operator.
 * `min=` and `max=` are the augmented min/max operators. The words `and`
 * and `or` are the tokens of `&&` and `||` (a token keeps its text, so
 * messages quote what was written); `not` is a token of its own because it
 * binds more loosely than `!` (as in Python). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "base/base.h"
#include "lang_lex.h"

static const struct {
  const char *s;
  int kind;
} keywords[] = {
    {"kernel", T_KERNEL}, {"func", T_FUNC},   {"let", T_LET},           {"var", T_VAR},
    {"if", T_IF},         {"else", T_ELSE},   {"while", T_WHILE},       {"for", T_FOR},
    {"in", T_IN},         {"break", T_BREAK}, {"continue", T_CONTINUE}, {"return", T_RETURN},
    {"true", T_TRUE},     {"false", T_FALSE}, {"and", T_ANDAND},        {"or", T_OROR},
    {"not", T_NOT},       {"const", T_CONST},
};

static const char *const tok_names[T__COUNT] = {
    [T_EOF] = "end of file",
    [T_NEWLINE] = "end of line",
    [T_IDENT] = "identifier",
    [T_INT] = "integer",
    [T_FLOAT] = "number",
    [T_LPAREN] = "'('",
    [T_RPAREN] = "')'",
    [T_LBRACE] = "'{'",
    [T_RBRACE] = "'}'",
    [T_LBRACK] = "'['",
    [T_RBRACK] = "']'",
    [T_COMMA] = "','",
    [T_COLON] = "':'",
    [T_SEMI] = "';'",
    [T_DOT] = "'.'",
    [T_DOTDOT] = "'..'",
    [T_ARROW] = "'->'",
    [T_QUESTION] = "'?'",
    [T_PLUS] = "'+'",
    [T_MINUS] = "'-'",
    [T_STAR] = "'*'",
    [T_SLASH] = "'/'",
    [T_SLASHSLASH] = "'//'",
    [T_PERCENT] = "'%'",
    [T_STARSTAR] = "'**'",
    [T_AT] = "'@'",
    [T_ASSIGN] = "'='",
    [T_EQ] = "'=='",
    [T_NE] = "'!='",
    [T_LT] = "'<'",
    [T_LE] = "'<='",
    [T_GT] = "'>'",
    [T_GE] = "'>='",
    [T_ANDAND] = "'&&'",
    [T_OROR] = "'||'",
    [T_BANG] = "'!'",
    [T_AMP] = "'&'",
    [T_PIPE] = "'|'",
    [T_CARET] = "'^'",
    [T_TILDE] = "'~'",
    [T_SHL] = "'<<'",
    [T_SHR] = "'>>'",
    [T_PLUSEQ] = "'+='",
    [T_MINUSEQ] = "'-='",
    [T_STAREQ] = "'*='",
    [T_SLASHEQ] = "'/='",
    [T_AMPEQ] = "'&='",
    [T_PIPEEQ] = "'|='",
    [T_CARETEQ] = "'^='",
    [T_MINEQ] = "'min='",
    [T_MAXEQ] = "'max='",
    [T_SLASHSLASHEQ] = "'//='",
    [T_PERCENTEQ] = "'%='",
    [T_STARSTAREQ] = "'**='",
    [T_SHLEQ] = "'<<='",
    [T_SHREQ] = "'>>='",
    [T_KERNEL] = "'kernel'",
    [T_FUNC] = "'func'",
    [T_LET] = "'let'",
    [T_VAR] = "'var'",
    [T_IF] = "'if'",
    [T_ELSE] = "'else'",
    [T_WHILE] = "'while'",
    [T_FOR] = "'for'",
    [T_IN] = "'in'",
    [T_BREAK] = "'break'",
    [T_CONTINUE] = "'continue'",
    [T_RETURN] = "'return'",
    [T_TRUE] = "'true'",
    [T_FALSE] = "'false'",
    [T_NOT] = "'not'",
    [T_CONST] = "'const'",
};

const char *lang_tok_name(int kind) {
  return kind >= 0 && kind < T__COUNT && tok_names[kind] ? tok_names[kind] : "token";
}

/* Operators, longest first. */
static const struct {
  const char *s;
  int kind;
} ops[] = {
    {"//=", T_SLASHSLASHEQ},
    {"**=", T_STARSTAREQ},
    {"<<=", T_SHLEQ},
    {">>=", T_SHREQ},
    {"%=", T_PERCENTEQ},
    {"**", T_STARSTAR},
    {"//", T_SLASHSLASH},
    {"..", T_DOTDOT},
    {"->", T_ARROW},
    {"==", T_EQ},
    {"!=", T_NE},
    {"<=", T_LE},
    {">=", T_GE},
    {"&&", T_ANDAND},
    {"||", T_OROR},
    {"<<", T_SHL},
    {">>", T_SHR},
    {"+=", T_PLUSEQ},
    {"-=", T_MINUSEQ},
    {"*=", T_STAREQ},
    {"/=", T_SLASHEQ},
    {"&=", T_AMPEQ},
    {"|=", T_PIPEEQ},
    {"^=", T_CARETEQ},
    {"(", T_LPAREN},
    {")", T_RPAREN},
    {"{", T_LBRACE},
    {"}", T_RBRACE},
    {"[", T_LBRACK},
    {"]", T_RBRACK},
    {",", T_COMMA},
    {":", T_COLON},
    {";", T_SEMI},
    {".", T_DOT},
    {"?", T_QUESTION},
    {"+", T_PLUS},
    {"-", T_MINUS},
    {"*", T_STAR},
    {"/", T_SLASH},
    {"%", T_PERCENT},
    {"@", T_AT},
    {"=", T_ASSIGN},
    {"<", T_LT},
    {">", T_GT},
    {"!", T_BANG},
    {"&", T_AMP},
    {"|", T_PIPE},
    {"^", T_CARET},
    {"~", T_TILDE},
};

typedef struct lexer {
  const char *src, *p;
  int line;
  const char *line_start;
  token *v;
  int n, cap;
  int depth; /* ( and [ nesting */
  fb_diags *d;
  int nomem;
} lexer;

static int ends_statement(int kind) {
  switch (kind) {
  case T_IDENT:
  case T_INT:
  case T_FLOAT:
  case T_RPAREN:
  case T_RBRACK:
  case T_RBRACE:
  case T_BREAK:
  case T_CONTINUE:
  case T_RETURN:
  case T_TRUE:
  case T_FALSE: return 1;
  default: return 0;
  }
}

static int col_of(const lexer *x, const char *at) { return (int)(at - x->line_start) + 1; }

static token *push(lexer *x, int kind, const char *at, int len) {
  if (FB_GROW(x->v, x->n, x->cap)) {
    x->nomem = 1;
    return NULL;
  }
  token *t = &x->v[x->n++];
  memset(t, 0, sizeof *t);
  t->kind = kind;
  t->line = x->line;
  t->col = col_of(x, at);
  t->p = at;
  t->len = len;
  return t;
}

/* Whether the next line (after blank and comment lines) starts with a
 * binary operator or '.', which continues the expression: no statement
 * can start that way. */
static int continues(const char *p) {
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\f' || *p == '\v') p++;
    if (*p != '#') break;
    while (*p && *p != '\n') p++;
  }
  if (p[0] == '=' && p[1] == '=') return 1;
  if (p[0] == '.' && p[1] != '.') return 1;
  return *p && strchr("+-*/%@&|^<>?", *p) != NULL;
}

static void newline(lexer *x, const char *at) {
  if (x->depth == 0 && x->n > 0 && ends_statement(x->v[x->n - 1].kind) && !continues(at + 1))
    push(x, T_NEWLINE, at, 1);
  x->line++;
  x->line_start = at + 1;
}

static int is_ident_start(int c) { return isalpha(c) || c == '_'; }
static int is_ident_char(int c) { return isalnum(c) || c == '_'; }

/* Copy digits (dropping '_' separators) into buf; returns the end. */
static const char *scan_digits(const char *p, int hex, char *buf, size_t *bn, size_t cap) {
  while (hex ? isxdigit((unsigned char)*p) || *p == '_' : isdigit((unsigned char)*p) || *p == '_') {
    if (*p != '_' && *bn + 1 < cap) buf[(*bn)++] = *p;
    p++;
  }
  buf[*bn] = 0;
  return p;
}

static void lex_number(lexer *x) {
  const char *s = x->p, *p = s;
  char buf[128];
  size_t bn = 0;
  int is_float = 0, hex = 0;
  if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
    hex = 1;
    p = scan_digits(p + 2, 1, buf, &bn, sizeof buf);
  } else {
    p = scan_digits(p, 0, buf, &bn, sizeof buf);
    if (*p == '.' && p[1] != '.' && !is_ident_start((unsigned char)p[1])) {
      is_float = 1;
      if (bn + 1 < sizeof buf) buf[bn++] = '.';
      p = scan_digits(p + 1, 0, buf, &bn, sizeof buf);
    }
    if ((*p == 'e' || *p == 'E') &&
        (isdigit((unsigned char)p[1]) ||
         ((p[1] == '+' || p[1] == '-') && isdigit((unsigned char)p[2])))) {
      is_float = 1;
      if (bn + 2 < sizeof buf) buf[bn++] = 'e';
      p++;
      if (*p == '+' || *p == '-') {
        if (bn + 1 < sizeof buf) buf[bn++] = *p;
        p++;
      }
      p = scan_digits(p, 0, buf, &bn, sizeof buf);
    }
  }
  int line = x->line, col = col_of(x, s);
  if (is_ident_char((unsigned char)*p)) {
    lang_err(x->d, line, col, "malformed number '%.*s'", (int)(p - s + 1), s);
    while (is_ident_char((unsigned char)*p)) p++;
  }
  token *t = push(x, is_float ? T_FLOAT : T_INT, s, (int)(p - s));
  x->p = p;
  if (!t) return;
  if (is_float) {
    t->fval = strtod(buf, NULL);
    return;
  }
  errno = 0;
  t->ival = strtoull(buf, NULL, hex ? 16 : 10);
  if (errno == ERANGE || (hex && bn == 0))
    lang_err(x->d, line, col, "integer literal '%.*s' does not fit in 64 bits", t->len, s);
}

static void lex_ident(lexer *x) {
  const char *s = x->p, *p = s;
  while (is_ident_char((unsigned char)*p)) p++;
  size_t n = (size_t)(p - s);
  int kind = T_IDENT;
  for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
    if (strlen(keywords[i].s) == n && memcmp(keywords[i].s, s, n) == 0) kind = keywords[i].kind;
  /* min= / max= : augmented min and max (but not min== or a spaced '=') */
  if (kind == T_IDENT && n == 3 && (!memcmp(s, "min", 3) || !memcmp(s, "max", 3)) && p[0] == '=' &&
      p[1] != '=') {
    push(x, s[1] == 'i' ? T_MINEQ : T_MAXEQ, s, 4);
    x->p = p + 1;
    return;
  }
  push(x, kind, s, (int)n);
  x->p = p;
}

static int lex_op(lexer *x) {
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    size_t n = strlen(ops[i].s);
    if (strncmp(x->p, ops[i].s, n) != 0) continue;
    int k = ops[i].kind;
    if (k == T_LPAREN || k == T_LBRACK) x->depth++;
    if ((k == T_RPAREN || k == T_RBRACK) && x->depth > 0) x->depth--;
    /* a block opened inside brackets cannot happen; reset to be robust */
    if (k == T_LBRACE || k == T_RBRACE) x->depth = 0;
    push(x, k, x->p, (int)n);
    x->p += n;
    return 1;
  }
  return 0;
}

int lang_lex(const char *src, token **out, int *ntok, fb_diags *d) {
  lexer x;
  memset(&x, 0, sizeof x);
  x.src = x.p = x.line_start = src;
  x.line = 1;
  x.d = d;
  while (*x.p && !x.nomem) {
    unsigned char c = (unsigned char)*x.p;
    if (c == '\n') {
      newline(&x, x.p);
      x.p++;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      x.p++;
      continue;
    }
    if (c == '#') {
      while (*x.p && *x.p != '\n') x.p++;
      continue;
    }
    if (isdigit(c) || (c == '.' && isdigit((unsigned char)x.p[1]))) {
      lex_number(&x);
      continue;
    }
    if (is_ident_start(c)) {
      lex_ident(&x);
      continue;
    }
    if (lex_op(&x)) continue;
    if (c >= 0x80) {
      lang_err(d, x.line, col_of(&x, x.p),
               "unexpected byte 0x%02x (only ASCII is allowed outside comments)", c);
    } else {
      lang_err(d, x.line, col_of(&x, x.p), "unexpected character '%c'", c);
    }
    x.p++;
  }
  if (!x.nomem && x.n > 0 && ends_statement(x.v[x.n - 1].kind)) push(&x, T_NEWLINE, x.p, 0);
  if (!x.nomem) push(&x, T_EOF, x.p, 0);
  if (x.nomem) {
    free(x.v);
    *out = NULL;
    *ntok = 0;
    return FB_ENOMEM;
  }
  *out = x.v;
  *ntok = x.n;
  return 0;
}
