"""A headless stand-in for Taichi's GGUI, ``ti.ui`` (``Window``, its
scene, canvas, camera and immediate-mode widgets), as ``_gui.py`` is for
``ti.GUI``: a program written for a GGUI window runs to the end with no
window and no Vulkan.

Nothing is rendered. The calls that would draw (``scene.particles``,
``canvas.scene``, ``canvas.set_image``, ...) check that they were given
something to draw and keep nothing else; ``window.save_image(path)`` writes
the last image given to ``canvas.set_image`` (or the background colour)
as a PNG. No keyboard or mouse input ever arrives: ``is_pressed`` is False,
``get_events`` yields nothing, widgets return the value they were given
(a slider stays where the program put it), buttons are never clicked and
the camera stays where the program puts it.

``$FUSEBOX_GUI_FRAMES=N`` ends a ``while window.running:`` loop after the
N-th ``show()``, as for ``ti.GUI``; a ``show()`` past that ends the program
with ``SystemExit(0)``. Without it ``running`` stays True until the program
sets it False or calls ``destroy()``.

This module needs only NumPy (the test harness also loads it by path under
real Taichi, where GGUI needs Vulkan, to run the same programs headless).
"""
from __future__ import annotations

import os
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

_ENV_FRAMES = "FUSEBOX_GUI_FRAMES"

# the event types and key names of ti.ui (Taichi's spelling)
PRESS, RELEASE = "Press", "Release"
SHIFT, ALT, CTRL, ESCAPE, RETURN, TAB = "Shift", "Alt", "Control", "Escape", "Return", "Tab"
BACKSPACE, SPACE, CAPSLOCK = "BackSpace", " ", "Caps_Lock"
UP, DOWN, LEFT, RIGHT = "Up", "Down", "Left", "Right"
LMB, MMB, RMB = "LMB", "MMB", "RMB"


def _frame_limit() -> Optional[int]:
    v = os.environ.get(_ENV_FRAMES)
    if v is None or v == "":
        return None
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"${_ENV_FRAMES}={v!r}: expected a whole number of frames") from None
    if n < 0:
        raise ValueError(f"${_ENV_FRAMES}={v!r}: expected 0 or more frames")
    return n


