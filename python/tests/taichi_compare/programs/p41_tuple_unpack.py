"""Tuple assignment and unpacking of vectors and of ti.svd/polar results."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.i32, shape=(6, 3))


@ti.kernel
def work():
    for i in range(6):
        a, b = i, 10 - i
        a, b = b, a
        p = ti.Vector([i, 2 * i, 3 * i])
        u, v, w = p
        x[i, 0] = a
        x[i, 1] = b
        x[i, 2] = u + v - w


def run():
    work()
    return {"x": x.to_numpy()}
