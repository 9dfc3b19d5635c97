/* The tokens of the .fbk language and the lexer that makes them
 * (lang_lex.c). The lexer is the front end's first stage and depends on
 * nothing above it: this header, the diagnostics (lang_diag.h) and the
 * base. */
#ifndef FB_LANG_LEX_H
#define FB_LANG_LEX_H

#include <stdint.h>

#include "lang_diag.h"


enum {
  T_EOF = 0,
  T_NEWLINE,
  T_IDENT,
  T_INT,
  T_FLOAT,
  T_LPAREN,
  T_RPAREN,
  T_LBRACE,
  T_RBRACE,
  T_LBRACK,
  T_RBRACK,
  T_COMMA,
  T_COLON,
  T_SEMI,
  T_DOT,
  T_DOTDOT,
  T_ARROW,
  T_QUESTION,
  T_PLUS,
  T_MINUS,
  T_STAR,
  T_SLASH,
  T_SLASHSLASH,
  T_PERCENT,
  T_STARSTAR,
  T_AT,
  T_ASSIGN,
  T_EQ,
  T_NE,
  T_LT,
  T_LE,
  T_GT,
  T_GE,
  T_ANDAND,
  T_OROR,
  T_BANG,
  T_AMP,
  T_PIPE,
  T_CARET,
  T_TILDE,
  T_SHL,
  T_SHR,
  T_PLUSEQ,
  T_MINUSEQ,
  T_STAREQ,
  T_SLASHEQ,
  T_AMPEQ,
  T_PIPEEQ,
  T_CARETEQ,
  T_MINEQ,
  T_MAXEQ,
  T_SLASHSLASHEQ,
  T_PERCENTEQ,
  T_STARSTAREQ,
  T_SHLEQ,
  T_SHREQ,
  /* keywords */
  T_KERNEL,
  T_FUNC,
  T_LET,
  T_VAR,
  T_IF,
  T_ELSE,
  T_WHILE,
  T_FOR,
  T_IN,
  T_BREAK,
  T_CONTINUE,
  T_RETURN,
  T_TRUE,
  T_FALSE,
  T_NOT,   /* `not`; `and` and `or` lex as T_ANDAND and T_OROR */
  T_CONST,
  T__COUNT
};

typedef struct token {
  int kind;
  int line, col;
  const char *p; /* into the source */
  int len;
  uint64_t ival;
  double fval;
} token;

/* Tokenize src. Newlines are tokens only where they can end a statement
 * (after a name, literal, closing bracket or break/continue/return) and
 * outside ( ) and [ ]. Errors go to d; the token array always ends in T_EOF. */
int lang_lex(const char *src, token **out, int *ntok, fb_diags *d);
const char *lang_tok_name(int kind); /* "'{'", "identifier", ... */

#endif
