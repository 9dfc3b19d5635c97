/* Named SNodes and fields reached from the host: activate / deactivate
 * cells, deactivate_all (Taichi's snode.deactivate_all()). Each is a
 * kernel the library adds to the program: the program's source with one
 * kernel appended, parsed by the front end like the program itself, so the
 * kernel is IR checked and registered as any other (fb_remote_add_kernel,
 * fb_session_add_kernel). Its name starts with FB_HOST_PREFIX; an error
 * about it is said in the user's terms (fb_host_kernel_shown). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "client/client_internal.h"
#include "fusebox/client.h"
#include "fusebox/lang.h"

#define FB_HOST_PREFIX "__fbhost_"

static const char *const op_names[] = {"activate", "deactivate", "deactivate_all"};

/* A named SNode (not a field) of the layout, or -1. */
static int find_snode(const fb_layout *l, const char *name) {
  for (int i = 1; i < l->nnodes; i++)
    if (l->nodes[i].kind != FB_SN_PLACE && l->nodes[i].name && !strcmp(l->nodes[i].name, name))
      return i;
  return -1;
}

void fbc_host_name(fb_host_op op, const char *target, char *buf, size_t n) {
  snprintf(buf, n, FB_HOST_PREFIX "%s_%.256s", op_names[op], target);
}

int fb_host_target(const fb_program *p, const char *target, int *snode, int *ndim, char *err,
                   size_t errlen) {
  const fb_layout *l = fb_program_layout(p);
  int f = target ? fb_program_find_field(p, target) : -1;
  int s = f >= 0 ? fb_program_field(p, f)->snode : target ? find_snode(l, target) : -1;
  if (s < 0) {
    fb_errf(err, errlen, "no field or named SNode '%s' in the program", target ? target : "");
    return FB_ENOENT;
  }
  if (s == 0) {
    fb_errf(err, errlen, "field '%s' is 0-D: it has no cells that could be active", target);
    return FB_EINVAL;
  }
  *snode = s;
  *ndim = l->nodes[s].ndim;
  return 0;
}

int fb_host_kernel(const fb_program *p, fb_host_op op, const char *target, fb_program **helper,
                   fb_kernel **out, char *err, size_t errlen) {
  *helper = NULL;
  *out = NULL;
  if ((unsigned)op > FB_HOST_DEACTIVATE_ALL) {
    fb_errf(err, errlen, "unknown host operation %d", (int)op);
    return FB_EINVAL;
  }
  int sn, nd, rc = fb_host_target(p, target, &sn, &nd, err, errlen);
  if (rc) return rc;
  const fb_snode *s = &fb_program_layout(p)->nodes[sn];
  int is_field = fb_program_find_field(p, target) >= 0;
  if (op != FB_HOST_ACTIVATE && s->kind != FB_SN_BITMASKED && s->kind != FB_SN_POINTER &&
      s->kind != FB_SN_DYNAMIC) {
    if (is_field)
      fb_errf(err, errlen,
              "%s: field '%s' lives in a %s SNode, whose cells are always active, so it cannot "
              "be deactivated (place it under a bitmasked or pointer SNode; to clear values, "
              "write 0)",
              op_names[op], target, fb_snode_kind_name(s->kind));
    else
      fb_errf(err, errlen,
              "%s: SNode '%s' is %s, its cells are always active, so they cannot be "
              "deactivated (make it bitmasked or pointer)",
              op_names[op], target, fb_snode_kind_name(s->kind));
    return FB_EINVAL;
  }
  const char *src = fb_program_source(p);
  size_t cap = strlen(src) + strlen(target) * 4 + 64 * (size_t)nd + 1024;
  char *text = malloc(cap), name[320];
  if (!text) {
    fb_errf(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  fbc_host_name(op, target, name, sizeof name);
  char ix[160] = "", params[256] = ""; /* names no program uses (fbhost_...) */
  for (int d = 0; d < nd; d++) {
    size_t a = strlen(ix), b = strlen(params);
    snprintf(ix + a, sizeof ix - a, "%sfbhost_i%d", d ? ", " : "", d);
    snprintf(params + b, sizeof params - b, "%sfbhost_i%d: i32", d ? ", " : "", d);
  }
  size_t n = (size_t)snprintf(text, cap, "%s\nkernel %s(%s) {\n", src, name,
                              op == FB_HOST_DEACTIVATE_ALL ? "" : params);
  if (op == FB_HOST_DEACTIVATE_ALL)
    snprintf(text + n, cap - n, "  for %s in %s { deactivate(%s, %s) }\n}\n", ix, target, target,
             ix);
  else
    snprintf(text + n, cap - n, "  %s(%s, %s)\n}\n", op_names[op], target, ix);
  fb_diags d;
  fb_diags_init(&d);
  fb_program *hp = NULL;
  rc = fb_program_parse(fb_program_filename(p), text, &hp, &d);
  fb_kernel *k = NULL;
  if (!rc) rc = fb_program_instantiate(hp, name, NULL, 0, &k, &d);
  if (rc) {
    /* the program itself parsed: a refusal here is about the target; say
     * it without the added kernel's name or its source line */
    const char *why = d.n > 0 ? d.v[0].msg : fb_strerror(rc);
    fb_errf(err, errlen, "%s of %s '%s': %s", op_names[op], is_field ? "field" : "SNode", target,
            why);
    if (hp) fb_program_free(hp);
    hp = NULL;
  }
  fb_diags_free(&d);
  free(text);
  if (rc) return rc;
  *helper = hp;
  *out = k;
  return 0;
}

const char *fb_host_kernel_shown(const char *kname, char *buf, size_t n) {
  size_t pl = strlen(FB_HOST_PREFIX);
  if (!kname || strncmp(kname, FB_HOST_PREFIX, pl)) return kname;
  const char *rest = kname + pl;
  for (int op = FB_HOST_DEACTIVATE_ALL; op >= 0; op--) { /* the longest name first */
    size_t ol = strlen(op_names[op]);
    if (!strncmp(rest, op_names[op], ol) && rest[ol] == '_') {
      snprintf(buf, n, "%s of '%s'", op_names[op], rest + ol + 1);
      return buf;
    }
  }
  return kname;
}
