"""ti.grouped(ti.ndrange(...)) with offsets; I used as a field index."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.f32, shape=(6, 6))


@ti.kernel
def fill():
    for I in ti.grouped(ti.ndrange((1, 5), (2, 6))):
        x[I] = I.x + I.y * 0.5


def run():
    fill()
    return {"x": x.to_numpy()}
