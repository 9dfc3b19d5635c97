"""``ti.tools`` of the fusebox Taichi front end: :func:`imwrite` writes a
PNG with :mod:`fusebox.picture` (no Pillow, no matplotlib), :func:`imread`
reads the 8-bit PNGs it (or most tools) writes back, :func:`imresize`
resizes nearest-neighbour, and :func:`imshow` writes the picture as a
frame of the headless GUI would.

Images are in Taichi's orientation: ``img[i, j]`` is the pixel ``i`` from
the left and ``j`` from the bottom, shape ``(width, height[, C])``.

This module needs only NumPy and :mod:`fusebox.picture`.
"""
from __future__ import annotations

import os
import struct
import zlib
from typing import Any, Optional

import numpy as np

from fusebox import picture

__all__ = ["imwrite", "imread", "imresize", "imshow"]


def _as_numpy(img: Any) -> np.ndarray:
    return img.to_numpy() if hasattr(img, "to_numpy") else np.asarray(img)


def _to_bytes(img: Any, who: str) -> np.ndarray:
    """Pixels as uint8 with Taichi's arithmetic: floats clipped to 0..1 and
    scaled by 255 (truncated); wider unsigned integers scaled down."""
    a = _as_numpy(img)
    if a.dtype in (np.uint16, np.uint32, np.uint64):
        a = (a // (np.iinfo(a.dtype).max // 256)).astype(np.uint8)
    elif a.dtype in (np.float16, np.float32, np.float64):
        a = (np.clip(np.nan_to_num(a.astype(np.float64), nan=0.0), 0.0, 1.0) * 255.0)
        a = a.astype(np.uint8)
    elif a.dtype != np.uint8:
        raise ValueError(f"{who}: images of {a.dtype} are not written (as in Taichi): give "
                         f"floats in 0..1 or unsigned integers (e.g. .astype(np.uint8))")
    if a.ndim == 3 and a.shape[2] not in (1, 3, 4) or a.ndim not in (2, 3):
        raise ValueError(f"{who}: the image has shape {a.shape}; expected (width, height) for "
                         f"gray or (width, height, C) with C = 1, 3 (RGB) or 4 (RGBA)")
    return a


def imwrite(img: Any, filename: Any) -> None:
    """Write ``img`` (a NumPy array or a field: ``(width, height)`` gray,
    or with 1, 3 or 4 channels) to ``filename`` as a PNG."""
    who = "ti.tools.imwrite"
    path = os.fspath(filename)
    if not path.lower().endswith(".png"):
        raise ValueError(f"{who}: fusebox writes PNG only; name the file '...png', not {path!r}")
    picture.write_png(path, _to_bytes(img, who), orientation="taichi")


def imresize(img: Any, w: int, h: Optional[int] = None) -> np.ndarray:
    """``img`` (width, height, ...) resized to (w, h) (h defaults to w),
    each new pixel taking the nearest one to its left-bottom."""
    a = _as_numpy(img)
    if h is None:
        h = w
    if (w, h) == a.shape[:2]:
        return a
    if not (isinstance(w, int) and isinstance(h, int) and w >= 1 and h >= 1):
        raise ValueError(f"ti.tools.imresize: the new size must be whole numbers >= 1, got "
                         f"{w!r} x {h!r}")
    xi = np.minimum((np.arange(w) * a.shape[0]) // w, a.shape[0] - 1)
    yi = np.minimum((np.arange(h) * a.shape[1]) // h, a.shape[1] - 1)
    return a[np.ix_(xi, yi)]


def _unfilter(raw: bytes, w: int, h: int, bpp: int, who: str) -> np.ndarray:
    stride = w * bpp
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int64)
    pos = 0
    for y in range(h):
        ft = raw[pos]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=pos + 1).astype(np.int64)
        pos += stride + 1
        if ft == 0:
            cur = line
        elif ft == 2:
            cur = (line + prev) & 255
        elif ft in (1, 3, 4):  # these depend on the bytes just made: byte by byte
            cur = np.zeros(stride, dtype=np.int64)
            for i in range(stride):
                left = int(cur[i - bpp]) if i >= bpp else 0
                up = int(prev[i])
                if ft == 1:
                    pred = left
                elif ft == 3:
                    pred = (left + up) >> 1
                else:
                    ul = int(prev[i - bpp]) if i >= bpp else 0
                    p = left + up - ul
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                    pred = left if pa <= pb and pa <= pc else up if pb <= pc else ul
                cur[i] = (int(line[i]) + pred) & 255
        else:
            raise ValueError(f"{who}: the PNG is damaged (filter type {ft} on row {y})")
        out[y] = cur
        prev = cur
    return out


def imread(filename: Any, channels: int = 0) -> np.ndarray:
    """Read an 8-bit, non-interlaced PNG (gray, gray+alpha, RGB or RGBA) as
    uint8 ``(width, height, C)`` in Taichi's orientation; ``channels`` (1,
    3 or 4) converts, 0 keeps the file's own count."""
    who = "ti.tools.imread"
    path = os.fspath(filename)
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{who}: {path} is not a PNG file (fusebox reads PNG only)")
    pos, idat, head = 8, [], None
    while pos + 8 <= len(data):
        n, tag = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if tag == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
    if head is None:
        raise ValueError(f"{who}: {path} has no IHDR chunk")
    w, h, depth, ctype, _, _, interlace = head
    per = {0: 1, 4: 2, 2: 3, 6: 4}
    if depth != 8 or ctype not in per or interlace:
        raise ValueError(f"{who}: {path} is a PNG fusebox cannot read (bit depth {depth}, "
                         f"colour type {ctype}, interlace {interlace}); 8-bit gray, gray+alpha, "
                         f"RGB or RGBA without interlacing are read")
    c = per[ctype]
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as e:
        raise ValueError(f"{who}: {path}: the image data is damaged ({e})") from None
    if len(raw) != h * (1 + w * c):
        raise ValueError(f"{who}: {path}: the image data has {len(raw)} bytes, not "
                         f"{h * (1 + w * c)}")
    px = _unfilter(raw, w, h, c, who).reshape(h, w, c)
    if c == 2:
        px = px[..., :1]  # gray and alpha: alpha dropped
        c = 1
    if channels not in (0, c):
        if channels == 1:
            px = np.round(px[..., :3].astype(np.float64).mean(axis=2, keepdims=True)) \
                .astype(np.uint8) if c >= 3 else px
        elif channels in (3, 4):
            rgb = np.repeat(px, 3, axis=2) if c == 1 else px[..., :3]
            px = rgb if channels == 3 else np.concatenate(
                [rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2)
        else:
            raise ValueError(f"{who}: channels must be 0, 1, 3 or 4, got {channels!r}")
    return np.ascontiguousarray(px.transpose(1, 0, 2)[:, ::-1])  # rows top-down -> (x, y up)


def imshow(img: Any, title: str = "imshow") -> None:
    """Headless: writes the picture to $FUSEBOX_GUI_DIR/<title>.png when
    that is set, and otherwise does nothing."""
    d = os.environ.get("FUSEBOX_GUI_DIR")
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    stem = "".join(ch if ch.isalnum() or ch in "_.-" else "_" for ch in title) or "imshow"
    imwrite(img, os.path.join(d, stem + ".png"))
