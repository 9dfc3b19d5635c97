"""from_numpy and to_numpy for scalar, vector and matrix fields; fill; dtypes kept."""
import numpy as np
import taichi as ti

ti.init(arch=ti.cpu)

a = ti.field(ti.f32, shape=(4, 3))
b = ti.field(ti.i32, shape=6)
v = ti.Vector.field(3, ti.f32, shape=5)
m = ti.Matrix.field(2, 2, ti.f64, shape=3)


@ti.kernel
def bump():
    for i, j in a:
        a[i, j] += i * j
    for i in b:
        b[i] *= 3
    for i in v:
        v[i] = v[i] * 2 + 1
    for i in m:
        m[i] = m[i] @ m[i]


def run():
    a.from_numpy(np.arange(12, dtype=np.float32).reshape(4, 3) * 0.5)
    b.fill(-2)
    v.from_numpy(np.linspace(0, 1, 15, dtype=np.float32).reshape(5, 3))
    m.from_numpy(np.arange(12, dtype=np.float64).reshape(3, 2, 2) / 7.0)
    bump()
    return {"a": a.to_numpy(), "b": b.to_numpy(), "v": v.to_numpy(), "m": m.to_numpy()}
