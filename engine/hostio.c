/* Host access to fields: whole-field reads and writes (dense copies walk
 * rows; sparse fields go through the sparse runtime) and single cells. Every
 * host access is a sync point of an async session. */
#include "engine/internal.h"

/* ---------------------------------------------------------------- host access
 * A dense field's element address is separable by axis:
 *   offset(idx) = base + sum_d g_d(idx[d]),
 *   g_d(x) = sum over the containers t splitting that axis of
 *            ((x / t.stride) % t.size) * t.mul
 * (see fb_layout_dense_offset), so whole-field copies walk rows, and each
 * row in runs: the innermost container that splits the last dimension (its
 * term has stride 1) is the only term whose digit changes across an
 * aligned run of its size, so a run's elements lie `mul` bytes apart (a
 * plain memcpy when that is the element size). A sparse field's rows take
 * the same runs where that container and everything below it on the path
 * is dense: one walk of the sparse runtime per run (which activates its
 * block, or finds it inactive) instead of one per element. So do the rows
 * of a field placed directly in a bitmasked container that splits the last
 * dimension: one walk to the container a run, then its cells' bits. */

typedef struct axis_term {
  int64_t stride, size;
  uint64_t mul;
  int depth; /* the container's place in the path from the root (0 first) */
} axis_term;

typedef struct field_plan {
  const fb_snode *f;
  size_t esz;
  int ndim;
  int64_t shape[FB_MAX_AXES]; /* per index, in axis order */
  int64_t numel;
  uint64_t base;
  int nterm[FB_MAX_AXES];
  axis_term term[FB_MAX_AXES][MAX_PATH];
  /* the last dimension's runs: elements per run (1: element by element),
   * bytes between a run's elements; sparse_runs: a sparse field may copy
   * in these runs too (the run's container and all below it are dense,
   * or bits_runs: the run's container is bitmasked and holds the field,
   * its elements lin_step cells apart) */
  int64_t run;
  uint64_t run_step;
  int sparse_runs, bits_runs;
  int64_t lin_step;
} field_plan;

static void copy_elem(uint8_t *dst, const uint8_t *src, size_t esz, int to_bool);
static void copy_run(const field_plan *p, uint8_t *dev, uint8_t *host, int64_t n, int write);

/* ---------------------------------------------------------------- device memory
 * On memory the host must not dereference (the CUDA backend's device
 * memory, fb_memsys_copies) every touch of session memory is a copy:
 * whole dense fields through one window of the root buffer, sparse runs
 * and cells through the span they cover (fetched first unless a write
 * covers every byte of it), and the sparse walks copy on their own. */

static int copies(const fb_session *s) { return fb_memsys_copies(s->mem.ms); }

/* A failed copy: the device's message (FB_EDEVICE, or the sparse walk's). */
static int copy_failed(fb_session *s, int rc, const char *what, const char *err) {
  return fail(s, rc, "%s: %s", what, err);
}

/* copy_run between host and the device address d. */
static int xrun(fb_session *s, const field_plan *p, uint8_t *d, uint8_t *h, int64_t n, int write,
                const char *what) {
  if (!copies(s)) {
    copy_run(p, d, h, n, write);
    return 0;
  }
  size_t span = (size_t)((uint64_t)(n - 1) * p->run_step + p->esz);
  uint8_t *tmp = malloc(span);
  if (!tmp) return fail(s, FB_ENOMEM, "%s: out of memory", what);
  char err[512];
  int rc = 0;
  if (!write || (n > 1 && p->run_step != p->esz)) rc = fb_devmem_get(&s->mem, tmp, d, span, err, sizeof err);
  if (!rc) {
    copy_run(p, tmp, h, n, write);
    if (write) rc = fb_devmem_put(&s->mem, d, tmp, span, err, sizeof err);
  }
  free(tmp);
  return rc ? copy_failed(s, rc, what, err) : 0;
}

