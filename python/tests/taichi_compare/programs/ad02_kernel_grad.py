"""kernel.grad(): the adjoint kernel, seeded by y.grad."""
import taichi as ti

ti.init(arch=ti.cpu)

NEEDS_AD = True
RTOL = 1e-5

n = 10
x = ti.field(ti.f32, shape=n, needs_grad=True)
y = ti.field(ti.f32, shape=n, needs_grad=True)


@ti.kernel
def f():
    for i in x:
        y[i] = ti.exp(0.3 * x[i]) * x[i] + ti.cos(x[i])


def run():
    for i in range(n):
        x[i] = i * 0.2
    f()
    y.grad.fill(1.0)
    f.grad()
    return {"y": y.to_numpy(), "dx": x.grad.to_numpy()}
