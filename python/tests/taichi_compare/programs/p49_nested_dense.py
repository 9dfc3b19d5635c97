"""Hierarchical dense layouts: ti.root.dense(ti.i, 4).dense(ti.j, 3) and ti.ijk blocks."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.i32)
y = ti.field(ti.f32)
ti.root.dense(ti.i, 4).dense(ti.j, 3).place(x)
ti.root.dense(ti.ijk, (2, 2, 2)).dense(ti.ijk, 2).place(y)


@ti.kernel
def fill():
    for i, j in x:
        x[i, j] = i * 3 + j
    for i, j, k in y:
        y[i, j, k] = i * 16 + j * 4 + k


def run():
    fill()
    return {"x": x.to_numpy(), "y": y.to_numpy(), "xs": x.shape, "ys": y.shape}
