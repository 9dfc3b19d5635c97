"""Vector fields: components, whole-vector writes, to_numpy's last axis."""
import taichi as ti

ti.init(arch=ti.cpu)

v = ti.Vector.field(3, dtype=ti.f32, shape=16)
w = ti.Vector.field(2, dtype=ti.i32, shape=(4, 4))


@ti.kernel
def fill():
    for i in v:
        v[i] = ti.Vector([i, i * 2.0, -i])
        v[i][2] += 0.5
    for i, j in w:
        w[i, j] = [i + j, i * j]
        w[i, j].y -= 1


def run():
    fill()
    return {"v": v.to_numpy(), "w": w.to_numpy()}
