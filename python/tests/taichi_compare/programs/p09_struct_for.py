"""Struct-fors over 1-D, 2-D and 3-D dense fields."""
import taichi as ti

ti.init(arch=ti.cpu)

a = ti.field(ti.i32, shape=10)
b = ti.field(ti.i32, shape=(3, 5))
c = ti.field(ti.i32, shape=(2, 3, 4))


@ti.kernel
def fill():
    for i in a:
        a[i] = i * i
    for i, j in b:
        b[i, j] = a[i + j]
    for i, j, k in c:
        c[i, j, k] = b[i, j] + k


def run():
    fill()
    return {"a": a.to_numpy(), "b": b.to_numpy(), "c": c.to_numpy()}
