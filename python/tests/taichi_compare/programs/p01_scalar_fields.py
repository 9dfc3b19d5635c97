"""Scalar fields of several dtypes and shapes; kernels write by index."""
import taichi as ti

ti.init(arch=ti.cpu)

a = ti.field(ti.f32, shape=8)
b = ti.field(ti.i32, shape=(5, 7))
c = ti.field(ti.f64, shape=(3, 4, 2))


@ti.kernel
def fill_all():
    for i in a:
        a[i] = i * 0.5 - 1.0
    for i, j in b:
        b[i, j] = i * 10 - j
    for i, j, k in c:
        c[i, j, k] = i + j * 0.25 + k * 0.125


def run():
    fill_all()
    return {"a": a.to_numpy(), "b": b.to_numpy(), "c": c.to_numpy()}