def _vec3(name: str, v: Sequence[Any]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    if a.shape != (3,) or not np.isfinite(a).all():
        raise ValueError(f"{name}: expected three finite numbers, got {v!r}")
    return a


def _drawable(what: str, x: Any) -> None:
    if x is None or not (hasattr(x, "to_numpy") or isinstance(x, np.ndarray)):
        raise TypeError(f"{what}: expected a field (or an array), got {type(x).__name__}")


class Event:
    def __init__(self, type: str = "", key: str = ""):  # noqa: A002
        self.type = type
        self.key = key


class Camera:
    """ti.ui.Camera: where the program puts it (no mouse moves it)."""

    def __init__(self) -> None:
        self.curr_position = np.array([0.0, 0.0, 0.0])
        self.curr_lookat = np.array([0.0, 0.0, -1.0])
        self.curr_up = np.array([0.0, 1.0, 0.0])
        self.curr_fov = 45.0

    def position(self, x: float, y: float, z: float) -> None:
        self.curr_position = _vec3("Camera.position", (x, y, z))

    def lookat(self, x: float, y: float, z: float) -> None:
        self.curr_lookat = _vec3("Camera.lookat", (x, y, z))

    def up(self, x: float, y: float, z: float) -> None:
        self.curr_up = _vec3("Camera.up", (x, y, z))

    def fov(self, fov: float) -> None:
        self.curr_fov = float(fov)

    def projection_mode(self, mode: Any) -> None:
        pass

    def z_near(self, z: float) -> None:
        pass

    def z_far(self, z: float) -> None:
        pass

    def track_user_inputs(self, window: "Window", movement_speed: float = 1.0,
                          yaw_speed: float = 2.0, pitch_speed: float = 2.0,
                          hold_key: Any = None) -> None:
        if not isinstance(window, Window):
            raise TypeError("Camera.track_user_inputs: expected the ti.ui.Window")
        # no keyboard, no mouse: the camera does not move


class Scene:
    """window.get_scene() / ti.ui.Scene(): draws nothing."""

    def __init__(self) -> None:
        self.camera: Optional[Camera] = None

    def set_camera(self, camera: Camera) -> None:
        if not isinstance(camera, Camera):
            raise TypeError(f"Scene.set_camera: expected a ti.ui.Camera, got "
                            f"{type(camera).__name__}")
        self.camera = camera

    def point_light(self, pos: Sequence[float], color: Sequence[float]) -> None:
        _vec3("Scene.point_light pos", pos)
        _vec3("Scene.point_light color", color)

    def ambient_light(self, color: Sequence[float]) -> None:
        _vec3("Scene.ambient_light color", color)

    def particles(self, centers: Any, radius: float, color: Any = (0.5, 0.5, 0.5),
                  per_vertex_color: Any = None, index_offset: int = 0,
                  index_count: Any = None) -> None:
        _drawable("Scene.particles centers", centers)

    def lines(self, vertices: Any, width: float, indices: Any = None, color: Any = None,
              per_vertex_color: Any = None, **kw: Any) -> None:
        _drawable("Scene.lines vertices", vertices)

    def mesh(self, vertices: Any, indices: Any = None, normals: Any = None, color: Any = None,
             per_vertex_color: Any = None, **kw: Any) -> None:
        _drawable("Scene.mesh vertices", vertices)

    def mesh_instance(self, vertices: Any, indices: Any = None, **kw: Any) -> None:
        _drawable("Scene.mesh_instance vertices", vertices)


class Canvas:
    """window.get_canvas(): keeps the last image and background colour."""

    def __init__(self, res: Tuple[int, int]):
        self.res = res
        self.background = (0.0, 0.0, 0.0)
        self.image: Optional[np.ndarray] = None

    def set_background_color(self, color: Sequence[float]) -> None:
        self.background = tuple(float(c) for c in _vec3("Canvas.set_background_color",
                                                        color))
        self.image = None

    def set_image(self, img: Any) -> None:
        _drawable("Canvas.set_image", img)
        a = np.asarray(img.to_numpy() if hasattr(img, "to_numpy") else img)
        self.image = a

    def scene(self, scene: Scene) -> None:
        if not isinstance(scene, Scene):
            raise TypeError(f"Canvas.scene: expected a ti.ui.Scene, got {type(scene).__name__}")

    def circles(self, centers: Any, radius: float, **kw: Any) -> None:
        _drawable("Canvas.circles centers", centers)

    def lines(self, vertices: Any, width: float, **kw: Any) -> None:
        _drawable("Canvas.lines vertices", vertices)

    def triangles(self, vertices: Any, **kw: Any) -> None:
        _drawable("Canvas.triangles vertices", vertices)


class _SubWindow:
    """gui.sub_window(...): widgets that keep the program's values."""

    def __enter__(self) -> "_SubWindow":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def text(self, text: str, color: Any = None) -> None:
        pass

    def slider_float(self, text: str, old_value: float, minimum: float, maximum: float
                     ) -> float:
        return float(old_value)

    def slider_int(self, text: str, old_value: int, minimum: int, maximum: int) -> int:
        return int(old_value)

    def checkbox(self, text: str, old_value: bool) -> bool:
        return bool(old_value)

    def button(self, text: str) -> bool:
        return False

    def color_edit_3(self, text: str, old_value: Sequence[float]) -> Tuple[float, ...]:
        return tuple(float(c) for c in old_value)

    def input_float(self, text: str, old_value: float) -> float:
        return float(old_value)

    def input_int(self, text: str, old_value: int) -> int:
        return int(old_value)


class Gui(_SubWindow):
    """window.get_gui(): the widgets, also outside a sub-window."""

    def sub_window(self, name: str, x: float, y: float, width: float, height: float
                   ) -> _SubWindow:
        return _SubWindow()

    def begin(self, name: str, x: float, y: float, width: float, height: float) -> None:
        pass

    def end(self) -> None:
        pass


class Window:
    """ti.ui.Window(name, res, ...): no window (see the module's doc)."""

    def __init__(self, name: str, res: Tuple[int, int], vsync: bool = False,
                 show_window: bool = True, fps_limit: int = 1000, pos: Any = (100, 100)):
        if len(tuple(res)) != 2 or any(int(r) < 1 for r in res):
            raise ValueError(f"ti.ui.Window: res must be (width, height), got {res!r}")
        self.name = name
        self.res = (int(res[0]), int(res[1]))
        self.frame = 0
        self.frames = _frame_limit()
        self.running = self.frames != 0
        self._canvas = Canvas(self.res)
        self._scene = Scene()
        self._gui = Gui()

    def get_scene(self) -> Scene:
        return self._scene

    def get_canvas(self) -> Canvas:
        return self._canvas

    def get_gui(self) -> Gui:
        return self._gui

    def get_window_shape(self) -> Tuple[int, int]:
        return self.res

    def show(self) -> None:
        if self.frames is not None and self.frame >= self.frames:
            raise SystemExit(0)  # drawing on past the frames asked for
        self.frame += 1
        if self.frames is not None and self.frame >= self.frames:
            self.running = False

    def destroy(self) -> None:
        self.running = False

    def is_pressed(self, *keys: str) -> bool:
        return False

    def get_event(self, tag: Any = None) -> bool:
        return False

    def get_events(self, tag: Any = None) -> Iterator[Event]:
        return iter(())

    @property
    def event(self) -> Event:
        return Event()

    def get_cursor_pos(self) -> Tuple[float, float]:
        return (0.5, 0.5)

    def get_image_buffer_as_numpy(self) -> np.ndarray:
        w, h = self.res
        if self._canvas.image is not None:
            return np.asarray(self._canvas.image, dtype=np.float32)
        out = np.empty((w, h, 4), dtype=np.float32)
        out[..., :3] = self._canvas.background
        out[..., 3] = 1.0
        return out

    def save_image(self, filename: str) -> None:
        from fusebox import picture  # the one place this module needs the package
        img = self.get_image_buffer_as_numpy()
        if img.ndim == 3 and img.shape[2] == 4:
            img = img[..., :3]
        picture.write_png(os.fspath(filename), img, orientation="taichi")  # img[x, y], y up


__all__: List[str] = ["Window", "Scene", "Camera", "Canvas", "Gui", "Event", "PRESS",
                      "RELEASE", "SHIFT", "ALT", "CTRL", "ESCAPE", "RETURN", "TAB",
                      "BACKSPACE", "SPACE", "CAPSLOCK", "UP", "DOWN", "LEFT", "RIGHT", "LMB",
                      "MMB", "RMB"]
