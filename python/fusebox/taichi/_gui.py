"""A headless stand-in for Taichi's ``ti.GUI``: the same drawing calls
(``set_image``, ``circles``, ``lines``, ``triangles``, ``rect``, ...) paint
an image held in NumPy, and ``show()`` writes it as a PNG with
:mod:`fusebox.picture` instead of opening a window.

Coordinates are Taichi's: positions lie in [0, 1] x [0, 1], x to the right
and y upward; an image given to ``set_image`` is ``img[i, j]`` with ``i``
along x and ``j`` upward, shape ``(width, height[, C])``.

Where the frames go:

- ``show("name.png")`` writes that file, as Taichi's does;
- ``show()`` writes ``$FUSEBOX_GUI_DIR/<window name>-<frame>.png`` when
  ``$FUSEBOX_GUI_DIR`` names a folder, and discards the frame otherwise.

``$FUSEBOX_GUI_FRAMES=N`` ends a program's ``while gui.running:`` loop:
after the N-th ``show()``, ``running`` is False and ``get_event``/
``get_events`` report one ``GUI.EXIT`` press (what closing Taichi's window
sends); a program that draws on regardless (``for frame in range(10000):
... gui.show()``) ends with ``SystemExit(0)`` at its next ``show()``.
Without it there is no window to close: ``running`` stays True until the
program sets it False or calls ``close()``. No keyboard or mouse
events ever arrive: ``is_pressed`` is False and the cursor rests at the
centre.

This module needs only NumPy and :mod:`fusebox.picture`.
"""
from __future__ import annotations

import numbers
import os
import re
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from fusebox import picture

__all__ = ["GUI", "rgb_to_hex", "hex_to_rgb"]

_ENV_DIR = "FUSEBOX_GUI_DIR"
_ENV_FRAMES = "FUSEBOX_GUI_FRAMES"


def rgb_to_hex(c: Any) -> Any:
    """(r, g, b) in 0..1 (or an array of them, last axis 3) to 0xRRGGBB,
    as Taichi's ``ti.rgb_to_hex``."""
    a = np.asarray(c, dtype=np.float64)
    if a.shape[-1:] != (3,):
        raise ValueError(f"rgb_to_hex: expected (r, g, b) values in 0..1, got shape {a.shape}")
    b = np.clip(a * 255.0, 0, 255).astype(np.int64)
    h = (b[..., 0] << 16) | (b[..., 1] << 8) | b[..., 2]
    return int(h) if h.ndim == 0 else h


def hex_to_rgb(color: int) -> Tuple[float, float, float]:
    """0xRRGGBB to (r, g, b) in 0..1, as Taichi's ``ti.hex_to_rgb``."""
    c = int(color)
    return ((c >> 16) & 255) / 255.0, ((c >> 8) & 255) / 255.0, (c & 255) / 255.0


def _as_numpy(x: Any) -> np.ndarray:
    return x.to_numpy() if hasattr(x, "to_numpy") else np.asarray(x)


def _points(x: Any, what: str, who: str) -> np.ndarray:
    """N positions as float64 (N, 2) (a single (x, y) gives N = 1)."""
    p = np.asarray(_as_numpy(x), dtype=np.float64)
    if p.shape == (2,):
        p = p[None]
    elif p.ndim == 3 and p.shape[2] == 1:
        p = p[..., 0]
    if p.ndim != 2 or p.shape[1] != 2:
        raise ValueError(f"{who}: {what} has shape {p.shape}; expected (N, 2), x and y of "
                         f"each, in [0, 1] with y upward")
    if not np.isfinite(p).all():
        k = int(np.argmax(~np.isfinite(p).all(axis=1)))
        raise ValueError(f"{who}: {what}[{k}] is {tuple(p[k])}; positions must be finite")
    return p


