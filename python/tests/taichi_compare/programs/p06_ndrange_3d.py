"""A 3-D ndrange, and ndrange with extents given by Python variables."""
import taichi as ti

ti.init(arch=ti.cpu)

n, m, k = 4, 3, 2
x = ti.field(ti.f32, shape=(n, m, k))


@ti.kernel
def fill():
    for i, j, l in ti.ndrange(n, m, k):
        x[i, j, l] = i * 1.0 + j * 0.1 + l * 0.01


def run():
    fill()
    return {"x": x.to_numpy()}
