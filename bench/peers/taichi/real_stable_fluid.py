"""real/stable_fluid (bench/real/stable_fluid.json): Taichi's
examples/simulation/stable_fluid.py at res = 512 with its Jacobi pressure
solver (500 sweeps) and curl_strength 0; the mouse impulse is fixed (a push
upwards from (res/2, res/8), dye (1, 0.5, 0.2)). A step is two frames, as
in the .fbk; buffers swap as the example's TexPair does."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals


def make(ti, res=512, p_jacobi_iters=500):
    dt = 0.03
    f_strength = 10000.0
    dye_decay = 1 - 1 / (60 * 2)
    force_radius = res / 2.0
    _velocities = ti.Vector.field(2, float, shape=(res, res))
    _new_velocities = ti.Vector.field(2, float, shape=(res, res))
    velocity_divs = ti.field(float, shape=(res, res))
    _pressures = ti.field(float, shape=(res, res))
    _new_pressures = ti.field(float, shape=(res, res))
    _dye_buffer = ti.Vector.field(3, float, shape=(res, res))
    _new_dye_buffer = ti.Vector.field(3, float, shape=(res, res))

    class TexPair:
        def __init__(self, cur, nxt):
            self.cur, self.nxt = cur, nxt

        def swap(self):
            self.cur, self.nxt = self.nxt, self.cur

    velocities_pair = TexPair(_velocities, _new_velocities)
    pressures_pair = TexPair(_pressures, _new_pressures)
    dyes_pair = TexPair(_dye_buffer, _new_dye_buffer)

    @ti.func
    def sample(qf, u, v):
        I = ti.Vector([int(u), int(v)])
        I = ti.max(0, ti.min(res - 1, I))
        return qf[I]

    @ti.func
    def lerp(vl, vr, frac):
        return vl + frac * (vr - vl)

    @ti.func
    def bilerp(vf, p):
        u, v = p
        s, t = u - 0.5, v - 0.5
        iu, iv = ti.floor(s), ti.floor(t)
        fu, fv = s - iu, t - iv
        a = sample(vf, iu, iv)
        b = sample(vf, iu + 1, iv)
        c = sample(vf, iu, iv + 1)
        d = sample(vf, iu + 1, iv + 1)
        return lerp(lerp(a, b, fu), lerp(c, d, fu), fv)

    @ti.func
    def backtrace(vf: ti.template(), p, dt_: ti.template()):
        v1 = bilerp(vf, p)
        p1 = p - 0.5 * dt_ * v1
        v2 = bilerp(vf, p1)
        p2 = p - 0.75 * dt_ * v2
        v3 = bilerp(vf, p2)
        p -= dt_ * ((2 / 9) * v1 + (1 / 3) * v2 + (4 / 9) * v3)
        return p

    @ti.kernel
    def advect(vf: ti.template(), qf: ti.template(), new_qf: ti.template()):
        for i, j in vf:
            p = ti.Vector([i, j]) + 0.5
            p = backtrace(vf, p, dt)
            new_qf[i, j] = bilerp(qf, p) * dye_decay

    @ti.kernel
    def apply_impulse(vf: ti.template(), dyef: ti.template()):
        g_dir = -ti.Vector([0, 9.8]) * 300
        for i, j in vf:
            omx, omy = res * 0.5, res * 0.125
            mdir = ti.Vector([0.0, 1.0])
            dx, dy = (i + 0.5 - omx), (j + 0.5 - omy)
            d2 = dx * dx + dy * dy
            factor = ti.exp(-d2 / force_radius)
            dc = dyef[i, j]
            a = dc.norm()
            momentum = (mdir * f_strength * factor + g_dir * a / (1 + a)) * dt
            v = vf[i, j]
            vf[i, j] = v + momentum
            if mdir.norm() > 0.5:
                dc += ti.exp(-d2 * (4 / (res / 15) ** 2)) * ti.Vector([1.0, 0.5, 0.2])
            dyef[i, j] = dc

    @ti.kernel
    def divergence(vf: ti.template()):
        for i, j in vf:
            vl = sample(vf, i - 1, j)
            vr = sample(vf, i + 1, j)
            vb = sample(vf, i, j - 1)
            vt = sample(vf, i, j + 1)
            vc = sample(vf, i, j)
            if i == 0:
                vl.x = -vc.x
            if i == res - 1:
                vr.x = -vc.x
            if j == 0:
                vb.y = -vc.y
            if j == res - 1:
                vt.y = -vc.y
            velocity_divs[i, j] = (vr.x - vl.x + vt.y - vb.y) * 0.5

    @ti.kernel
    def pressure_jacobi(pf: ti.template(), new_pf: ti.template()):
        for i, j in pf:
            pl = sample(pf, i - 1, j)
            pr = sample(pf, i + 1, j)
            pb = sample(pf, i, j - 1)
            pt = sample(pf, i, j + 1)
            div = velocity_divs[i, j]
            new_pf[i, j] = (pl + pr + pb + pt - div) * 0.25

    @ti.kernel
    def subtract_gradient(vf: ti.template(), pf: ti.template()):
        for i, j in vf:
            pl = sample(pf, i - 1, j)
            pr = sample(pf, i + 1, j)
            pb = sample(pf, i, j - 1)
            pt = sample(pf, i, j + 1)
            vf[i, j] -= 0.5 * ti.Vector([pr - pl, pt - pb])

    def frame():
        advect(velocities_pair.cur, velocities_pair.cur, velocities_pair.nxt)
        advect(velocities_pair.cur, dyes_pair.cur, dyes_pair.nxt)
        velocities_pair.swap()
        dyes_pair.swap()
        apply_impulse(velocities_pair.cur, dyes_pair.cur)
        divergence(velocities_pair.cur)
        for _ in range(p_jacobi_iters):
            pressure_jacobi(pressures_pair.cur, pressures_pair.nxt)
            pressures_pair.swap()
        subtract_gradient(velocities_pair.cur, pressures_pair.cur)

    def step():
        frame()
        frame()

    return {"setup": lambda: None, "step": step,
            "fields": {"v0": _velocities, "p0": _pressures, "d0": _dye_buffer}, "rtol": 1e-3}