/* copy_elem between host and the device address d. */
static int xelem(fb_session *s, uint8_t *d, uint8_t *h, size_t esz, int write, int to_bool,
                 const char *what) {
  if (!copies(s)) {
    if (write) copy_elem(d, h, esz, to_bool);
    else copy_elem(h, d, esz, 0);
    return 0;
  }
  uint8_t tmp[16];
  char err[512];
  int rc;
  if (write) {
    copy_elem(tmp, h, esz, to_bool);
    rc = fb_devmem_put(&s->mem, d, tmp, esz, err, sizeof err);
  } else if (!(rc = fb_devmem_get(&s->mem, tmp, d, esz, err, sizeof err))) {
    copy_elem(h, tmp, esz, 0);
  }
  return rc ? copy_failed(s, rc, what, err) : 0;
}

/* A copy inside a sparse walk failed: its error (0: none). */
static int walk_failed(fb_session *s, const char *what) {
  char err[512];
  int rc = s->sparse && copies(s) ? fb_sparse_host_error(s->sparse, err, sizeof err) : 0;
  return rc ? copy_failed(s, rc, what, err) : 0;
}

static int check_field(fb_session *s, int field, const char *what) {
  const fb_layout *l = s->layout;
  if (field < 0 || field >= l->nnodes)
    return fail(s, FB_ENOENT, "%s: no field with id %d (the layout has %d SNodes)", what, field,
                l->nnodes);
  const fb_snode *f = &l->nodes[field];
  if (f->kind != FB_SN_PLACE)
    return fail(s, FB_EINVAL, "%s: SNode %d (%s%s%s) is not a field", what, field,
                fb_snode_kind_name(f->kind), f->name ? " " : "", f->name ? f->name : "");
  return 0;
}

/* Does the field lie under a sparse container? */
static int field_is_sparse(const fb_session *s, int field) {
  return s->sparse && fb_cg_sparse_leaf(s->layout, s->layout->nodes[field].parent) != 0;
}

/* Host side of an out-of-memory while activating: FB_EQUOTA naming the SNode. */
static int host_oom(fb_session *s, const char *what) {
  char oom[512];
  if (!fbe_oom_message(s, oom, sizeof oom)) snprintf(oom, sizeof oom, "out of device memory");
  return fail(s, FB_EQUOTA, "%s: %s", what, oom);
}

/* Through the sparse runtime, a run of the last dimension per walk where
 * the plan allows (else element by element): reads of inactive cells give
 * 0, writes activate (every element of the field), IO_ACTIVE writes one
 * byte per element, 1 where the cell is active (and activates nothing). A
 * run lies in one block of its dense container, so its first element's
 * walk finds (or makes) the whole run's storage. */
