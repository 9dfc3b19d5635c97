/* PNG pictures (`save ... to X.png`, `read ... to X.png` in JSON
 * sessions), written with libpng's simplified API: 8-bit RGB.
 *
 * A 2-D field of scalars has one pixel per cell, in one of two
 * orientations: "matrix" (the default) puts the field's first index down
 * the rows (top to bottom) and its second across the columns, as NumPy and
 * matplotlib's imshow show an array; "taichi" puts the first index along x
 * and the second upward, as Taichi's GUI and ti.tools.imwrite. Values go
 * through a colour map over a range: [lo, hi] when given, else the finite
 * minimum and maximum of the field; values outside are clamped, NaN is
 * drawn magenta so that it stands out.
 *
 * A field of 2-vectors can instead be drawn as particles (Taichi's
 * gui.circles): discs of one colour on a background. */
#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"

/* matplotlib's viridis at 0, 0.1, ..., 1 (perceptually uniform, readable
 * in grey and by most colour-blind readers); linear between the stops */
static const uint8_t viridis[11][3] = {
    {68, 1, 84},    {72, 36, 117},  {65, 68, 135},  {53, 95, 141},  {42, 120, 142}, {33, 145, 140},
    {34, 168, 132}, {68, 191, 112}, {122, 209, 81}, {189, 223, 38}, {253, 231, 37}};

int fb_png_colormap_known(const char *name) {
  return !name || !strcmp(name, "viridis") || !strcmp(name, "gray");
}

/* t in [0, 1] to a colour. */
static void color(double t, int gray, uint8_t *px) {
  if (gray) {
    px[0] = px[1] = px[2] = (uint8_t)lround(255.0 * t);
    return;
  }
  double x = t * 10.0;
  int k = (int)x;
  if (k >= 10) k = 9;
  double f = x - k;
  for (int c = 0; c < 3; c++)
    px[c] = (uint8_t)lround(viridis[k][c] + f * (viridis[k + 1][c] - viridis[k][c]));
}

void fb_png_range(const double *v, int64_t n, const fb_png_opts *o, double *lo, double *hi) {
  if (o && o->has_range) {
    *lo = o->lo;
    *hi = o->hi;
    return;
  }
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(v[i])) {
      *lo = fmin(*lo, v[i]);
      *hi = fmax(*hi, v[i]);
    }
  if (*lo > *hi) *lo = *hi = 0; /* nothing finite */
}

/* w x h RGB pixels (rows top to bottom) into f. */
static int write_rgb(FILE *f, const char *path, const uint8_t *buf, int64_t w, int64_t h,
                     char *err, size_t errlen) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)w;
  img.height = (png_uint_32)h;
  img.format = PNG_FORMAT_RGB;
  int ok = png_image_write_to_stdio(&img, f, 0, buf, 0, NULL) && fflush(f) == 0;
  if (!ok) {
    fb_errf(err, errlen, "%s: %s", path, img.message[0] ? img.message : "cannot write the PNG");
    png_image_free(&img);
    return FB_EIO;
  }
  return 0;
}

