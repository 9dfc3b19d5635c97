"""real/mpm88 (bench/real/mpm88.json): Taichi's examples/simulation/mpm88.py,
8192 particles, grid 128^2, dt = 2e-4, a step is one frame of 50 substeps.
Written as the example writes it (one substep kernel of four loops); the
particles are placed by the same integer hash as the .fbk instead of
ti.random(), so that both engines start from the same state."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals


@ti.func
def hash01(n):
    h = ti.cast(n, ti.u32) * ti.u32(2654435761)
    h = h ^ (h >> 16)
    h = h * ti.u32(2246822519)
    h = h ^ (h >> 13)
    return ti.cast(h >> 8, ti.f32) / 16777216.0


def make(ti, n_particles=8192, n_grid=128, dt=2e-4):
    dx = 1 / n_grid
    p_vol = (dx * 0.5) ** 2
    p_mass = p_vol
    gravity = 9.8
    bound = 3
    E = 400

    x = ti.Vector.field(2, float, n_particles)
    v = ti.Vector.field(2, float, n_particles)
    C = ti.Matrix.field(2, 2, float, n_particles)
    J = ti.field(float, n_particles)
    grid_v = ti.Vector.field(2, float, (n_grid, n_grid))
    grid_m = ti.field(float, (n_grid, n_grid))

    @ti.kernel
    def substep():
        for i, j in grid_m:
            grid_v[i, j] = [0, 0]
            grid_m[i, j] = 0
        for p in x:
            Xp = x[p] / dx
            base = int(Xp - 0.5)
            fx = Xp - base
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
            stress = -dt * 4 * E * p_vol * (J[p] - 1) / dx ** 2
            affine = ti.Matrix([[stress, 0], [0, stress]]) + p_mass * C[p]
            for i, j in ti.static(ti.ndrange(3, 3)):
                offset = ti.Vector([i, j])
                dpos = (offset - fx) * dx
                weight = w[i].x * w[j].y
                grid_v[base + offset] += weight * (p_mass * v[p] + affine @ dpos)
                grid_m[base + offset] += weight * p_mass
        for i, j in grid_m:
            if grid_m[i, j] > 0:
                grid_v[i, j] /= grid_m[i, j]
            grid_v[i, j].y -= dt * gravity
            if i < bound and grid_v[i, j].x < 0:
                grid_v[i, j].x = 0
            if i > n_grid - bound and grid_v[i, j].x > 0:
                grid_v[i, j].x = 0
            if j < bound and grid_v[i, j].y < 0:
                grid_v[i, j].y = 0
            if j > n_grid - bound and grid_v[i, j].y > 0:
                grid_v[i, j].y = 0
        for p in x:
            Xp = x[p] / dx
            base = int(Xp - 0.5)
            fx = Xp - base
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = ti.Vector.zero(float, 2)
            new_C = ti.Matrix.zero(float, 2, 2)
            for i, j in ti.static(ti.ndrange(3, 3)):
                offset = ti.Vector([i, j])
                dpos = (offset - fx) * dx
                weight = w[i].x * w[j].y
                g_v = grid_v[base + offset]
                new_v += weight * g_v
                new_C += 4 * weight * g_v.outer_product(dpos) / dx ** 2
            v[p] = new_v
            x[p] += dt * v[p]
            J[p] *= 1 + dt * new_C.trace()
            C[p] = new_C

    @ti.kernel
    def init():
        for i in range(n_particles):
            x[i] = [hash01(2 * i) * 0.4 + 0.2, hash01(2 * i + 1) * 0.4 + 0.2]
            v[i] = [0, -1]
            J[i] = 1

    def step():
        for _ in range(50):
            substep()

    return {"setup": init, "step": step, "fields": {"x": x, "J": J}, "rtol": 1e-3}
