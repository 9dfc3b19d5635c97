/* The derivative rules of the kernel IR's differentiable ops, shared by the
 * reverse pass (ir/adjoint.c) and the forward pass (ir/tangent.c): one home
 * for each rule. A rule is a linear map per operand, applied to a value g:
 * the reverse pass applies it to the adjoint of the result (the
 * contribution to the operand's adjoint), the forward pass to the
 * operand's tangent (a term of the result's tangent). For the scalar ops
 * here both are g · ∂s/∂operand, so the same emitted code serves both. */
#ifndef FB_AD_RULES_H
#define FB_AD_RULES_H

#include "fusebox/ir.h"

/* Where a rule emits: the builder, the kernel it builds (its statement
 * count is held to cap) and the first error seen (sticky, as the passes'
 * own emitters). */
typedef struct fb_ad_em {
  fb_builder *b;
  const fb_kernel *out;
  long cap;
  int rc;
} fb_ad_em;

/* Does operand i of s carry a derivative (for a float result)? cast
 * (operand 0) and select (operands 1 and 2) included; the rules below
 * cover every other op for which this is true. */
int fb__ad_diff_operand(const fb_stmt *s, int i);

/* For a differentiable op s other than cast and select (arithmetic, math)
 * whose result R and operands A, B (-1 when absent) are values of the
 * emitted kernel: c[i] = g[i] · ∂s/∂operand_i, emitted, for i = 0, 1 where
 * g[i] >= 0; c[i] = -1 elsewhere and for the piecewise-constant ops
 * (floor, ceil, round, floordiv: 0 almost everywhere). */
void fb__ad_rule(fb_ad_em *e, const fb_stmt *s, int A, int B, int R, const int g[2], int c[2]);

/* Derivative places: the gradient or the dual of place x is the sibling
 * place named x + suffix (".grad", ".dual"), of the same float type.
 * fb__layout_add_sibling adds it (noun: "gradient" or "dual", for the
 * messages); fb__sibling_map_from_layout maps each place to its sibling
 * (g->grad[x] = the sibling's id, -1 when none). */
int fb__layout_add_sibling(fb_layout *l, int place, const char *suffix, const char *noun,
                           char *err, size_t errlen);
int fb__sibling_map_from_layout(const fb_layout *l, const char *suffix, fb_grad_map *g);

#endif