int fb_png_write(FILE *f, const char *path, const double *v, int64_t n0, int64_t n1,
                 const fb_png_opts *o, char *err, size_t errlen) {
  if (n0 < 1 || n1 < 1 || n0 > INT32_MAX || n1 > INT32_MAX ||
      (uint64_t)n1 > SIZE_MAX / 3 / (uint64_t)n0) {
    fb_errf(err, errlen, "%s: cannot make a %lld x %lld picture", path, (long long)n0,
            (long long)n1);
    return FB_EINVAL;
  }
  const char *cmap = o && o->colormap ? o->colormap : "viridis";
  if (!fb_png_colormap_known(cmap)) {
    fb_errf(err, errlen, "%s: unknown colour map '%s' (viridis or gray)", path, cmap);
    return FB_EINVAL;
  }
  int gray = !strcmp(cmap, "gray"), taichi = o && o->taichi;
  int64_t w = taichi ? n0 : n1, h = taichi ? n1 : n0; /* the picture's */
  size_t cells = (size_t)n0 * (size_t)n1;
  uint8_t *buf = malloc(cells * 3);
  if (!buf) {
    fb_errf(err, errlen, "%s: out of memory", path);
    return FB_ENOMEM;
  }
  double lo, hi;
  fb_png_range(v, (int64_t)cells, o, &lo, &hi);
  double span = hi - lo;
  for (int64_t y = 0; y < h; y++)
    for (int64_t x = 0; x < w; x++) {
      /* taichi: column x is index i, row y (from the top) is j = h-1-y */
      double val = taichi ? v[x * n1 + (h - 1 - y)] : v[y * n1 + x];
      uint8_t *px = buf + 3 * (size_t)(y * w + x);
      if (isnan(val)) {
        px[0] = 255, px[1] = 0, px[2] = 255;
        continue;
      }
      double t = span > 0 ? (val - lo) / span : 0.0;
      color(t < 0 ? 0 : t > 1 ? 1 : t, gray, px);
    }
  int rc = write_rgb(f, path, buf, w, h, err, errlen);
  free(buf);
  return rc;
}

int fb_png_write_particles(FILE *f, const char *path, const char *field, const double *xy,
                           int64_t n, const fb_png_particles *p, char *err, size_t errlen) {
  int64_t w = p->w, h = p->h;
  double r = p->radius;
  if (w < 1 || h < 1 || w > FB_PNG_MAX_SIDE || h > FB_PNG_MAX_SIDE || !(r >= 0) || !isfinite(r)) {
    fb_errf(err, errlen, "%s: cannot draw %lld x %lld with radius %g", path, (long long)w,
            (long long)h, r);
    return FB_EINVAL;
  }
  for (int64_t k = 0; k < n; k++)
    if (!isfinite(xy[2 * k]) || !isfinite(xy[2 * k + 1])) {
      fb_errf(err, errlen, "%s: particle %lld of '%s' is at (%g, %g); positions must be finite",
              path, (long long)k, field, xy[2 * k], xy[2 * k + 1]);
      return FB_EINVAL;
    }
  uint8_t *buf = malloc((size_t)w * (size_t)h * 3);
  if (!buf) {
    fb_errf(err, errlen, "%s: out of memory", path);
    return FB_ENOMEM;
  }
  for (size_t i = 0; i < (size_t)w * (size_t)h; i++) memcpy(buf + 3 * i, p->background, 3);
  double reach = ceil(r) + 1; /* pixels around the centre's that may be painted */
  for (int64_t k = 0; k < n; k++) {
    double cx = xy[2 * k] * (double)w, cy = xy[2 * k + 1] * (double)h; /* y up */
    if (cx < -reach - 1 || cy < -reach - 1 || cx > (double)w + reach + 1 ||
        cy > (double)h + reach + 1)
      continue; /* wholly outside (and far from int64's limits) */
    double fx = floor(cx), fy = floor(cy);
    int64_t bx = (int64_t)fx, by = (int64_t)fy, R = (int64_t)reach;
    int64_t x0 = bx - R < 0 ? 0 : bx - R, x1 = bx + R >= w ? w - 1 : bx + R;
    int64_t y0 = by - R < 0 ? 0 : by - R, y1 = by + R >= h ? h - 1 : by + R;
    for (int64_t y = y0; y <= y1; y++)
      for (int64_t x = x0; x <= x1; x++) {
        double dx = (double)x + 0.5 - cx, dy = (double)y + 0.5 - cy;
        if (dx * dx + dy * dy <= r * r || (x == bx && y == by))
          memcpy(buf + 3 * (size_t)((h - 1 - y) * w + x), p->color, 3);
      }
  }
  int rc = write_rgb(f, path, buf, w, h, err, errlen);
  free(buf);
  return rc;
}

int fb_png_is_name(const char *file) {
  size_t n = strlen(file);
  return n > 4 && !strcasecmp(file + n - 4, ".png");
}