def _per_item(v: Any, n: int, what: str, who: str, dtype: Any) -> np.ndarray:
    a = np.asarray(_as_numpy(v))
    if a.ndim == 0:
        return np.full(n, a, dtype=dtype)
    if a.shape != (n,):
        raise ValueError(f"{who}: {what} has shape {a.shape}; give one value or {n} (one each)")
    return a.astype(dtype)


def _colors(color: Any, n: int, who: str) -> np.ndarray:
    """0xRRGGBB (one, or one per item) as float (n, 3) in 0..1."""
    c = _per_item(color, n, "color", who, np.int64)
    if n and (c.min() < 0 or c.max() > 0xFFFFFF):
        raise ValueError(f"{who}: colours are 0xRRGGBB integers; got {int(c.min()):#x}.."
                         f"{int(c.max()):#x}")
    return np.stack([(c >> 16) & 255, (c >> 8) & 255, c & 255], axis=-1) / 255.0


class _Event:
    """An input event, as Taichi's ``GUI.Event``."""

    def __init__(self, type: Any, key: Any):
        self.type = type
        self.key = key
        self.pos = (0.5, 0.5)
        self.modifier: List[str] = []
        self.delta = (0, 0)

    def __repr__(self) -> str:
        return f"GUI.Event(type={self.type!r}, key={self.key!r})"


class _Widget:
    def __init__(self, value: Any):
        self.value = value


