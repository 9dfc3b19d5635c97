"""The headless ti.GUI stand-in (fusebox/taichi/_gui.py) and ti.tools
(fusebox/taichi/tools.py): orientation, the frames it writes and when its
loop ends, and its errors. Taichi's own pictures are compared with these in
taichi_compare/programs/p51_gui_pictures.py (test_taichi_compare)."""
import os

import numpy as np
import pytest

from fusebox.taichi import tools
from fusebox.taichi._gui import GUI


@pytest.fixture
def headless(monkeypatch, tmp_path):
    monkeypatch.delenv("FUSEBOX_GUI_FRAMES", raising=False)
    monkeypatch.setenv("FUSEBOX_GUI_DIR", str(tmp_path / "frames"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_set_image_orientation_i_along_x_j_upward(headless):
    gui = GUI("o", res=(8, 4))
    img = np.zeros((8, 4), np.float32)
    img[6, 0] = 1.0  # 7th pixel from the left, bottom row
    gui.set_image(img)
    gui.show("o.png")
    back = tools.imread("o.png")
    assert back.shape == (8, 4, 3)
    assert np.argwhere(back[..., 0] == 255).tolist() == [[6, 0]]
    # the PNG itself: rows top-down, so the bottom row is the last
    from fusebox.picture import to_pixels
    px = to_pixels(back, orientation="taichi")
    assert np.argwhere(px[..., 0] == 255).tolist() == [[3, 6]]


def test_circles_colours_and_order(headless):
    gui = GUI("c", res=32, background_color=0x102030)
    gui.circles(np.array([[0.25, 0.75], [0.75, 0.25]]), radius=3,
                color=np.array([0xFF0000, 0x00FF00]))
    gui.circles(np.array([[0.75, 0.25]]), radius=1.5, palette=[0x0000FF],
                palette_indices=[0])
    px = (gui.get_image()[..., :3] * 255).round().astype(int)
    assert px[8, 24].tolist() == [255, 0, 0]  # x = 0.25, y = 0.75 (upper left)
    assert px[24, 8].tolist() == [0, 0, 255]  # drawn last, on top
    assert px[26, 8].tolist() == [0, 255, 0]
    assert px[0, 0].tolist() == [16, 32, 48]
    assert px[16, 16].tolist() == [16, 32, 48]


def test_lines_triangles_rect_paint_where_told(headless):
    gui = GUI("l", res=(40, 20))
    gui.line((0.0, 0.5), (1.0, 0.5), radius=1, color=0xFFFFFF)
    col = gui.get_image()[20, :, 0]
    assert col[9] > 0.4 and col[10] > 0.4 and col[5] == 0 and col[15] == 0
    gui.clear()
    gui.triangle((0.0, 0.0), (1.0, 0.0), (0.0, 1.0), color=0xFFFFFF)
    im = gui.get_image()[..., 0]
    assert im[1, 1] == 1.0 and im[38, 18] == 0.0
    gui.clear(0x000000)
    gui.rect((0.25, 0.75), (0.75, 0.25), radius=1, color=0xFF0000)
    im = gui.get_image()[..., 0]
    assert im[20, 10] == 0.0 and im[10, 15] > 0 and im[30, 5] > 0


def test_frames_go_to_the_folder_and_the_loop_ends(headless, monkeypatch):
    monkeypatch.setenv("FUSEBOX_GUI_FRAMES", "3")
    gui = GUI("My sim!", res=(16, 8))
    n = 0
    while gui.running:
        gui.circles(np.array([[0.5, 0.5]]), radius=2)
        gui.show()
        n += 1
    assert n == 3 and gui.frame == 3
    files = sorted(os.listdir(headless / "frames"))
    assert files == ["My_sim-00000.png", "My_sim-00001.png", "My_sim-00002.png"]
    assert tools.imread(headless / "frames" / files[0]).shape == (16, 8, 3)
    # the window "closes": one EXIT press, then nothing
    assert gui.get_event(GUI.ESCAPE, GUI.EXIT) and gui.event.key == GUI.EXIT
    assert not gui.get_event()
    with pytest.raises(SystemExit) as e:  # a loop that ignores `running` ends here
        gui.show()
    assert e.value.code == 0


def test_without_frame_limit_it_runs_until_told(headless, monkeypatch):
    monkeypatch.delenv("FUSEBOX_GUI_DIR")
    gui = GUI("x", res=4)
    for _ in range(5):
        assert gui.running and not gui.get_event() and not list(gui.get_events())
        assert not gui.is_pressed(GUI.LMB) and gui.get_cursor_pos() == (0.5, 0.5)
        gui.show()  # discarded: no folder
    gui.running = False
    assert not gui.running
    assert os.listdir(headless) == []


def test_errors_name_the_problem(headless, monkeypatch):
    gui = GUI("e", res=(8, 4))
    with pytest.raises(ValueError, match=r"8 x 4.*must match"):
        gui.set_image(np.zeros((4, 8)))
    with pytest.raises(ValueError, match="int32.*unsigned"):
        gui.set_image(np.zeros((8, 4), np.int32))
    with pytest.raises(ValueError, match=r"pos has shape \(3,\)"):
        gui.circles(np.zeros(3))
    with pytest.raises(ValueError, match="palette_indices run from 0 to 2"):
        gui.circles(np.zeros((3, 2)), palette=[0xFF0000], palette_indices=[0, 1, 2])
    with pytest.raises(ValueError, match="0xRRGGBB"):
        gui.circle((0.5, 0.5), color=-1)
    with pytest.raises(ValueError, match="PNG only"):
        gui.show("frame.jpg")
    with pytest.raises(AttributeError, match="sub_window is not provided"):
        gui.sub_window
    monkeypatch.setenv("FUSEBOX_GUI_FRAMES", "many")
    with pytest.raises(ValueError, match="FUSEBOX_GUI_FRAMES must be a whole number"):
        GUI("e")


def test_imwrite_imread_round_trip_and_taichi_bytes(headless):
    rgb = np.random.default_rng(0).random((7, 5, 3))
    tools.imwrite(rgb, "a.png")
    back = tools.imread("a.png")
    assert back.dtype == np.uint8 and back.shape == (7, 5, 3)
    assert np.array_equal(back, (rgb * 255).astype(np.uint8))  # truncated, as Taichi's
    gray = np.arange(12, dtype=np.uint8).reshape(4, 3) * 20
    tools.imwrite(gray, "g.png")
    assert np.array_equal(tools.imread("g.png")[..., 0], gray)
    assert tools.imread("g.png", channels=3).shape == (4, 3, 3)

    class FieldLike:
        def to_numpy(self):
            return gray

    tools.imwrite(FieldLike(), "f.png")
    assert np.array_equal(tools.imread("f.png")[..., 0], gray)
    with pytest.raises(ValueError, match="int64 are not written"):
        tools.imwrite(np.zeros((2, 2), np.int64), "x.png")
    with pytest.raises(ValueError, match="not a PNG"):
        (headless / "t.png").write_bytes(b"hello")
        tools.imread("t.png")


def test_imresize_nearest():
    a = np.arange(8).reshape(4, 2)
    r = tools.imresize(a, 8, 4)
    assert r.shape == (8, 4)
    assert r[:, 0].tolist() == [0, 0, 2, 2, 4, 4, 6, 6]
    assert r[0, :].tolist() == [0, 0, 1, 1]


def _draw(gui, rng, eager):
    """A frame of every kind of drawing call; with eager, the canvas is
    read after each (so each is painted at once). The arrays passed are
    changed after each call, as a program reusing its buffers does."""
    pos = rng.random((50, 2))
    ends = rng.random((6, 2))
    tri = rng.random((3, 4, 2))
    img = rng.random((24, 16)).astype(np.float32)
    img[3, 3] = np.nan
    calls = [lambda: gui.set_image(img),
             lambda: gui.circles(pos, radius=2.5, color=rng.integers(0, 0xFFFFFF, 50)),
             lambda: gui.lines(ends[:3], ends[3:], radius=1.5, color=0x3366CC),
             lambda: gui.triangles(tri[0], tri[1], tri[2], color=0xAA2200),
             lambda: gui.rect((0.1, 0.9), (0.8, 0.2), color=0x00FF00),
             lambda: gui.arrows(pos[:4], ends[:4] - 0.5, color=0xFFFF00)]
    for c in calls:
        c()
        for a in (pos, ends, tri, img):
            a *= 0.5
        if eager:
            gui.img


def test_painting_when_read_gives_the_same_picture(headless):
    """The canvas is painted when read: the same pixels as painting each
    call at once, with the data each call was given (not what the arrays
    hold later), clear() and set_image() covering what came before."""
    eager, lazy = GUI("e", res=(24, 16)), GUI("l", res=(24, 16))
    for seed in range(3):
        before = lazy.painted, eager.painted
        _draw(eager, np.random.default_rng(seed), True)
        _draw(lazy, np.random.default_rng(seed), False)
        assert lazy.painted == before[0] and eager.painted > before[1]
        a, b = eager.get_image(), lazy.get_image()
        assert np.array_equal(a, b)
        assert a[..., :3].std() > 0.05  # something was drawn
        eager.show("e.png")
        lazy.show("l.png")
        assert np.array_equal(tools.imread("e.png"), tools.imread("l.png"))
        eager.clear(0x123456)
        lazy.clear(0x123456)
    # only fills were covered unread: the clear before each set_image, and
    # show()'s clear before each clear(0x123456)
    assert lazy.dropped == 6


def test_frames_nobody_reads_are_not_painted(headless, monkeypatch):
    """Without $FUSEBOX_GUI_DIR a frame shown without a file is discarded:
    its drawing calls are checked (errors at the call) but never painted."""
    monkeypatch.delenv("FUSEBOX_GUI_DIR")
    gui = GUI("n", res=(24, 16))
    rng = np.random.default_rng(7)
    for _ in range(3):
        _draw(gui, rng, False)
        gui.show()
    # 8 calls a frame (rect is 1 lines call, arrows 3), each covered by the
    # clear() after show(); the clears before the 1st, 2nd and 3rd frame's
    # set_image too
    assert gui.painted == 0 and gui.dropped == 3 * 8 + 3
    with pytest.raises(ValueError, match="positions must be finite"):
        gui.circles(np.array([[np.nan, 0.5]]))
    monkeypatch.setenv("FUSEBOX_GUI_DIR", str(headless / "frames"))
    gui = GUI("n", res=(24, 16))
    _draw(gui, rng, False)
    gui.show()
    assert gui.painted == 8 and os.path.exists(headless / "frames" / "n-00000.png")
