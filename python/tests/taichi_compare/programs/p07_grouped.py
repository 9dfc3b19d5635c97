"""ti.grouped over a field: I is an index vector."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.i32, shape=(5, 6))
y = ti.Vector.field(2, ti.i32, shape=(5, 6))


@ti.kernel
def fill():
    for I in ti.grouped(x):
        x[I] = I[0] * 10 + I[1]
        y[I] = I * 2


def run():
    fill()
    return {"x": x.to_numpy(), "y": y.to_numpy()}