enum { IO_READ, IO_WRITE, IO_ACTIVE };
static int sparse_io(fb_session *s, const field_plan *p, uint8_t *host, int mode,
                     const char *what) {
  int write = mode == IO_WRITE;
  const fb_snode *f = p->f;
  size_t esz = p->esz;
  int64_t numel = p->numel, idx[FB_MAX_AXES] = {0, 0, 0, 0};
  int last = f->ndim - 1;
  int64_t run = p->sparse_runs && last >= 0 ? p->run : 1;
  uint8_t *bits = NULL; /* a run's cells' activity (bits_runs) */
  int oom = 0, rc = 0;
  if (p->bits_runs && run > 1 && !(bits = malloc((size_t)run)))
    return fail(s, FB_ENOMEM, "%s: out of memory", what);
  fb_sparse_begin(s->sparse);
  for (int64_t e = 0; e < numel;) {
    int64_t n = 1;
    if (last >= 0) {
      int64_t left = p->shape[last] - idx[last];
      n = run < left ? run : left;
    }
    uint8_t *h = host + (size_t)e * (mode == IO_ACTIVE ? 1 : esz);
    uint8_t *d;
    if (bits && n > 1) {
      d = fb_sparse_bits_run(s->sparse, s->mem.root, f->id, idx, n, p->lin_step, bits, write);
      if (write && !d) {
        oom = 1;
        break;
      }
      if ((rc = walk_failed(s, what))) break;
      int64_t on = 0;
      for (int64_t k = 0; d && !write && k < n; k++) on += bits[k];
      if (write) rc = xrun(s, p, d, h, n, 1, what);
      else if (mode == IO_ACTIVE && d) memcpy(h, bits, (size_t)n);
      else if (mode == IO_ACTIVE) memset(h, 0, (size_t)n);
      else if (on == n) rc = xrun(s, p, d, h, n, 0, what);
      else if (d && on && copies(s)) { /* one copy of the run, then its active cells */
        uint8_t *run = malloc((size_t)n * esz);
        rc = run ? xrun(s, p, d, run, n, 0, what) : fail(s, FB_ENOMEM, "%s: out of memory", what);
        for (int64_t k = 0; !rc && k < n; k++)
          if (bits[k]) memcpy(h + (size_t)k * esz, run + (size_t)k * esz, esz);
          else memset(h + (size_t)k * esz, 0, esz);
        free(run);
      } else
        for (int64_t k = 0; k < n; k++) {
          if (d && bits[k]) copy_elem(h + (size_t)k * esz, d + (uint64_t)k * p->run_step, esz, 0);
          else memset(h + (size_t)k * esz, 0, esz);
        }
    } else {
      d = fb_sparse_elem(s->sparse, s->mem.root, f->id, idx, write);
      if ((rc = walk_failed(s, what))) break;
      if (write && !d) {
        oom = 1;
        break;
      }
      if (mode == IO_ACTIVE) memset(h, d != NULL, (size_t)n);
      else if (d && n > 1) rc = xrun(s, p, d, h, n, write, what);
      else if (d) rc = xelem(s, d, h, esz, write, f->type == FB_T_BOOL, what);
      else memset(h, 0, (size_t)n * esz);
    }
    if (rc) break;
    e += n;
    if (last >= 0) idx[last] += n - 1;
    for (int k = last; k >= 0; k--) { /* odometer */
      if (++idx[k] < f->shape[f->dim_axis[k]]) break;
      idx[k] = 0;
    }
  }
  free(bits);
  if (rc) return rc;
  return oom ? host_oom(s, what) : 0;
}

static int dim_of_axis(const fb_snode *f, int axis) {
  for (int d = 0; d < f->ndim; d++)
    if (f->dim_axis[d] == axis) return d;
  return -1;
}

/* The terms container s adds to each dimension it splits. */
static void plan_node(field_plan *p, const fb_layout *l, const fb_snode *s, int depth) {
  for (int a = 0; a < FB_MAX_AXES; a++) {
    if (!(s->axes & (1u << a))) continue;
    int d = dim_of_axis(p->f, a);
    if (d < 0 || p->nterm[d] >= MAX_PATH) continue;
    uint64_t mul = s->cell_bytes;
    for (int b = a + 1; b < FB_MAX_AXES; b++)
      if (s->axes & (1u << b)) mul *= (uint64_t)s->size[b];
    axis_term *t = &p->term[d][p->nterm[d]++];
    t->stride = fb_layout_stride(l, s->id, p->f->id, a);
    t->size = s->size[a];
    t->mul = mul;
    t->depth = depth;
  }
}

static void plan_field(field_plan *p, const fb_layout *l, int field) {
  memset(p, 0, sizeof *p);
  p->f = &l->nodes[field];
  p->esz = fb_type_size(p->f->type);
  p->ndim = p->f->ndim;
  p->numel = 1;
  for (int d = 0; d < p->ndim; d++) {
    p->shape[d] = p->f->shape[p->f->dim_axis[d]];
    p->numel *= p->shape[d];
  }
  int path[MAX_PATH];
  int n = fb_layout_path(l, field, path, MAX_PATH);
  p->base = p->f->offset;
  for (int i = 0; i < n; i++) {
    const fb_snode *s = &l->nodes[path[i]];
    p->base += s->offset;
    plan_node(p, l, s, i);
  }
  p->run = 1;
  int last = p->ndim - 1;
  if (last < 0 || p->nterm[last] == 0) return;
  const axis_term *in = &p->term[last][p->nterm[last] - 1];
  if (in->stride != 1 || in->size < 1) return;
  p->run = in->size;
  p->run_step = in->mul;
  p->sparse_runs = n > 0;
  for (int i = in->depth; i < n; i++) {
    const fb_snode *c = &l->nodes[path[i]];
    if (c->kind == FB_SN_BITMASKED && i == in->depth && i == n - 1 && c->cell_bytes > 0) {
      p->bits_runs = 1;
      p->lin_step = (int64_t)(in->mul / c->cell_bytes);
    } else if (c->kind != FB_SN_DENSE) {
      p->sparse_runs = 0;
    }
  }
  if (!p->sparse_runs) p->bits_runs = 0;
}

