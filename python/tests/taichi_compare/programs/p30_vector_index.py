"""Indexing a field with an integer vector (grid[base + offset]), as MPM's scatter does."""
import taichi as ti

ti.init(arch=ti.cpu)

n_grid = 8
grid = ti.field(ti.f32, shape=(n_grid, n_grid))
gv = ti.Vector.field(2, ti.f32, shape=(n_grid, n_grid))
pts = ti.Vector.field(2, ti.f32, shape=5)


@ti.kernel
def scatter():
    for p in pts:
        base = (pts[p] * n_grid - 0.5).cast(int)
        for i, j in ti.static(ti.ndrange(3, 3)):
            offset = ti.Vector([i, j])
            grid[base + offset] += 1.0 + p
            gv[base + offset] += offset * 0.5


def run():
    for p in range(5):
        pts[p] = [0.2 + 0.12 * p, 0.3 + 0.1 * p]
    scatter()
    return {"grid": grid.to_numpy(), "gv": gv.to_numpy()}
