"""ti.ad.FwdMode: a Jacobian column by column (x.dual seeded with each unit
vector) through two kernels with a serial loop, an if and a local carried
by a loop; a 0-D parameter with the default seed; two losses at once."""
import taichi as ti

ti.init(arch=ti.cpu)

NEEDS_AD = True
RTOL = 1e-4
ATOL = 1e-5

n, m = 6, 4
x = ti.field(ti.f32, shape=n, needs_dual=True)
p = ti.field(ti.f32, shape=(), needs_dual=True)
h = ti.field(ti.f32, shape=n, needs_dual=True)
y = ti.field(ti.f32, shape=m, needs_dual=True)
s = ti.field(ti.f32, shape=(), needs_dual=True)


@ti.kernel
def hidden():
    for i in x:
        a = x[i] * p[None]
        for k in range(3):
            if a > 0.2:
                a = ti.sin(a) * 1.5
            else:
                a = a * a + 0.3
        h[i] = a


@ti.kernel
def output():
    for j in y:
        acc = 0.0
        for i in range(n):
            acc += ti.cos(0.3 * (i + j)) * h[i] * h[i]
        y[j] = ti.exp(-acc * 0.1)
    for i in h:
        s[None] += ti.sqrt(h[i] * h[i] + 1.0)


def run():
    import numpy as np
    for i in range(n):
        x[i] = i * 0.17 - 0.3
    p[None] = 1.3
    jac = np.zeros((m, n), np.float32)
    ds = np.zeros(n, np.float32)
    for c in range(n):
        seed = [0.0] * n
        seed[c] = 1.0
        s[None] = 0.0
        with ti.ad.FwdMode(loss=[y, s], param=x, seed=seed):
            hidden()
            output()
        jac[:, c] = y.dual.to_numpy()
        ds[c] = s.dual[None]
    s[None] = 0.0
    with ti.ad.FwdMode(loss=y, param=p):  # a 0-D parameter: seed [1.0]
        hidden()
        output()
    return {"y": y.to_numpy(), "jac": jac, "ds": ds, "dy_dp": y.dual.to_numpy(),
            "x_dual_after": x.dual.to_numpy(), "p_dual_after": p.dual.to_numpy()}