static uint64_t axis_offset(const field_plan *p, int d, int64_t x) {
  uint64_t off = 0;
  for (int t = 0; t < p->nterm[d]; t++) {
    const axis_term *at = &p->term[d][t];
    off += (uint64_t)((x / at->stride) % at->size) * at->mul;
  }
  return off;
}

static void copy_elem(uint8_t *dst, const uint8_t *src, size_t esz, int to_bool) {
  switch (esz) {
  case 1: *dst = to_bool ? *src != 0 : *src; break;
  case 4: memcpy(dst, src, 4); break;
  case 8: memcpy(dst, src, 8); break;
  default: memcpy(dst, src, esz); break;
  }
}

/* n elements step bytes apart on the device (dev), packed on the host. */
static void copy_run(const field_plan *p, uint8_t *dev, uint8_t *host, int64_t n, int write) {
  size_t esz = p->esz;
  uint64_t step = p->run_step;
  int to_bool = write && p->f->type == FB_T_BOOL;
  if (step == esz && !to_bool) {
    if (write) memcpy(dev, host, (size_t)n * esz);
    else memcpy(host, dev, (size_t)n * esz);
    return;
  }
  for (int64_t x = 0; x < n; x++) {
    if (write) copy_elem(dev + (uint64_t)x * step, host + (size_t)x * esz, esz, to_bool);
    else copy_elem(host + (size_t)x * esz, dev + (uint64_t)x * step, esz, 0);
  }
}

/* One row of the last dimension between device (dev) and host, in runs. */
static void copy_row(const field_plan *p, uint8_t *dev, uint8_t *host, int64_t len, int write) {
  int last = p->ndim - 1;
  for (int64_t x = 0; x < len; x += p->run) {
    int64_t n = len - x < p->run ? len - x : p->run;
    uint8_t *d = dev + axis_offset(p, last, x), *h = host + (size_t)x * p->esz;
    if (n == 1) {
      if (write) copy_elem(d, h, p->esz, p->f->type == FB_T_BOOL);
      else copy_elem(h, d, p->esz, 0);
    } else {
      copy_run(p, d, h, n, write);
    }
  }
}

static void copy_field(const field_plan *p, uint8_t *root, uint8_t *host, int write) {
  if (p->ndim == 0) {
    if (write) copy_elem(root + p->base, host, p->esz, p->f->type == FB_T_BOOL);
    else copy_elem(host, root + p->base, p->esz, 0);
    return;
  }
  int last = p->ndim - 1;
  int64_t len = p->shape[last], rows = p->numel / len;
  int64_t idx[FB_MAX_AXES] = {0, 0, 0, 0};
  for (int64_t r = 0; r < rows; r++) {
    uint64_t off = p->base;
    for (int d = 0; d < last; d++) off += axis_offset(p, d, idx[d]);
    copy_row(p, root + off, host + (size_t)(r * len) * p->esz, len, write);
    for (int d = last - 1; d >= 0; d--) { /* odometer over the outer dims */
      if (++idx[d] < p->shape[d]) break;
      idx[d] = 0;
    }
  }
}

/* A dense field: in place, or through one window of the root buffer that
 * holds every element (fetched first unless the field fills it). */
