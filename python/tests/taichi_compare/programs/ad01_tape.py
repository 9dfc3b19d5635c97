"""ti.ad.Tape: the gradient of a sum of squares and of a product."""
import taichi as ti

ti.init(arch=ti.cpu)

NEEDS_AD = True
RTOL = 1e-5

n = 8
x = ti.field(ti.f32, shape=n, needs_grad=True)
loss = ti.field(ti.f32, shape=(), needs_grad=True)


@ti.kernel
def compute():
    for i in x:
        loss[None] += x[i] ** 2 + 0.5 * x[i] * ti.sin(x[i])


def run():
    for i in range(n):
        x[i] = i * 0.3 - 1.0
    with ti.ad.Tape(loss=loss):
        compute()
    return {"loss": loss.to_numpy(), "grad": x.grad.to_numpy()}
