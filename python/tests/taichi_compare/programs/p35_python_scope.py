"""Python-scope access: x[i] = v, x[i, j], vector components, whole vectors, 0-D fields."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.f32, shape=5)
g = ti.field(ti.i32, shape=(3, 3))
v = ti.Vector.field(2, ti.f32, shape=4)
m = ti.Matrix.field(2, 2, ti.f32, shape=2)
s = ti.field(ti.f32, shape=())


@ti.kernel
def double():
    for i in x:
        x[i] *= 2
    for i, j in g:
        g[i, j] += 1
    s[None] += 1.0


def run():
    for i in range(5):
        x[i] = i + 0.5
    g[1, 2] = 7
    g[0, 0] = -3
    v[1] = [3.0, 4.0]
    v[2][1] = 9.0
    m[1] = [[1.0, 2.0], [3.0, 4.0]]
    m[0][1, 0] = 5.0
    s[None] = 0.25
    double()
    return {"x": x.to_numpy(), "g": g.to_numpy(), "v": v.to_numpy(), "m": m.to_numpy(),
            "x3": x[3], "g12": g[1, 2], "v1": v[1].to_numpy(), "v21": v[2][1], "s": s[None]}
