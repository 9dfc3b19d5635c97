"""ti.GUI without a window: set_image, circles (per-particle colours and radii), lines,
triangles, rect; frames written by show(file) and read back with ti.tools.imread."""
import numpy as np
import taichi as ti

ti.init(arch=ti.cpu)

ATOL = 1.01  # a pixel's byte may differ by one (rounding of the blend)
RTOL = 0.0

w, h = 96, 64
img = ti.Vector.field(3, ti.f32, shape=(w, h))


@ti.kernel
def paint():
    for i, j in img:
        img[i, j] = ti.Vector([i / w, j / h, 0.25])


def frame(gui, name):
    gui.show(name)
    return ti.tools.imread(name).astype(np.float64)


def run():
    gui = ti.GUI("pictures", res=(w, h), background_color=0x112F41, show_gui=False)
    out = {}
    paint()
    gui.set_image(img)
    out["image"] = frame(gui, "image.png")
    gui.circles(np.array([[0.5, 0.5], [0.1, 0.9], [0.33, 0.21], [0.52, 0.5]]),
                radius=np.array([3.0, 5.0, 1.5, 2.5]),
                color=np.array([0x00FF00, 0xFF0000, 0xFFFFFF, 0x0000FF]))
    gui.circle((0.8, 0.3), radius=4, color=0xABCDEF)
    gui.circles(np.array([[0.7, 0.7], [0.75, 0.75]]), radius=3, palette=[0x123456, 0xFEDCBA],
                palette_indices=np.array([1, 0]))
    out["circles"] = frame(gui, "circles.png")
    gui.line((0.1, 0.1), (0.9, 0.3), radius=2, color=0x0000FF)
    gui.lines(np.array([[0.2, 0.8], [0.5, 0.1]]), np.array([[0.7, 0.8], [0.5, 0.9]]),
              radius=1, color=0xFFFF00)
    out["lines"] = frame(gui, "lines.png")
    gui.triangles(np.array([[0.1, 0.1]]), np.array([[0.6, 0.2]]), np.array([[0.3, 0.7]]),
                  color=0xFF00FF)
    gui.rect((0.6, 0.9), (0.9, 0.6), radius=1, color=0x00FFFF)
    out["shapes"] = frame(gui, "shapes.png")
    ti.tools.imwrite(img, "imwrite.png")
    out["imwrite"] = ti.tools.imread("imwrite.png").astype(np.float64)
    out["frames"] = gui.frame
    return out
