"""fusebox.write_png / encode_png / splat: PNGs written without matplotlib,
read back here with a small decoder of our own (zlib and struct; every
chunk's CRC checked; all five row filters, so that it also reads libpng's
files from the fusebox command line), pixel by pixel, in both
orientations."""
import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import fusebox
from conftest import EXAMPLES, FUSEBOX_CLI

CHANNELS = {0: 1, 4: 2, 2: 3, 6: 4}


def decode_png(data):
    """(pixels (rows, cols, C) uint8, colour type, chunk tags) of a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
    at, chunks = 8, []
    while at < len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        tag, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        (crc,) = struct.unpack(">I", data[at + 8 + n:at + 12 + n])
        assert zlib.crc32(tag + body) & 0xFFFFFFFF == crc, f"bad CRC in {tag}"
        chunks.append((tag, body))
        at += 12 + n
    tags = [t for t, _ in chunks]
    assert tags[0] == b"IHDR" and tags[-1] == b"IEND", tags
    w, h, depth, ctype, comp, filt, lace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, comp, filt, lace) == (8, 0, 0, 0)
    c = CHANNELS[ctype]
    raw = zlib.decompress(b"".join(b for t, b in chunks if t == b"IDAT"))
    stride = w * c
    assert len(raw) == h * (stride + 1)
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = bytearray(stride)
    for y in range(h):
        at = y * (stride + 1)
        ft, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        if ft:
            for i in range(stride):
                a = line[i - c] if i >= c else 0
                b, d = prev[i], prev[i - c] if i >= c else 0
                if ft == 1:
                    pred = a
                elif ft == 2:
                    pred = b
                elif ft == 3:
                    pred = (a + b) // 2
                else:
                    assert ft == 4, f"unknown filter {ft}"
                    p = a + b - d
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - d)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else d
                line[i] = (line[i] + pred) & 255
        out[y] = np.frombuffer(bytes(line), dtype=np.uint8)
        prev = line
    return out.reshape(h, w, c), ctype, tags


def read_png(path):
    with open(path, "rb") as f:
        return decode_png(f.read())


# ---------------------------------------------------------------- the writer

def test_gray_floats_matrix_orientation(tmp_path):
    a = np.array([[0.0, 0.25, 0.5, 0.75, 1.0],
                  [1.5, -0.5, 0.1, 0.2, 0.3],
                  [0.002, 0.998, 0.4, 0.6, 0.9]])
    out = fusebox.write_png(tmp_path / "g.png", a)
    assert out == str(tmp_path / "g.png")
    px, ctype, _ = read_png(out)
    assert ctype == 0 and px.shape == (3, 5, 1)  # 5 wide, 3 high, row 0 on top
    # clamped to [0, 1], then 255 x rounded to nearest (ti.tools.imwrite's rule)
    want = np.floor(np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8)
    assert (px[..., 0] == want).all()
    assert px[0, 2, 0] == 128 and px[1, 0, 0] == 255 and px[1, 1, 0] == 0


def test_taichi_orientation_is_i_along_x_j_upward(tmp_path):
    w, h = 5, 3
    a = np.zeros((w, h))
    a[4, 0] = 1.0   # i = 4 (right), j = 0 (bottom)
    a[0, 2] = 0.5   # left, top
    px, _, _ = decode_png(fusebox.encode_png(a, orientation="taichi"))
    assert px.shape == (h, w, 1)
    assert px[2, 4, 0] == 255 and px[0, 0, 0] == 128
    assert px.sum() == 255 + 128
    # the same picture as the transposed, flipped array in matrix orientation
    assert fusebox.encode_png(a, orientation="taichi") == fusebox.encode_png(a.T[::-1])
    # and not the matrix reading of the same array
    assert fusebox.encode_png(a, orientation="taichi") != fusebox.encode_png(a)


@pytest.mark.parametrize("c,ctype", [(1, 0), (2, 4), (3, 2), (4, 6)])
def test_uint8_channels_are_exact(c, ctype):
    rng = np.random.default_rng(c)
    a = rng.integers(0, 256, size=(7, 11, c), dtype=np.uint8)
    px, got_type, _ = decode_png(fusebox.encode_png(a))
    assert got_type == ctype and (px == a).all()
    # taichi orientation: (width, height, C)
    px, _, _ = decode_png(fusebox.encode_png(a, orientation="taichi"))
    assert px.shape == (11, 7, c)
    for i, j in [(0, 0), (6, 10), (3, 4)]:
        assert (px[11 - 1 - j, i] == a[i, j]).all()


def test_range_bool_and_integers():
    a = np.array([[-1.0, 0.0, 1.0, 3.0]])
    px, _, _ = decode_png(fusebox.encode_png(a, range=(-1, 1)))
    assert px[0, :, 0].tolist() == [0, 128, 255, 255]
    b = np.array([[True, False]])
    assert decode_png(fusebox.encode_png(b))[0][0, :, 0].tolist() == [255, 0]
    i = np.array([[0, 7, 255]], dtype=np.int32)
    assert decode_png(fusebox.encode_png(i))[0][0, :, 0].tolist() == [0, 7, 255]
    big = np.array([[0, 1000]], dtype=np.int64)
    assert decode_png(fusebox.encode_png(big, range=(0, 1000)))[0][0, :, 0].tolist() == [0, 255]


def test_large_picture_spans_several_idat_chunks():
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, size=(600, 800, 3), dtype=np.uint8)  # incompressible
    px, _, tags = decode_png(fusebox.encode_png(a))
    assert tags.count(b"IDAT") >= 2
    assert (px == a).all()


def test_bad_pictures_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"shape \(3,\); expected \(rows, cols\) for gray"):
        fusebox.encode_png(np.zeros(3))
    with pytest.raises(ValueError, match=r"shape \(2, 2, 5\).*\(width, height, C\)"):
        fusebox.encode_png(np.zeros((2, 2, 5)), orientation="taichi")
    with pytest.raises(ValueError, match=r"shape \(0, 4\)"):
        fusebox.encode_png(np.zeros((0, 4)))
    with pytest.raises(ValueError, match="orientation must be 'matrix'.*got 'xy'"):
        fusebox.encode_png(np.zeros((2, 2)), orientation="xy")
    a = np.zeros((2, 3))
    a[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN at index \(1, 2\)"):
        fusebox.encode_png(a)
    with pytest.raises(ValueError, match="int64 values from 0 to 300.*range="):
        fusebox.encode_png(np.array([[0, 300]]))
    with pytest.raises(ValueError, match="lo < hi"):
        fusebox.encode_png(np.zeros((2, 2)), range=(1, 1))
    with pytest.raises(ValueError, match="unknown colormap 'jet'"):
        fusebox.encode_png(np.zeros((2, 2)), colormap="jet")
    with pytest.raises(ValueError, match="colormap= colours an array of scalars; this one has 3"):
        fusebox.encode_png(np.zeros((2, 2, 3)), colormap="gray")
    with pytest.raises(TypeError, match="dtype <U1"):
        fusebox.encode_png(np.array([["a"]]))
    assert not os.listdir(tmp_path)
    with pytest.raises(OSError):
        fusebox.write_png(tmp_path / "no" / "such" / "dir.png", np.zeros((2, 2)))


def test_colormap_nan_and_auto_range():
    a = np.array([[4.0, 11.0, 18.0, np.nan]])
    px, ctype, _ = decode_png(fusebox.encode_png(a, colormap="viridis"))
    assert ctype == 2
    assert px[0].tolist() == [[68, 1, 84], [33, 145, 140], [253, 231, 37], [255, 0, 255]]
    px, _, _ = decode_png(fusebox.encode_png(a, colormap="gray", range=(0, 22)))
    assert px[0, :3].tolist() == [[46] * 3, [128] * 3, [209] * 3]


def test_no_matplotlib_needed(tmp_path):
    """write_png and splat work where importing matplotlib fails."""
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "import numpy as np, fusebox\n"
            "img = fusebox.splat(np.zeros((4, 4, 3)), [(0.5, 0.5)], color=0xFF0000)\n"
            f"fusebox.write_png({str(tmp_path / 'x.png')!r}, img)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    px, _, _ = read_png(tmp_path / "x.png")
    assert px[2, 2].tolist() == [255, 0, 0]


# ------------------------------------------- the same pixels as a JSON save

PROG = ("layout { dense(ij: 3, 5) { place u: f32 } }\n"
        "kernel init() { for i, j in u { u[i, j] = f32(i * 5 + j) } }\n")


@pytest.mark.parametrize("orientation", ["matrix", "taichi"])
@pytest.mark.parametrize("cmap", ["viridis", "gray"])
def test_json_save_and_write_png_agree(tmp_path, orientation, cmap):
    """`fusebox run`'s save (libpng) and write_png (ours) of the same field:
    the same pixels, in both orientations."""
    (tmp_path / "p.fbk").write_text(PROG)
    save = {"save": "u", "to": "u.png", "colormap": cmap, "range": [1, 13]}
    if orientation != "matrix":
        save["orientation"] = orientation
    (tmp_path / "s.json").write_text(json.dumps({
        "program": "p.fbk", "setup": [{"launch": "init"}], "step": [save]}))
    subprocess.run([FUSEBOX_CLI, "run", str(tmp_path / "s.json"), "--local"], check=True,
                   capture_output=True)
    theirs, _, _ = read_png(tmp_path / "u.png")
    u = np.arange(15, dtype=np.float32).reshape(3, 5)
    ours = fusebox.to_pixels(u, orientation=orientation, colormap=cmap, range=(1, 13))
    assert theirs.shape == ((5, 3, 3) if orientation == "taichi" else (3, 5, 3))
    assert (theirs == ours).all()
    assert (decode_png(fusebox.encode_png(u, orientation=orientation, colormap=cmap,
                                          range=(1, 13)))[0] == theirs).all()


def test_write_a_field(fb, tmp_path):
    with fb.session(file=f"{EXAMPLES}/heat.fbk") as s:
        s.kernels.init()
        T = s.fields.T.to_numpy()
        path = fusebox.write_png(tmp_path / "T.png", s.fields.T, colormap="viridis",
                                 orientation="taichi")
    px, _, _ = read_png(path)
    assert px.shape == (T.shape[1], T.shape[0], 3)
    hot = np.unravel_index(np.argmax(T), T.shape)  # the top of the range: viridis' yellow
    assert px[T.shape[1] - 1 - hot[1], hot[0]].tolist() == [253, 231, 37]


# ---------------------------------------------------------------- particles

def lit(img):
    """The set of (x, y-upward) pixels that are not zero in a taichi image."""
    m = img if img.ndim == 2 else img.any(axis=-1)
    return {(int(x), int(y)) for x, y in np.argwhere(m)}


def test_splat_disc_shapes():
    # (0.25, 0.75) on 10 x 10 is the centre of pixel (2, 7)
    img = fusebox.splat(np.zeros((10, 10)), [(0.25, 0.75)], radius=1, orientation="taichi")
    assert lit(img) == {(2, 7), (1, 7), (3, 7), (2, 6), (2, 8)}
    img = fusebox.splat(np.zeros((10, 10)), [(0.25, 0.75)], radius=1.5, orientation="taichi")
    assert lit(img) == {(x, y) for x in (1, 2, 3) for y in (6, 7, 8)}
    img = fusebox.splat(np.zeros((10, 10)), [(0.27, 0.71)], radius=0, orientation="taichi")
    assert lit(img) == {(2, 7)}  # the pixel under the centre always
    assert img.max() == 1.0


def test_splat_y_is_upward_in_both_orientations():
    pos = [(0.05, 0.95), (0.95, 0.05)]  # top left, bottom right
    col = [0xFF0000, 0x0000FF]
    t = fusebox.splat(np.zeros((10, 6, 3)), pos, radius=0, palette=col,
                      palette_indices=[0, 1], orientation="taichi")
    m = fusebox.splat(np.zeros((6, 10, 3)), pos, radius=0, palette=col, palette_indices=[0, 1])
    assert t[0, 5].tolist() == [1, 0, 0] and t[9, 0].tolist() == [0, 0, 1]
    assert m[0, 0].tolist() == [1, 0, 0] and m[5, 9].tolist() == [0, 0, 1]
    assert fusebox.encode_png(t, orientation="taichi") == fusebox.encode_png(m)
    # a field of 2-vectors with two indices: every cell a particle
    g = fusebox.splat(np.zeros((6, 10, 3)), np.array(pos).reshape(1, 2, 2), radius=0,
                      palette=col, palette_indices=[0, 1])
    assert (g == m).all()
    px, _, _ = decode_png(fusebox.encode_png(m))
    assert px[0, 0].tolist() == [255, 0, 0] and px[5, 9].tolist() == [0, 0, 255]
    assert px.sum() == 2 * 255


def test_splat_order_colours_and_clipping():
    img = np.zeros((8, 8, 4), dtype=np.uint8)
    c = 0.5625  # 4.5 pixels of 8: the centre of pixel 4
    pos = [(c, c), (c, c), (1.0, c), (-3.0, -3.0)]
    fusebox.splat(img, pos, radius=[1, 0, 2, 30], palette=[0x102030, "#ffffff", (1, 2, 3)],
                  palette_indices=np.array([0, 1, 2, 2]), orientation="taichi")
    assert img[4, 4].tolist() == [255, 255, 255, 255]          # the later particle on top
    assert img[3, 4].tolist() == [0x10, 0x20, 0x30, 255]        # the first one's rim
    assert img[7, 4].tolist() == [1, 2, 3, 255]                 # clipped at the right edge
    # the third's centre lies off the picture (x = 8), the fourth's disc
    # (radius 30 from (-24, -24)) stops short of pixel (0, 0)
    assert lit(img[:, :, 3]) == {(4, 4), (3, 4), (5, 4), (4, 3), (4, 5),
                                 (7, 4), (7, 3), (7, 5), (6, 4), (6, 3), (6, 5)}


def test_splat_matches_a_plain_loop(monkeypatch):
    """Many particles (several batches, overlapping, per-particle radii and
    colours) against the rule drawn one particle and one pixel at a time."""
    monkeypatch.setattr(fusebox.picture, "_BATCH_CELLS", 5000)  # 61 particles a batch
    rng = np.random.default_rng(3)
    n, w, h = 400, 61, 47
    pos = rng.uniform(-0.1, 1.1, size=(n, 2))
    rad = rng.uniform(0, 2.5, size=n)
    idx = rng.integers(0, 5, size=n)
    pal = [0x010101 * (k + 1) for k in range(5)]
    got = fusebox.splat(np.zeros((h, w, 3), dtype=np.uint8), pos, rad, palette=pal,
                        palette_indices=idx)
    want = np.zeros((h, w, 3), dtype=np.uint8)
    x, y = np.meshgrid(np.arange(w), np.arange(h), indexing="ij")  # every pixel, y upward
    for k in range(n):  # one particle at a time, in order, over the whole picture
        cx, cy = pos[k, 0] * w, pos[k, 1] * h
        on = ((x + 0.5 - cx) ** 2 + (y + 0.5 - cy) ** 2 <= rad[k] ** 2) | \
            ((x == np.floor(cx)) & (y == np.floor(cy)))
        want[h - 1 - y[on], x[on]] = idx[k] + 1
    assert 0 < (want > 0).all(axis=-1).sum() < w * h
    assert (got == want).all()


def test_bad_splats_are_named():
    img = np.zeros((4, 4, 3))
    with pytest.raises(ValueError, match=r"particle 1 is at \(nan, 0.5\); positions must be fin"):
        fusebox.splat(img, [(0.5, 0.5), (np.nan, 0.5)])
    with pytest.raises(ValueError, match=r"pos has shape \(3, 3\); expected \(N, 2\)"):
        fusebox.splat(img, np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"pos has shape \(2, 3, 3\); expected \(N, 2\)"):
        fusebox.splat(img, np.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match="radius must be a finite number of pixels >= 0"):
        fusebox.splat(img, [(0.5, 0.5)], radius=-1)
    with pytest.raises(ValueError, match=r"radius has shape \(2,\); give one radius or 3"):
        fusebox.splat(img, np.zeros((3, 2)), radius=[1, 2])
    with pytest.raises(ValueError, match="does not suit a gray image: give a gray level"):
        fusebox.splat(np.zeros((4, 4)), [(0.5, 0.5)], color=(1, 0, 0))
    with pytest.raises(ValueError, match="outside 0..1, the image's range"):
        fusebox.splat(img, [(0.5, 0.5)], color=(255, 0, 0))
    with pytest.raises(ValueError, match="palette has 1 colours"):
        fusebox.splat(img, [(0.5, 0.5)], palette=[0xFF], palette_indices=[1])
    with pytest.raises(TypeError, match="float .* or uint8, got int32"):
        fusebox.splat(np.zeros((4, 4), dtype=np.int32), [(0.5, 0.5)])
    with pytest.raises(TypeError, match="must be a NumPy array"):
        fusebox.splat([[0, 0]], [(0.5, 0.5)])
    assert not img.any()


def test_json_particles_and_splat_agree(tmp_path):
    """A JSON save with "particles" (C, libpng) and fusebox.splat of the
    same positions onto the same background: the same pixels."""
    n = 200
    (tmp_path / "p.fbk").write_text(
        f"layout {{ dense(i: {n}) {{ place x: f32[2] }} }}\n"
        "kernel init() { for i in x {\n"
        "  let a = f32(i) * 0.618034\n"
        "  let b = f32(i) * 0.414214\n"
        "  x[i] = [(a - floor(a)) * 1.2 - 0.1, b - floor(b)] } }\n")
    spec = {"size": [40, 30], "radius": 2.2, "color": "#ff8000", "background": [16, 32, 64]}
    (tmp_path / "s.json").write_text(json.dumps({
        "program": "p.fbk", "setup": [{"launch": "init"}],
        "step": [{"save": "x", "to": "x.png", "particles": spec}, {"save": "x", "to": "x.npy"}]}))
    r = subprocess.run([FUSEBOX_CLI, "run", str(tmp_path / "s.json"), "--local"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    theirs, _, _ = read_png(tmp_path / "x.png")
    pos = np.load(tmp_path / "x.npy")
    assert pos.shape == (n, 2) and pos[:, 0].min() < 0 and pos[:, 0].max() > 1
    img = np.zeros((30, 40, 3), dtype=np.uint8)
    img[...] = (16, 32, 64)
    ours = fusebox.splat(img, pos, radius=2.2, color=0xFF8000)
    assert theirs.shape == (30, 40, 3)
    assert (theirs == ours).all()
    assert (theirs == (255, 128, 0)).all(axis=-1).sum() > 100
