"""Pictures without matplotlib: :func:`write_png` / :func:`encode_png` turn a
NumPy array (or a :class:`fusebox.Field`) into a PNG with nothing but zlib
and struct from the standard library, and :func:`splat` draws particles
onto an image array the way Taichi's ``gui.circles`` does.

Two orientations say how an array's indices map to the picture:

- ``"matrix"`` (the default, as the JSON sessions' ``save``, NumPy, Pillow
  and imageio): the array is ``(rows, cols[, C])``; row 0 is the top row of
  the picture, column 0 its left column.
- ``"taichi"`` (Taichi's GUI and ``ti.tools.imwrite``): the array is
  ``(width, height[, C])``; ``a[i, j]`` is the pixel ``i`` from the left and
  ``j`` from the bottom (y upward).
"""
from __future__ import annotations

import os
import struct
import zlib
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

ORIENTATIONS = ("matrix", "taichi")
COLORMAPS = ("viridis", "gray")

# matplotlib's viridis at 0, 0.1, ..., 1, linear in between: the same stops
# and arithmetic as cli/cli_png.c, so a picture made here has the pixels
# of a JSON session's `save` of the same field.
_VIRIDIS = np.array([
    (68, 1, 84), (72, 36, 117), (65, 68, 135), (53, 95, 141), (42, 120, 142), (33, 145, 140),
    (34, 168, 132), (68, 191, 112), (122, 209, 81), (189, 223, 38), (253, 231, 37)],
    dtype=np.float64)
_NAN_RGB = (255, 0, 255)  # magenta, as the JSON save draws NaN
_CHANNELS = {1: "gray", 2: "gray and alpha", 3: "RGB", 4: "RGBA"}
_PNG_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}
_IDAT_BYTES = 1 << 20  # compressed data per IDAT chunk
_BATCH_CELLS = 1 << 22  # splat: candidate pixels looked at in one go (bounds memory)


def _check_orientation(orientation: Any, who: str) -> None:
    if orientation not in ORIENTATIONS:
        raise ValueError(f"{who}: orientation must be 'matrix' (row i of the array is picture "
                         f"row i, top to bottom) or 'taichi' (a[i, j] is i along x, j upward, "
                         f"as Taichi's GUI); got {orientation!r}")


def _shape_words(orientation: str) -> str:
    return "(width, height)" if orientation == "taichi" else "(rows, cols)"


def _as_array(image: Any, who: str) -> np.ndarray:
    a = image.to_numpy() if hasattr(image, "to_numpy") else np.asarray(image)
    if a.dtype == object or not (a.dtype == np.bool_ or np.issubdtype(a.dtype, np.number)):
        raise TypeError(f"{who}: expected an array of numbers, got dtype {a.dtype}")
    if np.iscomplexobj(a):
        raise TypeError(f"{who}: complex values cannot be drawn")
    return a


def _image_shape(a: np.ndarray, orientation: str, who: str) -> int:
    """The channel count of an image array, checking its shape."""
    ok = a.ndim == 2 or (a.ndim == 3 and a.shape[2] in _CHANNELS)
    if not ok or a.shape[0] < 1 or a.shape[1] < 1:
        w = _shape_words(orientation)
        raise ValueError(f"{who}: the image has shape {a.shape}; expected {w[:-1]}) for gray or "
                         f"{w[:-1]}, C) with C = 1 (gray), 2 (gray and alpha), 3 (RGB) or "
                         f"4 (RGBA), at least 1 x 1")
    if a.shape[0] > 0x7FFFFFFF or a.shape[1] > 0x7FFFFFFF:
        raise ValueError(f"{who}: the image has shape {a.shape}; a PNG side is at most 2^31-1")
    return 1 if a.ndim == 2 else a.shape[2]


def _check_range(range: Any, who: str) -> Tuple[float, float]:
    try:
        lo, hi = (float(v) for v in range)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: range must be (lo, hi), two numbers; got {range!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"{who}: range must be (lo, hi) with lo < hi, both finite; got {range!r}")
    return lo, hi


def _first_nan(a: np.ndarray) -> Tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(np.isnan(a))[0])


