"""ti.random(ti.i32) and ti.random(ti.f64): statistics only (the streams differ by engine)."""
import numpy as np
import taichi as ti

ti.init(arch=ti.cpu, random_seed=3)

RTOL = 0.0
ATOL = 0.01

n = 100000
k = ti.field(ti.i32, shape=n)
d = ti.field(ti.f64, shape=n)


@ti.kernel
def draw():
    for i in k:
        k[i] = ti.abs(ti.random(ti.i32)) % 8
        d[i] = ti.random(ti.f64) * 2.0 - 1.0


def run():
    draw()
    kk = k.to_numpy()
    dd = d.to_numpy()
    return {"freq": np.bincount(kk, minlength=8) / n, "dmean": dd.mean(),
            "dabs": np.abs(dd).mean(), "dbound": np.all(np.abs(dd) <= 1.0)}