static int dense_io(fb_session *s, field_plan *p, uint8_t *buf, int write, const char *what) {
  if (!copies(s)) {
    copy_field(p, s->mem.root, buf, write);
    return 0;
  }
  uint64_t lo = p->base, hi = p->base + p->esz;
  for (int d = 0; d < p->ndim; d++)
    for (int t = 0; t < p->nterm[d]; t++) {
      const axis_term *at = &p->term[d][t];
      int64_t reach = (p->shape[d] - 1) / at->stride;
      if (reach > at->size - 1) reach = at->size - 1;
      hi += (uint64_t)reach * at->mul;
    }
  if (hi > s->mem.root_bytes) hi = s->mem.root_bytes;
  size_t n = (size_t)(hi - lo);
  uint8_t *win = malloc(n ? n : 1);
  if (!win) return fail(s, FB_ENOMEM, "%s: out of memory", what);
  char err[512];
  int rc = 0;
  if (!write || n != (uint64_t)p->numel * p->esz)
    rc = fb_devmem_get(&s->mem, win, s->mem.root + lo, n, err, sizeof err);
  if (!rc) {
    p->base -= lo;
    copy_field(p, win, buf, write);
    p->base += lo;
    if (write) rc = fb_devmem_put(&s->mem, s->mem.root + lo, win, n, err, sizeof err);
  }
  free(win);
  return rc ? copy_failed(s, rc, what, err) : 0;
}

static int field_io(fb_session *s, int field, void *buf, size_t bytes, int write) {
  const char *what = write ? "field write" : "field read";
  if (!s) return FB_EINVAL;
  int rc = check_field(s, field, what);
  if (rc) return rc;
  field_plan *p = malloc(sizeof *p);
  if (!p) return fail(s, FB_ENOMEM, "%s: out of memory", what);
  plan_field(p, s->layout, field);
  uint64_t want = (uint64_t)p->numel * p->esz;
  if (bytes != want || !buf) {
    rc = fail(s, FB_EINVAL,
              "%s: field '%s' holds %lld elements of %s (%llu bytes); %zu bytes "
              "given%s",
              what, p->f->name, (long long)p->numel, fb_type_name(p->f->type),
              (unsigned long long)want, bytes, buf ? "" : " with no buffer");
  } else if (field_is_sparse(s, field)) {
    rc = sparse_io(s, p, buf, write ? IO_WRITE : IO_READ, what);
  } else {
    rc = dense_io(s, p, buf, write, what);
  }
  free(p);
  return rc;
}

/* Async: host access waits for everything launched before it. */
static int host_begin(fb_session *s) {
  int rc = s ? fbe_device_dead(s) : 0;
  return rc ? rc : s && s->as ? fbe_async_wait_all(s) : 0;
}

/* Async: a write gives the states it touched a new version in the SFG (a
 * write below sparse containers also activates); then the access reports
 * the errors of background launches, unless it failed itself. */
static int host_end(fb_session *s, int field, int write, int rc) {
  if (!s || !s->as) return rc;
  const fb_layout *l = s->layout;
  if (write && field > 0 && field < l->nnodes && l->nodes[field].kind == FB_SN_PLACE) {
    if (fb_opt_host_write(s->as->o, field) && !rc)
      rc = fail(s, FB_EINTERNAL, "host write of field '%s': the optimizer refused it: %s",
                l->nodes[field].name, fb_opt_errmsg(s->as->o));
    pthread_mutex_lock(&s->cmu);
    s->dev_bytes = fb_devmem_used(&s->mem);
    pthread_mutex_unlock(&s->cmu);
  }
  return rc ? rc : fbe_report_bg(s);
}

int fb_field_read(fb_session *s, int field, void *dst, size_t bytes) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 0, field_io(s, field, dst, bytes, 0));
}

int fb_field_write(fb_session *s, int field, const void *src, size_t bytes) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 1, field_io(s, field, (void *)src, bytes, 1));
}

/* One byte per element, 1 where the cell is active: sparse fields walk
 * the sparse runtime without activating anything; a dense field is all
 * active. */
static int field_active(fb_session *s, int field, uint8_t *mask, size_t n) {
  if (!s) return FB_EINVAL;
  int rc = check_field(s, field, "field activity");
  if (rc) return rc;
  const fb_snode *f = &s->layout->nodes[field];
  int64_t numel = fb_field_numel(s->layout, field);
  if (!mask || n != (uint64_t)numel)
    return fail(s, FB_EINVAL, "field activity: field '%s' holds %lld elements; %zu bytes given",
                f->name, (long long)numel, n);
  if (!field_is_sparse(s, field)) {
    memset(mask, 1, n);
    return 0;
  }
  field_plan *p = malloc(sizeof *p);
  if (!p) return fail(s, FB_ENOMEM, "field activity: out of memory");
  plan_field(p, s->layout, field);
  rc = sparse_io(s, p, mask, IO_ACTIVE, "field activity");
  free(p);
  return rc;
}

