"""simple_advection (bench/micro/simple_advection.fbk): 10 x advect (three
channel loops, RK3 backtrace, bilinear sampling; then x = new_x)."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
N = 256


def make(ti):
    dx = 1.0 / N
    inv_dx = float(N)
    dt = 0.01
    x = ti.Vector.field(3, dtype=ti.f32, shape=(N, N))
    new_x = ti.Vector.field(3, dtype=ti.f32, shape=(N, N))
    v = ti.Vector.field(2, dtype=ti.f32, shape=(N, N))

    @ti.func
    def clamp_p(p):
        lo = 0.5 * dx
        hi = 1.0 - 1e-4 - dx + 0.5 * dx
        return ti.Vector([min(hi, max(p[0], lo)), min(hi, max(p[1], lo))])

    @ti.func
    def velocity(p0):
        p = clamp_p(p0) * inv_dx - 0.5
        i = int(ti.floor(p[0]))
        j = int(ti.floor(p[1]))
        f = p - ti.Vector([float(i), float(j)])
        g = 1.0 - f
        return v[i, j] * (g[0] * g[1]) + v[i + 1, j] * (f[0] * g[1]) + \
            v[i, j + 1] * (g[0] * f[1]) + v[i + 1, j + 1] * (f[0] * f[1])

    @ti.func
    def sample(X: ti.template(), c: ti.template(), p0):
        p = clamp_p(p0) * inv_dx - 0.5
        i = int(ti.floor(p[0]))
        j = int(ti.floor(p[1]))
        f = p - ti.Vector([float(i), float(j)])
        g = 1.0 - f
        return X[i, j][c] * (g[0] * g[1]) + X[i + 1, j][c] * (f[0] * g[1]) + \
            X[i, j + 1][c] * (g[0] * f[1]) + X[i + 1, j + 1][c] * (f[0] * f[1])

    @ti.func
    def backtrace(i, j):
        p = (ti.Vector([float(i), float(j)]) + 0.5) * dx
        v1 = velocity(p)
        p1 = p - 0.5 * dt * v1
        v2 = velocity(p1)
        p2 = p - 0.75 * dt * v2
        v3 = velocity(p2)
        return p - dt * (2.0 / 9.0 * v1 + 1.0 / 3.0 * v2 + 4.0 / 9.0 * v3)

    @ti.kernel
    def init():
        for i, j in v:
            v[i, j] = ti.Vector([j / N - 0.5, 0.5 - i / N])
        for i, j in x:
            p = (ti.Vector([float(i), float(j)]) + 0.5) * dx
            d = p - ti.Vector([0.5, 0.7])
            disk = 0.2
            if d.norm_sqr() < 0.15 * 0.15:
                disk = 0.8
            wave = 0.5 + 0.3 * ti.sin(6.2831853 * p[0]) * ti.cos(6.2831853 * p[1])
            ramp = 0.2 + 0.6 * p[0]
            x[i, j] = ti.Vector([disk, wave, ramp])

    @ti.kernel
    def advect():
        for i, j in x:
            new_x[i, j][0] = sample(x, 0, backtrace(i, j))
        for i, j in x:
            new_x[i, j][1] = sample(x, 1, backtrace(i, j))
        for i, j in x:
            new_x[i, j][2] = sample(x, 2, backtrace(i, j))
        for i, j in x:
            x[i, j] = new_x[i, j]

    def step():
        for _ in range(10):
            advect()

    return {"setup": init, "step": step, "fields": {"x": x, "new_x": new_x, "v": v}}