class GUI:
    """Taichi's ``ti.GUI`` without a window (see the module's text)."""

    Event = _Event
    SHIFT = "Shift"
    ALT = "Alt"
    CTRL = "Control"
    ESCAPE = "Escape"
    RETURN = "Return"
    TAB = "Tab"
    BACKSPACE = "BackSpace"
    SPACE = " "
    UP = "Up"
    DOWN = "Down"
    LEFT = "Left"
    RIGHT = "Right"
    CAPSLOCK = "Caps_Lock"
    LMB = "LMB"
    MMB = "MMB"
    RMB = "RMB"
    EXIT = "WMClose"
    WHEEL = "Wheel"
    MOVE = "Motion"
    MOTION = "Move"  # event types
    PRESS = "Press"
    RELEASE = "Release"

    def __init__(self, name: str = "Taichi", res: Any = 512, background_color: int = 0x0,
                 show_gui: bool = True, fullscreen: bool = False, fast_gui: bool = False):
        who = "ti.GUI"
        if isinstance(res, numbers.Number):
            res = (res, res)
        try:
            w, h = (int(v) for v in res)
        except (TypeError, ValueError):
            raise ValueError(f"{who}: res must be a size or (width, height), got {res!r}") from None
        if w < 1 or h < 1:
            raise ValueError(f"{who}: res {res!r}: width and height must be at least 1")
        self.name = str(name)
        self.res = (w, h)
        self.background_color = background_color
        self.show_gui = show_gui
        self.fast_gui = fast_gui
        self.frame = 0
        self.event: Optional[_Event] = None
        self.key_pressed: set = set()
        self.fps_limit: Optional[float] = 60
        self._img = np.zeros((w, h, 3), dtype=np.float64)  # taichi orientation, 0..1
        # drawing calls not yet painted on _img (see `img`); how many were
        # painted and how many were covered before anything read them
        self._pending: List[Any] = []
        self.painted = 0
        self.dropped = 0
        self._closed = False
        self._exit_sent = False
        self._dir = os.environ.get(_ENV_DIR) or None
        frames = os.environ.get(_ENV_FRAMES)
        self._frames: Optional[int] = None
        if frames:
            try:
                self._frames = int(frames)
            except ValueError:
                raise ValueError(f"${_ENV_FRAMES} must be a whole number of frames, got "
                                 f"{frames!r}") from None
        self.clear()

    # -- the canvas -------------------------------------------------------
    # A drawing call checks its arguments and reads its data (a field's
    # to_numpy) at once, as Taichi's does, but paints only when the canvas
    # is read: a frame written (show(file), $FUSEBOX_GUI_DIR), save_image,
    # get_image, `img`. The calls run then in the order made, on the data
    # as it was, so the picture is the same; a frame nobody reads (no
    # $FUSEBOX_GUI_DIR, show() without a file) is never painted, and clear()
    # or set_image() forgets the calls before it, which they cover. The
    # counts: `painted` (calls painted) and `dropped` (calls covered unread).
    @property
    def img(self) -> np.ndarray:
        """The canvas, float64 (width, height, 3) in 0..1, painted up to
        the last drawing call."""
        pending, self._pending = self._pending, []
        self.painted += len(pending)
        for fn, args in pending:
            fn(*args)
        return self._img

    @img.setter
    def img(self, value: Any) -> None:
        self._drop()
        self._img = value

    def _drop(self) -> None:
        self.dropped += len(self._pending)
        self._pending = []

    def _later(self, fn: Any, *args: Any) -> None:
        self._pending.append((fn, args))

    # -- the window's life ------------------------------------------------
    def __enter__(self) -> "GUI":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True

    @property
    def running(self) -> bool:
        if self._closed:
            return False
        return self._frames is None or self.frame < self._frames

    @running.setter
    def running(self, value: bool) -> None:
        self._closed = not value

    def _out_of_frames(self) -> bool:
        return self._frames is not None and self.frame >= self._frames

    # -- events: none ever arrive, save the closing one --------------------
    def get_events(self, *e_filter: Any) -> Iterator[_Event]:
        if (self._out_of_frames() or self._closed) and not self._exit_sent:
            e = _Event(GUI.PRESS, GUI.EXIT)
            if not e_filter or any(f in (e.type, e.key, (e.type, e.key)) or
                                   (isinstance(f, (list, tuple)) and tuple(f) == (e.type, e.key))
                                   for f in e_filter):
                self._exit_sent = True
                yield e

    def get_event(self, *e_filter: Any) -> bool:
        for e in self.get_events(*e_filter):
            self.event = e
            return True
        return False

    def get_key_event(self) -> _Event:
        for e in self.get_events():
            return e
        raise RuntimeError("ti.GUI.get_key_event: fusebox's GUI is headless and no key event "
                           "will ever come; check has_key_event() or use get_events()")

    def has_key_event(self) -> bool:
        return (self._out_of_frames() or self._closed) and not self._exit_sent

    def is_pressed(self, *keys: Any) -> bool:
        return False

    def get_cursor_pos(self) -> Tuple[float, float]:
        return 0.5, 0.5

    # -- widgets: they keep their value ------------------------------------
    def slider(self, text: str, minimum: float, maximum: float, step: float = 1) -> _Widget:
        return _Widget(minimum)

    def label(self, text: str) -> _Widget:
        return _Widget(0)

    def button(self, text: str, event_name: Optional[str] = None) -> str:
        return event_name or f"WidgetButton_{text}"

    # -- drawing ----------------------------------------------------------
    def clear(self, color: Optional[int] = None) -> None:
        if color is None:
            color = self.background_color
        rgb = _colors(color, 1, "ti.GUI.clear")[0]
        self._drop()  # covered by the fill
        self._later(self._fill, rgb)

    def _fill(self, v: np.ndarray) -> None:
        self._img[...] = v

    def set_image(self, img: Any) -> None:
        """An image as Taichi's: (width, height) gray, or with 2 (RG),
        3 (RGB) or 4 (RGBA; alpha ignored) channels; floats are 0..1,
        unsigned integers 0..their maximum; shape = the GUI's res."""
        who = "ti.GUI.set_image"
        a = _as_numpy(img)
        if a.dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
            v = a.astype(np.float64) / np.iinfo(a.dtype).max
        elif a.dtype in (np.float16, np.float32, np.float64):
            v = a.astype(np.float64)
        else:
            raise ValueError(f"{who}: images of {a.dtype} are not drawn (as in Taichi): give "
                             f"floats in 0..1 or unsigned integers (e.g. .astype(np.uint8))")
        if v.ndim == 2:
            v = v[..., None]
        if v.ndim != 3 or v.shape[2] not in (1, 2, 3, 4):
            raise ValueError(f"{who}: the image has shape {a.shape}; expected (width, height) "
                             f"or (width, height, C) with C = 1, 2, 3 or 4")
        if v.shape[:2] != self.res:
            raise ValueError(f"{who}: the image is {v.shape[0]} x {v.shape[1]} but the GUI's res "
                             f"is {self.res[0]} x {self.res[1]}: they must match (resize with "
                             f"ti.tools.imresize)")
        self._drop()  # covered by the image
        self._later(self._set_image, v)  # v is a copy (astype), safe to paint later

    def _set_image(self, v: np.ndarray) -> None:
        c = v.shape[2]
        if c == 1:
            rgb = np.repeat(v, 3, axis=2)
        elif c == 2:
            rgb = np.concatenate([v, np.zeros(v.shape[:2] + (1,))], axis=2)
        else:
            rgb = v[..., :3]
        self._img[...] = np.nan_to_num(rgb, nan=0.0)

    def get_image(self) -> np.ndarray:
        """The canvas: float32 (width, height, 4), RGBA in 0..1."""
        out = np.ones(self.res + (4,), dtype=np.float32)
        out[..., :3] = np.clip(self.img, 0.0, 1.0)
        return out

    def circle(self, pos: Any, color: int = 0xFFFFFF, radius: float = 1) -> None:
        self.circles(np.asarray(pos, dtype=np.float64).reshape(1, 2), radius=radius, color=color)

    def circles(self, pos: Any, radius: Any = 1, color: Any = 0xFFFFFF, palette: Any = None,
                palette_indices: Any = None) -> None:
        """Filled discs of ``radius`` pixels at positions (N, 2);
        ``color`` one 0xRRGGBB or one per particle, or ``palette`` (a list of
        0xRRGGBB) with ``palette_indices`` (one per particle)."""
        who = "ti.GUI.circles"
        p = _points(pos, "pos", who)
        n = p.shape[0]
        if palette is not None:
            if palette_indices is None:
                raise ValueError(f"{who}: palette needs palette_indices (one per particle)")
            idx = np.asarray(_as_numpy(palette_indices))
            if idx.shape != (n,) or not np.issubdtype(idx.dtype, np.integer):
                raise ValueError(f"{who}: palette_indices must be {n} integers (one per "
                                 f"particle), got shape {idx.shape} of {idx.dtype}")
            pal = _per_item(palette, len(palette), "palette", who, np.int64)
            if n and (idx.min() < 0 or idx.max() >= len(pal)):
                raise ValueError(f"{who}: palette_indices run from {idx.min()} to {idx.max()}; "
                                 f"the palette has {len(pal)} colours")
            cols = pal[idx]
        else:
            cols = _per_item(color, n, "color", who, np.int64)
        rgb = _colors(cols, n, who)
        r = _per_item(radius, n, "radius", who, np.float64)
        if n and not (np.isfinite(r).all() and r.min() >= 0):
            raise ValueError(f"{who}: a radius must be a finite number of pixels >= 0")
        # as Taichi's canvas: the centre at pos * res with pixel i centred on
        # i, coverage min(1, radius - distance) (a soft edge one pixel wide)
        self._later(self._blend_discs, p * np.array(self.res, dtype=np.float64), r, rgb, 0.0)

    def _blend_discs(self, c: np.ndarray, r: np.ndarray, rgb: np.ndarray, centre: float) -> None:
        """Blend discs (centres c in pixels, radii r) in order, later ones
        over earlier ones; a pixel's centre is at index + centre."""
        n = c.shape[0]
        if n == 0:
            return
        w, h = self.res
        big = int(np.ceil(r.max())) + 1
        off = np.arange(-big, big + 1)
        ox, oy = (a.ravel() for a in np.meshgrid(off, off, indexing="ij"))
        step = max(1, (1 << 21) // ox.size)  # particles per batch: bounded memory
        for s in range(0, n, step):
            cx, cy, rr = c[s:s + step, 0], c[s:s + step, 1], r[s:s + step]
            x = np.floor(cx)[:, None] + ox[None, :]
            y = np.floor(cy)[:, None] + oy[None, :]
            d = np.hypot(x + centre - cx[:, None], y + centre - cy[:, None])
            a = np.clip(rr[:, None] - d, 0.0, 1.0)
            hit = (a > 0) & (x >= 0) & (x < w) & (y >= 0) & (y < h)
            k = np.nonzero(hit)[0] + s
            self._blend(x[hit].astype(np.int64), y[hit].astype(np.int64), a[hit], rgb[k])

    def _blend(self, xs: np.ndarray, ys: np.ndarray, a: np.ndarray, rgb: np.ndarray) -> None:
        """img[x, y] = img * (1 - a) + rgb * a, hit by hit in the order
        given (hits on one pixel blend one after another)."""
        if xs.size == 0:
            return
        flat = xs * self.res[1] + ys
        order = np.argsort(flat, kind="stable")
        flat, a, rgb = flat[order], a[order], rgb[order]
        first = np.r_[0, np.nonzero(np.diff(flat))[0] + 1]
        starts = np.repeat(first, np.diff(np.r_[first, flat.size]))
        rank = np.arange(flat.size) - starts
        img = self._img.reshape(-1, 3)
        for k in range(int(rank.max()) + 1):
            sel = rank == k
            f, al = flat[sel], a[sel][:, None]
            img[f] = img[f] * (1.0 - al) + rgb[sel] * al

    def _paint(self, mask_fn: Any, lo: np.ndarray, hi: np.ndarray, rgb: np.ndarray) -> None:
        """Paint rgb on the pixels in the box [lo, hi] (pixel coordinates)
        whose centres pass mask_fn(x, y); the pixel nearest lo..hi's centre
        is not forced."""
        w, h = self.res
        x0, y0 = max(int(np.floor(lo[0])), 0), max(int(np.floor(lo[1])), 0)
        x1, y1 = min(int(np.ceil(hi[0])), w - 1), min(int(np.ceil(hi[1])), h - 1)
        if x0 > x1 or y0 > y1:
            return
        xs, ys = np.meshgrid(np.arange(x0, x1 + 1) + 0.5, np.arange(y0, y1 + 1) + 0.5,
                             indexing="ij")
        m = mask_fn(xs, ys)
        self._img[x0:x1 + 1, y0:y1 + 1][m] = rgb

    def lines(self, begin: Any, end: Any, radius: Any = 1, color: Any = 0xFFFFFF) -> None:
        """Segments from begin[k] to end[k] (both (N, 2)), ``radius`` pixels
        thick on each side."""
        who = "ti.GUI.lines"
        a = _points(begin, "begin", who)
        b = _points(end, "end", who)
        if a.shape != b.shape:
            raise ValueError(f"{who}: begin has {a.shape[0]} points, end {b.shape[0]}")
        n = a.shape[0]
        rgb = _colors(color, n, who)
        r = _per_item(radius, n, "radius", who, np.float64)
        if n and not (np.isfinite(r).all() and r.min() >= 0):
            raise ValueError(f"{who}: a radius must be a finite number of pixels >= 0")
        self._later(self._lines, a.copy(), b.copy(), r, rgb)

    def _lines(self, a: np.ndarray, b: np.ndarray, r: np.ndarray, rgb: np.ndarray) -> None:
        n = a.shape[0]
        scale = np.array(self.res, dtype=np.float64)
        w, h = self.res
        for k in range(n):  # as Taichi's canvas: coverage min(1, radius - distance)
            pa, pb, rk = a[k] * scale, b[k] * scale, r[k]
            lo = np.maximum(np.floor(np.minimum(pa, pb) - rk) - 1, 0).astype(np.int64)
            hi = np.minimum(np.ceil(np.maximum(pa, pb) + rk) + 1, scale - 1).astype(np.int64)
            if lo[0] > hi[0] or lo[1] > hi[1]:
                continue
            xs, ys = np.meshgrid(np.arange(lo[0], hi[0] + 1), np.arange(lo[1], hi[1] + 1),
                                 indexing="ij")
            px, py = xs + 0.5, ys + 0.5
            d = pb - pa
            dd = float(d @ d)
            t = np.zeros(px.shape) if dd == 0 else \
                np.clip(((px - pa[0]) * d[0] + (py - pa[1]) * d[1]) / dd, 0.0, 1.0)
            al = np.clip(rk - np.hypot(px - pa[0] - t * d[0], py - pa[1] - t * d[1]), 0.0, 1.0)
            m = al > 0
            self._blend(xs[m], ys[m], al[m], np.broadcast_to(rgb[k], (int(m.sum()), 3)))

    def line(self, begin: Any, end: Any, radius: float = 1, color: int = 0xFFFFFF) -> None:
        self.lines(np.asarray(begin, dtype=np.float64).reshape(1, 2),
                   np.asarray(end, dtype=np.float64).reshape(1, 2), radius=radius, color=color)

    def triangles(self, a: Any, b: Any, c: Any, color: Any = 0xFFFFFF) -> None:
        """Filled triangles with corners a[k], b[k], c[k] (each (N, 2)): a
        pixel is painted when its centre lies inside or on an edge."""
        who = "ti.GUI.triangles"
        pa, pb, pc = (_points(v, nm, who) for v, nm in ((a, "a"), (b, "b"), (c, "c")))
        if not pa.shape == pb.shape == pc.shape:
            raise ValueError(f"{who}: a, b and c must have as many points ({pa.shape[0]}, "
                             f"{pb.shape[0]}, {pc.shape[0]})")
        n = pa.shape[0]
        rgb = _colors(color, n, who)
        self._later(self._triangles, pa.copy(), pb.copy(), pc.copy(), rgb)

    def _triangles(self, pa: np.ndarray, pb: np.ndarray, pc: np.ndarray,
                   rgb: np.ndarray) -> None:
        n = pa.shape[0]
        scale = np.array(self.res, dtype=np.float64)
        for k in range(n):
            p0, p1, p2 = pa[k] * scale, pb[k] * scale, pc[k] * scale

            def inside(xs: np.ndarray, ys: np.ndarray, p0: Any = p0, p1: Any = p1,
                       p2: Any = p2) -> np.ndarray:
                def side(u: Any, v: Any) -> np.ndarray:
                    return (v[0] - u[0]) * (ys - u[1]) - (v[1] - u[1]) * (xs - u[0])
                s0, s1, s2 = side(p0, p1), side(p1, p2), side(p2, p0)
                return ((s0 >= 0) & (s1 >= 0) & (s2 >= 0)) | ((s0 <= 0) & (s1 <= 0) & (s2 <= 0))

            lo = np.minimum(np.minimum(p0, p1), p2)
            hi = np.maximum(np.maximum(p0, p1), p2)
            self._paint(inside, lo, hi, rgb[k])

    def triangle(self, a: Any, b: Any, c: Any, color: int = 0xFFFFFF) -> None:
        self.triangles(*(np.asarray(v, dtype=np.float64).reshape(1, 2) for v in (a, b, c)),
                       color=color)

    def rect(self, topleft: Sequence[float], bottomright: Sequence[float], radius: float = 1,
             color: int = 0xFFFFFF) -> None:
        x0, y0 = topleft[0], topleft[1]
        x1, y1 = bottomright[0], bottomright[1]
        corners = np.array([(x0, y0), (x1, y0), (x1, y1), (x0, y1)], dtype=np.float64)
        self.lines(corners, np.roll(corners, -1, axis=0), radius=radius, color=color)

    def arrows(self, orig: Any, direction: Any, radius: Any = 1, color: Any = 0xFFFFFF,
               tip_scale: float = 0.2, angle: float = 45, **kwargs: Any) -> None:
        who = "ti.GUI.arrows"
        o = _points(orig, "orig", who)
        d = _points(direction, "direction", who)
        tip = o + d
        th = np.radians(angle)
        back = -d * tip_scale
        rot = [np.array([[np.cos(s), -np.sin(s)], [np.sin(s), np.cos(s)]]) for s in (th, -th)]
        n = o.shape[0]
        cols = _per_item(color, n, "color", who, np.int64)
        rad = _per_item(radius, n, "radius", who, np.float64)
        self.lines(o, tip, radius=rad, color=cols)
        for m in rot:
            self.lines(tip, tip + back @ m.T, radius=rad, color=cols)

    def arrow(self, orig: Any, direction: Any, radius: float = 1, color: int = 0xFFFFFF,
              **kwargs: Any) -> None:
        self.arrows(np.asarray(orig, dtype=np.float64).reshape(1, 2),
                    np.asarray(direction, dtype=np.float64).reshape(1, 2), radius=radius,
                    color=color, **kwargs)

    def text(self, content: str, pos: Any, font_size: float = 15, color: int = 0xFFFFFF) -> None:
        """Accepted and not drawn: the stand-in has no fonts."""

    def contour(self, scalar_field: Any, normalize: bool = False) -> None:
        """A scalar field drawn gray (normalised to 0..1 when asked),
        sampled nearest to each pixel when its shape is not the res."""
        a = np.asarray(_as_numpy(scalar_field), dtype=np.float64)
        if a.ndim != 2:
            raise ValueError(f"ti.GUI.contour: expected a 2-D scalar field, got shape {a.shape}")
        if normalize:
            lo, hi = float(a.min()), float(a.max())
            a = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
        if a.shape != self.res:
            xi = np.minimum((np.arange(self.res[0]) * a.shape[0]) // self.res[0], a.shape[0] - 1)
            yi = np.minimum((np.arange(self.res[1]) * a.shape[1]) // self.res[1], a.shape[1] - 1)
            a = a[np.ix_(xi, yi)]
        self.set_image(a)

    # -- frames -----------------------------------------------------------
    def _pixels(self) -> np.ndarray:
        return (np.clip(self.img, 0.0, 1.0) * 255.0).astype(np.uint8)  # Taichi truncates

    def _frame_path(self) -> Optional[str]:
        if not self._dir:
            return None
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name).strip("_") or "gui"
        os.makedirs(self._dir, exist_ok=True)
        return os.path.join(self._dir, f"{stem}-{self.frame:05d}.png")

    def show(self, file: Optional[str] = None) -> None:
        """End a frame: write it to ``file`` (a PNG), or to $FUSEBOX_GUI_DIR
        when that is set; then count it and clear the canvas."""
        if self._out_of_frames():
            raise SystemExit(0)  # the program went on drawing after the window "closed"
        path = os.fspath(file) if file else self._frame_path()
        if path:
            if not path.lower().endswith(".png"):
                raise ValueError(f"ti.GUI.show: fusebox writes PNG only; name the file "
                                 f"'...png', not {path!r}")
            picture.write_png(path, self._pixels(), orientation="taichi")
        self.frame += 1
        self.clear()

    def save_image(self, filename: str) -> None:
        """Write the canvas as it stands (without ending the frame)."""
        picture.write_png(os.fspath(filename), self._pixels(), orientation="taichi")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"ti.GUI.{name} is not provided by fusebox's headless GUI "
                             f"stand-in (it draws set_image, circles, lines, triangles, rect, "
                             f"arrows and writes PNG frames)")
