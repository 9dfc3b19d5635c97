"""A particle-to-grid scatter with quadratic B-spline weights (MLS-MPM's P2G), float atomics."""
import numpy as np
import taichi as ti

ti.init(arch=ti.cpu)

RTOL = 1e-4
ATOL = 1e-5

n_particles = 256
n_grid = 16
dx = 1 / n_grid
inv_dx = float(n_grid)
x = ti.Vector.field(2, ti.f32, shape=n_particles)
v = ti.Vector.field(2, ti.f32, shape=n_particles)
grid_v = ti.Vector.field(2, ti.f32, shape=(n_grid, n_grid))
grid_m = ti.field(ti.f32, shape=(n_grid, n_grid))


@ti.kernel
def p2g():
    for p in x:
        base = (x[p] * inv_dx - 0.5).cast(int)
        fx = x[p] * inv_dx - base.cast(float)
        w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
        for i, j in ti.static(ti.ndrange(3, 3)):
            offset = ti.Vector([i, j])
            weight = w[i][0] * w[j][1]
            grid_v[base + offset] += weight * v[p]
            grid_m[base + offset] += weight


def run():
    rng = np.random.default_rng(7)
    x.from_numpy((rng.random((n_particles, 2)) * 0.6 + 0.2).astype(np.float32))
    v.from_numpy((rng.random((n_particles, 2)) - 0.5).astype(np.float32))
    p2g()
    return {"grid_v": grid_v.to_numpy(), "grid_m": grid_m.to_numpy()}
