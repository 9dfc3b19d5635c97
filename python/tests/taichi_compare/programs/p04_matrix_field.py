"""Matrix fields: element writes, transpose, determinant, inverse."""
import taichi as ti

ti.init(arch=ti.cpu)

m = ti.Matrix.field(2, 2, dtype=ti.f32, shape=6)
t = ti.Matrix.field(2, 2, dtype=ti.f32, shape=6)
inv = ti.Matrix.field(2, 2, dtype=ti.f32, shape=6)
det = ti.field(ti.f32, shape=6)


@ti.kernel
def work():
    for i in m:
        m[i] = ti.Matrix([[i + 1.0, 0.5], [-0.25 * i, 2.0]])
        m[i][0, 1] += 0.125
        t[i] = m[i].transpose()
        det[i] = m[i].determinant()
        inv[i] = m[i].inverse()


def run():
    work()
    return {"m": m.to_numpy(), "t": t.to_numpy(), "det": det.to_numpy(), "inv": inv.to_numpy()}