int fb_field_active(fb_session *s, int field, uint8_t *mask, size_t n) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 0, field_active(s, field, mask, n));
}

/* Validate one element's index; returns its address through *addr (NULL:
 * an inactive cell when reading). Writing activates the cell. */
static int cell_addr(fb_session *s, int field, const int64_t *idx, int nidx, const char *what,
                     const fb_value *v, uint8_t **addr) {
  int rc = check_field(s, field, what);
  if (rc) return rc;
  const fb_snode *f = &s->layout->nodes[field];
  if (nidx != f->ndim || (nidx > 0 && !idx))
    return fail(s, FB_EINVAL, "%s: field '%s' takes %d indices, %d given", what, f->name, f->ndim,
                nidx);
  for (int d = 0; d < nidx; d++) {
    if (idx[d] >= 0 && idx[d] < f->shape[f->dim_axis[d]]) continue;
    char ix[128] = "", sh[128] = "";
    for (int e = 0; e < nidx; e++) {
      size_t a = strlen(ix), b = strlen(sh);
      snprintf(ix + a, sizeof ix - a, "%s%lld", e ? ", " : "", (long long)idx[e]);
      snprintf(sh + b, sizeof sh - b, "%s%lld", e ? ", " : "", (long long)f->shape[f->dim_axis[e]]);
    }
    return fail(s, FB_EBOUNDS, "%s: index (%s) is out of bounds of field '%s' of shape (%s)", what,
                ix, f->name, sh);
  }
  if (v && !fbe_kinds_agree(f->type, v->type))
    return fail(s, FB_ETYPE, "%s: field '%s' of type %s cannot take a value of type %s", what,
                f->name, fb_type_name(f->type), fbe_type_name_safe(v->type));
  int write = v != NULL;
  if (!field_is_sparse(s, field)) {
    *addr = s->mem.root + fb_layout_dense_offset(s->layout, field, idx);
    return 0;
  }
  fb_sparse_begin(s->sparse);
  *addr = fb_sparse_elem(s->sparse, s->mem.root, field, idx, write);
  if ((rc = walk_failed(s, what))) return rc;
  return write && !*addr ? host_oom(s, what) : 0;
}

static int cell_read(fb_session *s, int field, const int64_t *idx, int nidx, fb_value *out) {
  uint8_t *p = NULL;
  if (!s) return FB_EINVAL;
  int rc = cell_addr(s, field, idx, nidx, "cell read", NULL, &p);
  if (rc) return rc;
  fb_type t = s->layout->nodes[field].type;
  if (p) {
    uint8_t cell[16];
    if ((rc = xelem(s, p, cell, fb_type_size(t), 0, 0, "cell read"))) return rc;
    *out = fb_value_load(t, cell);
  } else {
    memset(out, 0, sizeof *out);
    out->type = t;
  }
  return 0;
}

static int cell_write(fb_session *s, int field, const int64_t *idx, int nidx, fb_value v) {
  uint8_t *p = NULL;
  if (!s) return FB_EINVAL;
  int rc = cell_addr(s, field, idx, nidx, "cell write", &v, &p);
  if (rc) return rc;
  fb_type t = s->layout->nodes[field].type;
  uint8_t cell[16];
  fb_value_store(fb_value_cast(v, t), cell);
  return xelem(s, p, cell, fb_type_size(t), 1, 0, "cell write");
}

int fb_cell_read(fb_session *s, int field, const int64_t *idx, int nidx, fb_value *out) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 0, cell_read(s, field, idx, nidx, out));
}

int fb_cell_write(fb_session *s, int field, const int64_t *idx, int nidx, fb_value v) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 1, cell_write(s, field, idx, nidx, v));
}