def _colormapped(a: np.ndarray, range: Any, colormap: str, who: str) -> np.ndarray:
    """A 2-D array of scalars through a colour map: uint8 RGB, shape + (3,)."""
    v = a.astype(np.float64)
    if range is not None:
        lo, hi = _check_range(range, who)
    else:  # the finite minimum and maximum, as the JSON save
        fin = v[np.isfinite(v)]
        lo, hi = (float(fin.min()), float(fin.max())) if fin.size else (0.0, 0.0)
    span = hi - lo
    with np.errstate(invalid="ignore"):
        t = (v - lo) / span if span > 0 else np.zeros_like(v)
    t = np.clip(np.nan_to_num(t, nan=0.0), 0.0, 1.0)
    if colormap == "gray":
        out = np.repeat(np.floor(255.0 * t + 0.5)[..., None], 3, axis=-1)
    else:
        x = t * 10.0
        k = np.minimum(x.astype(np.int64), 9)
        f = (x - k)[..., None]
        out = np.floor(_VIRIDIS[k] + f * (_VIRIDIS[k + 1] - _VIRIDIS[k]) + 0.5)
    out = out.astype(np.uint8)
    out[np.isnan(v)] = _NAN_RGB
    return out


def _bytes_of(a: np.ndarray, range: Any, who: str) -> np.ndarray:
    """Values to uint8 without a colour map."""
    if a.dtype == np.uint8 and range is None:
        return a
    if a.dtype == np.bool_:
        return np.where(a, 255, 0).astype(np.uint8)
    if np.issubdtype(a.dtype, np.integer) and range is None:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi > 255:
            raise ValueError(f"{who}: {a.dtype} values from {lo} to {hi}: integers are drawn as "
                             f"bytes 0..255; give range=(lo, hi) to scale them, or convert")
        return a.astype(np.uint8)
    lo, hi = _check_range(range, who) if range is not None else (0.0, 1.0)
    v = a.astype(np.float64)
    if np.isnan(v).any():
        raise ValueError(f"{who}: the image has NaN at index {_first_nan(v)}; a picture needs "
                         f"numbers (colormap= draws NaN magenta)")
    t = np.clip((v - lo) / (hi - lo), 0.0, 1.0)
    return np.floor(255.0 * t + 0.5).astype(np.uint8)


def to_pixels(image: Any, *, orientation: str = "matrix", range: Optional[Sequence[float]] = None,
              colormap: Optional[str] = None) -> np.ndarray:
    """The 8-bit pixels :func:`encode_png` writes: a uint8 array ``(rows,
    cols, C)``, row 0 at the top, whatever the orientation. Arguments as
    :func:`write_png`."""
    who = "fusebox.to_pixels"
    _check_orientation(orientation, who)
    a = _as_array(image, who)
    c = _image_shape(a, orientation, who)
    if colormap is not None:
        if colormap not in COLORMAPS:
            raise ValueError(f"{who}: unknown colormap {colormap!r} (viridis or gray)")
        if c != 1:
            raise ValueError(f"{who}: colormap= colours an array of scalars; this one has "
                             f"{c} channels ({_CHANNELS[c]})")
        px = _colormapped(a.reshape(a.shape[:2]), range, colormap, who)
    else:
        px = _bytes_of(a, range, who)
        if px.ndim == 2:
            px = px[..., None]
    if orientation == "taichi":  # a[i, j]: i along x, j upward
        px = px.transpose(1, 0, 2)[::-1]
    return np.ascontiguousarray(px)


def _chunk(tag: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + tag + data
            + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))


def encode_png(image: Any, *, orientation: str = "matrix",
               range: Optional[Sequence[float]] = None, colormap: Optional[str] = None,
               level: int = 6) -> bytes:
    """The PNG file of an image, as bytes (arguments as :func:`write_png`;
    ``level``: zlib's compression level, 0 to 9)."""
    px = to_pixels(image, orientation=orientation, range=range, colormap=colormap)
    h, w, c = px.shape
    rows = np.zeros((h, 1 + w * c), dtype=np.uint8)  # each row: filter type 0 (None), bytes
    rows[:, 1:] = px.reshape(h, w * c)
    z = zlib.compress(rows.tobytes(), level)
    head = struct.pack(">IIBBBBB", w, h, 8, _PNG_COLOR_TYPE[c], 0, 0, 0)
    parts = [b"\x89PNG\r\n\x1a\n", _chunk(b"IHDR", head)]
    for i in np.arange(0, len(z), _IDAT_BYTES).tolist():
        parts.append(_chunk(b"IDAT", z[i:i + _IDAT_BYTES]))
    parts.append(_chunk(b"IEND", b""))
    return b"".join(parts)


