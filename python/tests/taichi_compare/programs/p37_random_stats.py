"""ti.random(): the statistics of uniform floats (mean, variance, range, a histogram)."""
import numpy as np
import taichi as ti

ti.init(arch=ti.cpu, random_seed=1)

RTOL = 0.0
ATOL = 0.01

n = 200000
x = ti.field(ti.f32, shape=n)


@ti.kernel
def draw():
    for i in x:
        x[i] = ti.random()


def run():
    draw()
    a = x.to_numpy().astype(np.float64)
    hist = np.histogram(a, bins=10, range=(0.0, 1.0))[0] / n
    return {"mean": a.mean(), "var": a.var(), "in_range": np.all((a >= 0) & (a < 1)),
            "hist": hist, "distinct": len(np.unique(a)) > n * 0.9}
