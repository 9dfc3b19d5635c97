"""mpm_splitted (bench/micro/mpm_splitted.fbk): Taichi's mpm99 with its
substep split into ten top-level loops; 59 substeps per step at q = 3.
The initial positions come from each engine's own random(), so results
agree statistically: bench_peers.py compares sums (1e-2 relative), not the
extremes, which depend on where each particle happens to start."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
Q = 3
SUBSTEPS = 59


def make(ti):
    n_particles = 9000 * Q * Q
    n_grid = 128 * Q
    dx = 1.0 / n_grid
    inv_dx = float(n_grid)
    dt = 1e-4 / Q
    p_vol = (dx * 0.5) ** 2
    p_mass = p_vol * 1.0
    E, nu = 1000.0, 0.2
    mu_0, lambda_0 = E / (2 * (1 + nu)), E * nu / ((1 + nu) * (1 - 2 * nu))
    x = ti.Vector.field(2, dtype=ti.f32, shape=n_particles)
    v = ti.Vector.field(2, dtype=ti.f32, shape=n_particles)
    C = ti.Matrix.field(2, 2, dtype=ti.f32, shape=n_particles)
    F = ti.Matrix.field(2, 2, dtype=ti.f32, shape=n_particles)
    material = ti.field(ti.i32, shape=n_particles)
    Jp = ti.field(ti.f32, shape=n_particles)
    grid_v = ti.Vector.field(2, dtype=ti.f32, shape=(n_grid, n_grid))
    grid_m = ti.field(ti.f32, shape=(n_grid, n_grid))

    @ti.kernel
    def initialize():
        for i in range(n_particles):
            group = i // (n_particles // 3)
            x[i] = [ti.random() * 0.2 + 0.3 + 0.10 * group, ti.random() * 0.2 + 0.05 + 0.32 * group]
            material[i] = group
            v[i] = ti.Matrix([0, 0])
            F[i] = ti.Matrix([[1, 0], [0, 1]])
            Jp[i] = 1

    @ti.kernel
    def substep():
        for i, j in grid_m:
            grid_v[i, j] = [0, 0]
            grid_m[i, j] = 0
        for p in x:
            F[p] = (ti.Matrix.identity(ti.f32, 2) + dt * C[p]) @ F[p]
        for p in x:
            base = (x[p] * inv_dx - 0.5).cast(int)
            fx = x[p] * inv_dx - base.cast(float)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
            h = ti.exp(10 * (1.0 - Jp[p]))
            if material[p] == 1:
                h = 0.3
            mu, la = mu_0 * h, lambda_0 * h
            if material[p] == 0:
                mu = 0.0
            U, sig, V = ti.svd(F[p])
            J = 1.0
            for d in ti.static(range(2)):
                new_sig = sig[d, d]
                if material[p] == 2:
                    new_sig = min(max(sig[d, d], 1 - 2.5e-2), 1 + 4.5e-3)
                Jp[p] *= sig[d, d] / new_sig
                sig[d, d] = new_sig
                J *= new_sig
            if material[p] == 0:
                F[p] = ti.Matrix.identity(ti.f32, 2) * ti.sqrt(J)
            elif material[p] == 2:
                F[p] = U @ sig @ V.transpose()
            stress = 2 * mu * (F[p] - U @ V.transpose()) @ F[p].transpose() + \
                ti.Matrix.identity(ti.f32, 2) * la * J * (J - 1)
            stress = (-dt * p_vol * 4 * inv_dx * inv_dx) * stress
            affine = stress + p_mass * C[p]
            for i, j in ti.static(ti.ndrange(3, 3)):
                offset = ti.Vector([i, j])
                dpos = (offset.cast(float) - fx) * dx
                weight = w[i][0] * w[j][1]
                grid_v[base + offset] += weight * (p_mass * v[p] + affine @ dpos)
                grid_m[base + offset] += weight * p_mass
        for i, j in grid_m:
            if grid_m[i, j] > 0:
                gv = (1 / grid_m[i, j]) * grid_v[i, j]
                gv[1] -= dt * 50
                grid_v[i, j] = gv
        for i, j in grid_m:
            if grid_m[i, j] > 0:
                if i < 3 and grid_v[i, j][0] < 0:
                    grid_v[i, j][0] = 0
        for i, j in grid_m:
            if grid_m[i, j] > 0:
                if i > n_grid - 3 and grid_v[i, j][0] > 0:
                    grid_v[i, j][0] = 0
        for i, j in grid_m:
            if grid_m[i, j] > 0:
                if j < 3 and grid_v[i, j][1] < 0:
                    grid_v[i, j][1] = 0
        for i, j in grid_m:
            if grid_m[i, j] > 0:
                if j > n_grid - 3 and grid_v[i, j][1] > 0:
                    grid_v[i, j][1] = 0
        for p in x:
            base = (x[p] * inv_dx - 0.5).cast(int)
            fx = x[p] * inv_dx - base.cast(float)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = ti.Vector.zero(ti.f32, 2)
            new_C = ti.Matrix.zero(ti.f32, 2, 2)
            for i, j in ti.static(ti.ndrange(3, 3)):
                dpos = ti.Vector([i, j]).cast(float) - fx
                g_v = grid_v[base + ti.Vector([i, j])]
                weight = w[i][0] * w[j][1]
                new_v += weight * g_v
                new_C += 4 * inv_dx * weight * g_v.outer_product(dpos)
            v[p], C[p] = new_v, new_C
        for p in x:
            x[p] += dt * v[p]

    def step():
        for _ in range(SUBSTEPS):
            substep()

    return {"setup": initialize, "step": step, "rtol": 1e-2, "stats": ["sum", "abs_sum"],
            "fields": {"x": x, "grid_m": grid_m, "Jp": Jp, "material": material}}