def write_png(path: Union[str, "os.PathLike[str]"], image: Any, *, orientation: str = "matrix",
              range: Optional[Sequence[float]] = None, colormap: Optional[str] = None) -> str:
    """Write an image to ``path`` as an 8-bit PNG; returns the path.

    Args:
        image: a NumPy array or anything with ``to_numpy()`` (a
            :class:`fusebox.Field`): 2-D for gray, or with a last axis of
            1 (gray), 2 (gray and alpha), 3 (RGB) or 4 (RGBA) channels.
            uint8 values are the bytes; bool is 0 or 255; floats (and other
            integers given a ``range``) map ``range`` (default (0, 1)) onto
            0..255, clamped, rounded to nearest (as ``ti.tools.imwrite``).
            Other integers must lie in 0..255.
        orientation: ``"matrix"`` (default): ``(rows, cols[, C])``, row 0 on
            top; ``"taichi"``: ``(width, height[, C])``, ``a[i, j]`` at
            ``i`` from the left, ``j`` from the bottom.
        range: (lo, hi), the values drawn black and white (or the colour
            map's ends).
        colormap: ``"viridis"`` or ``"gray"`` for an array of scalars:
            an RGB picture over ``range`` (default: the finite minimum and
            maximum), NaN magenta: the pixels of a JSON session's ``save``.

    Raises ValueError (or TypeError) naming the problem: a shape that is
    not a picture, a bad range or orientation, NaN without a colour map,
    integers outside 0..255; OSError when the file cannot be written.
    """
    data = encode_png(image, orientation=orientation, range=range, colormap=colormap)
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _hex_rgb(v: int, who: str) -> Tuple[int, int, int]:
    if not 0 <= v <= 0xFFFFFF:
        raise ValueError(f"{who}: colour {v:#x} is not 0xRRGGBB")
    return (v >> 16) & 255, (v >> 8) & 255, v & 255


def _one_color(col: Any, c: int, is_float: bool, who: str) -> np.ndarray:
    """One colour in the image's own units (0..1 for a float image, 0..255
    for uint8), as C values."""
    scale = 255.0 if is_float else 1.0
    if isinstance(col, str):
        s = col[1:] if col.startswith("#") else col
        try:
            col = int(s, 16) if len(s) == 6 else None
        except ValueError:
            col = None
        if col is None:
            raise ValueError(f"{who}: colour strings are '#rrggbb'")
    if isinstance(col, (int, np.integer)) and not isinstance(col, (bool, np.bool_)) and c >= 3:
        rgb = [v / scale for v in _hex_rgb(int(col), who)]  # Taichi's 0xRRGGBB
        return np.array(rgb + ([1.0 if is_float else 255] if c == 4 else []), dtype=np.float64)
    v = np.atleast_1d(np.asarray(col, dtype=np.float64))
    if v.ndim != 1 or v.size not in ((c,) + ((3,) if c == 4 else ()) + ((1,) if c == 2 else ())):
        what = ("a gray level" if c == 1 else "a gray level, or (gray, alpha)" if c == 2 else
                "0xRRGGBB, '#rrggbb' or " + str(c) + " values" +
                (" (or 3: opaque)" if c == 4 else ""))
        raise ValueError(f"{who}: colour {col!r} does not suit a {_CHANNELS[c]} image: give {what}")
    top = 1.0 if is_float else 255.0
    if not np.all(np.isfinite(v)) or v.min() < 0 or v.max() > top:
        raise ValueError(f"{who}: colour {col!r} is outside 0..{top:g}, the image's range")
    if v.size < c:
        v = np.append(v, top)  # opaque
    return v if is_float else np.floor(v + 0.5)


