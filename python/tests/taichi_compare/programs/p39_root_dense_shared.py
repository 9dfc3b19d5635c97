"""ti.root.dense(...).place(a, b): two fields in one block (interleaved), and chained dense."""
import taichi as ti

ti.init(arch=ti.cpu)

a = ti.field(ti.f32)
b = ti.field(ti.i32)
c = ti.field(ti.f32)
ti.root.dense(ti.ij, (4, 6)).place(a, b)
ti.root.dense(ti.i, 3).dense(ti.j, 5).place(c)


@ti.kernel
def fill():
    for i, j in a:
        a[i, j] = i * 0.5 + j
        b[i, j] = i - j
    for i, j in c:
        c[i, j] = a[i, j] * b[i, j]


def run():
    fill()
    return {"a": a.to_numpy(), "b": b.to_numpy(), "c": c.to_numpy(), "shape_c": c.shape}
