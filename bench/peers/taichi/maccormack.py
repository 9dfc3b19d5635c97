"""MacCormack advection in 3-D (bench/large/maccormack.fbk and
maccormack_channels.fbk): a dye advected through a velocity field in a tube;
a step is 2 frames (q0 -> q1, q1 -> q0), a sync after each. Trees root ->
pointer(res/128) -> pointer(4) -> dense(32).

channels=False: one vector field per buffer, all three dye channels advected
by one launch a frame (maccormack). channels=True: three scalar fields per
buffer, placed side by side in one dense block, and one launch of a scalar
kernel per channel and frame, the paper's multi-kernel form
(maccormack_channels)."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals


def make(ti, channels, res=128):
    top = res // 128
    dt = 2.0 / res

    def tree(f):
        ti.root.pointer(ti.ijk, top).pointer(ti.ijk, 4).dense(ti.ijk, 32).place(*f)

    v = ti.Vector.field(3, dtype=ti.f32)
    p = ti.field(ti.f32)
    tree([v, p])
    if channels:
        q0, q1, qt = ([ti.field(ti.f32) for _ in range(3)] for _ in range(3))
        for q in (q0, q1, qt):
            tree(q)
    else:
        q0, q1, qt = (ti.Vector.field(3, dtype=ti.f32) for _ in range(3))
        for q in (q0, q1, qt):
            tree([q])

    @ti.func
    def at(F: ti.template(), i, j, k):
        return F[min(max(i, 0), res - 1), min(max(j, 0), res - 1), min(max(k, 0), res - 1)]

    @ti.func
    def lerp(a, b, t):
        return a + (b - a) * t

    @ti.func
    def sample(F: ti.template(), g):
        u = g - 0.5
        b = ti.floor(u)
        f = u - b
        i, j, k = int(b[0]), int(b[1]), int(b[2])
        c00 = lerp(at(F, i, j, k), at(F, i + 1, j, k), f[0])
        c10 = lerp(at(F, i, j + 1, k), at(F, i + 1, j + 1, k), f[0])
        c01 = lerp(at(F, i, j, k + 1), at(F, i + 1, j, k + 1), f[0])
        c11 = lerp(at(F, i, j + 1, k + 1), at(F, i + 1, j + 1, k + 1), f[0])
        return lerp(lerp(c00, c10, f[1]), lerp(c01, c11, f[1]), f[2])

    @ti.func
    def backtrace(g, dt):
        s = dt * res
        v1 = sample(v, g)
        v2 = sample(v, g - 0.5 * s * v1)
        v3 = sample(v, g - 0.75 * s * v2)
        return g - s * (2.0 / 9.0 * v1 + 1.0 / 3.0 * v2 + 4.0 / 9.0 * v3)

    @ti.func
    def set_dye(i, j, k, q):
        if ti.static(channels):
            for c in ti.static(range(3)):
                q0[c][i, j, k] = q[c]
        else:
            q0[i, j, k] = q

    @ti.kernel
    def init():
        for i in range(res):
            for j in range(res):
                for k in range(res):
                    x = (ti.Vector([float(i), float(j), float(k)]) + 0.5) / res - 0.5
                    r = ti.sqrt(x[0] * x[0] + x[1] * x[1])
                    if 0.32 < r and r < 0.45 and abs(x[2]) < 0.45:
                        v[i, j, k] = ti.Vector([-x[1], x[0], 0.0])
                        set_dye(i, j, k, 0.5 + 0.5 * ti.sin(8.0 * 3.14159265 * x))

    @ti.kernel
    def advect(qin: ti.template(), qout: ti.template(), qtmp: ti.template(), dt: ti.f32):
        for i, j, k in qin:
            g = ti.Vector([float(i), float(j), float(k)]) + 0.5
            qout[i, j, k] = sample(qin, backtrace(g, dt))
        for i, j, k in qin:
            g = ti.Vector([float(i), float(j), float(k)]) + 0.5
            qtmp[i, j, k] = sample(qout, backtrace(g, -dt))
        for i, j, k in qin:
            g = ti.Vector([float(i), float(j), float(k)]) + 0.5
            b = ti.floor(backtrace(g, dt) - 0.5)
            bi, bj, bk = int(b[0]), int(b[1]), int(b[2])
            lo = at(qin, bi, bj, bk)
            hi = lo
            sl = qout[i, j, k]
            mc = sl + 0.5 * (qin[i, j, k] - qtmp[i, j, k])
            r = mc
            if ti.static(channels):
                for d in ti.static(range(1, 8)):
                    c = at(qin, bi + d % 2, bj + (d // 2) % 2, bk + d // 4)
                    lo = min(lo, c)
                    hi = max(hi, c)
                if mc < lo or mc > hi:
                    r = sl
            else:
                for d in ti.static(range(1, 8)):
                    c = at(qin, bi + d % 2, bj + (d // 2) % 2, bk + d // 4)
                    for e in ti.static(range(3)):
                        lo[e] = min(lo[e], c[e])
                        hi[e] = max(hi[e], c[e])
                for c in ti.static(range(3)):
                    if mc[c] < lo[c] or mc[c] > hi[c]:
                        r[c] = sl[c]
            qout[i, j, k] = r

    def step():
        for a, b in ((q0, q1), (q1, q0)):
            if channels:
                for c in range(3):
                    advect(a[c], b[c], qt[c], dt)
            else:
                advect(a, b, qt, dt)
            ti.sync()

    fields = {"q0a": q0[0], "q0b": q0[1], "q0c": q0[2]} if channels else {"q0": q0}
    return {"setup": init, "step": step, "rtol": 1e-3, "fields": fields}