def splat(image: np.ndarray, pos: Any, radius: Any = 1.0, color: Any = None, *,
          palette: Any = None, palette_indices: Any = None,
          orientation: str = "matrix") -> np.ndarray:
    """Draw particles as filled discs onto ``image`` (in place; returned),
    as Taichi's ``gui.circles``: no antialiasing; later particles over
    earlier ones.

    Args:
        image: a writable NumPy array, float (values 0..1) or uint8, in the
            given orientation (see :func:`write_png`): for a W x H picture
            ``(H, W[, C])`` for ``"matrix"`` (the default), ``(W, H[, C])``
            for ``"taichi"``.
        pos: N positions, shape (N, 2) (or (..., 2): a field of 2-vectors
            with several indices, every cell a particle, in row-major
            order), x from the left and y from the
            bottom, the picture being [0, 1] x [0, 1] (Taichi's GUI
            coordinates, whatever the orientation). Parts outside are
            clipped.
        radius: in pixels, one for all or one per particle. A pixel is
            painted when its centre lies within the radius of the
            particle's centre; the pixel under the centre always is.
        color: for RGB(A) images 0xRRGGBB (Taichi's convention), '#rrggbb'
            or C values in the image's units; for gray images a level
            (or (level, alpha)). Default: white (the top of the range).
        palette, palette_indices: per-particle colours, as Taichi's: the
            particle k gets ``palette[palette_indices[k]]``.

    Raises ValueError naming the problem (a position that is not finite,
    a negative radius, a colour that does not suit the image).
    """
    who = "fusebox.splat"
    _check_orientation(orientation, who)
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{who}: image must be a NumPy array to draw on, got "
                        f"{type(image).__name__}")
    c = _image_shape(image, orientation, who)
    is_float = np.issubdtype(image.dtype, np.floating)
    if not (is_float or image.dtype == np.uint8):
        raise TypeError(f"{who}: image must be float (0..1) or uint8, got {image.dtype}")
    if not image.flags.writeable:
        raise ValueError(f"{who}: image is read-only")
    p = np.asarray(pos.to_numpy() if hasattr(pos, "to_numpy") else pos, dtype=np.float64)
    if p.shape == (2,):
        p = p[None]
    elif p.ndim > 2 and p.shape[-1] == 2:  # a field of 2-vectors with several indices
        p = p.reshape(-1, 2)
    if p.ndim != 2 or p.shape[1] != 2:
        raise ValueError(f"{who}: pos has shape {p.shape}; expected (N, 2): x and y per particle")
    n = p.shape[0]
    bad = ~np.isfinite(p).all(axis=1)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{who}: particle {k} is at {tuple(float(v) for v in p[k])}; positions "
                         f"must be finite")
    r = np.broadcast_to(np.asarray(radius, dtype=np.float64), (n,)) if np.ndim(radius) == 0 \
        else np.asarray(radius, dtype=np.float64)
    if r.shape != (n,):
        raise ValueError(f"{who}: radius has shape {r.shape}; give one radius or {n} (one per "
                         f"particle)")
    if n and not (np.isfinite(r).all() and r.min() >= 0):
        raise ValueError(f"{who}: a radius must be a finite number of pixels >= 0")
    if (palette is None) != (palette_indices is None):
        raise ValueError(f"{who}: palette and palette_indices go together")
    if palette is not None:
        pal = np.array([_one_color(col, c, is_float, who) for col in palette]).reshape(-1, c)
        idx = np.asarray(palette_indices)
        if idx.shape != (n,) or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"{who}: palette_indices must be {n} integers (one per particle)")
        if n and (idx.min() < 0 or idx.max() >= len(pal)):
            raise ValueError(f"{who}: palette_indices run from {idx.min()} to {idx.max()}; the "
                             f"palette has {len(pal)} colours")
        cols = pal[idx]
    else:
        if color is None:
            color = [1.0 if is_float else 255] * c
        cols = np.broadcast_to(_one_color(color, c, is_float, who), (n, c))
    if orientation == "taichi":
        w, h = image.shape[:2]
    else:
        h, w = image.shape[:2]
    if n == 0:
        return image
    big = int(np.ceil(r.max())) + 1
    off = np.arange(-big, big + 1)
    ox, oy = (g.ravel() for g in np.meshgrid(off, off, indexing="ij"))
    step = max(1, _BATCH_CELLS // ox.size)  # particles per batch: bounded memory
    for s in range(0, n, step):
        cx, cy, rr = p[s:s + step, 0] * w, p[s:s + step, 1] * h, r[s:s + step]
        bx, by = np.floor(cx), np.floor(cy)
        x = bx[:, None] + ox[None, :]
        y = by[:, None] + oy[None, :]
        d2 = (x + 0.5 - cx[:, None]) ** 2 + (y + 0.5 - cy[:, None]) ** 2
        hit = (d2 <= (rr * rr)[:, None]) | ((ox == 0) & (oy == 0))[None, :]
        hit &= (x >= 0) & (x < w) & (y >= 0) & (y < h)
        who_k, _ = np.nonzero(hit)  # particle of each hit, in drawing order
        xs, ys = x[hit].astype(np.int64), y[hit].astype(np.int64)
        flat = xs * h + ys
        # the last particle drawn on a pixel wins, whatever NumPy does with
        # repeated indices in an assignment
        _, last = np.unique(flat[::-1], return_index=True)
        keep = len(flat) - 1 - last
        xs, ys, k = xs[keep], ys[keep], who_k[keep] + s
        if orientation == "taichi":
            ix = (xs, ys)
        else:
            ix = (h - 1 - ys, xs)
        if c == 1 and image.ndim == 2:
            image[ix] = cols[k, 0]
        else:
            image[ix] = cols[k]
    return image
