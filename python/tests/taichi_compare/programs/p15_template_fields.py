"""ti.template() arguments: one kernel applied to different fields."""
import taichi as ti

ti.init(arch=ti.cpu)

a = ti.field(ti.f32, shape=6)
b = ti.field(ti.f32, shape=6)
c = ti.field(ti.f32, shape=6)


@ti.kernel
def axpy(alpha: ti.f32, x: ti.template(), y: ti.template(), out: ti.template()):
    for i in out:
        out[i] = alpha * x[i] + y[i]


@ti.kernel
def init(x: ti.template(), k: ti.f32):
    for i in x:
        x[i] = i * k


def run():
    init(a, 1.5)
    init(b, -2.0)
    axpy(2.0, a, b, c)
    axpy(0.5, c, a, b)
    return {"a": a.to_numpy(), "b": b.to_numpy(), "c": c.to_numpy()}
