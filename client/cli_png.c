/* PNG pictures of 2-D fields (`save ... to X.png`, `read ... to X.png` in
 * JSON sessions), written with libpng's simplified API: 8-bit RGB, one
 * pixel per cell, the field's first index down the rows (top to bottom)
 * and its second across the columns, as NumPy and matplotlib's imshow show
 * an array. Values go through a colour map over a range: [lo, hi] when
 * given, else the finite minimum and maximum of the field; values outside
 * are clamped, NaN is drawn magenta so that it stands out. */
#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "client/cli.h"

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

int fb_png_write(FILE *f, const char *path, const double *v, int64_t h, int64_t w,
                 const fb_png_opts *o, char *err, size_t errlen) {
  if (h < 1 || w < 1 || h > INT32_MAX || w > INT32_MAX ||
      (uint64_t)w > SIZE_MAX / 3 / (uint64_t)h) {
    fb_errf(err, errlen, "%s: cannot make a %lld x %lld picture", path, (long long)h, (long long)w);
    return FB_EINVAL;
  }
  const char *cmap = o && o->colormap ? o->colormap : "viridis";
  if (!fb_png_colormap_known(cmap)) {
    fb_errf(err, errlen, "%s: unknown colour map '%s' (viridis or gray)", path, cmap);
    return FB_EINVAL;
  }
  int gray = !strcmp(cmap, "gray");
  size_t cells = (size_t)h * (size_t)w;
  uint8_t *buf = malloc(cells * 3);
  if (!buf) {
    fb_errf(err, errlen, "%s: out of memory", path);
    return FB_ENOMEM;
  }
  double lo, hi;
  fb_png_range(v, (int64_t)cells, o, &lo, &hi);
  double span = hi - lo;
  for (size_t i = 0; i < cells; i++) {
    uint8_t *px = buf + 3 * i;
    if (isnan(v[i])) {
      px[0] = 255, px[1] = 0, px[2] = 255;
      continue;
    }
    double t = span > 0 ? (v[i] - lo) / span : 0.0;
    color(t < 0 ? 0 : t > 1 ? 1 : t, gray, px);
  }
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)w;
  img.height = (png_uint_32)h;
  img.format = PNG_FORMAT_RGB;
  int ok = png_image_write_to_stdio(&img, f, 0, buf, 0, NULL) && fflush(f) == 0;
  free(buf);
  if (!ok) {
    fb_errf(err, errlen, "%s: %s", path, img.message[0] ? img.message : "cannot write the PNG");
    png_image_free(&img);
    return FB_EIO;
  }
  return 0;
}

int fb_png_is_name(const char *file) {
  size_t n = strlen(file);
  return n > 4 && !strcasecmp(file + n - 4, ".png");
}
