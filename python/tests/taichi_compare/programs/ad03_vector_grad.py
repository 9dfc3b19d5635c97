"""Gradients through vector fields: a spring energy's gradient w.r.t. positions."""
import taichi as ti

ti.init(arch=ti.cpu)

NEEDS_AD = True
RTOL = 1e-4
ATOL = 1e-5

n = 6
pos = ti.Vector.field(2, ti.f32, shape=n, needs_grad=True)
energy = ti.field(ti.f32, shape=(), needs_grad=True)


@ti.kernel
def springs():
    for i in range(n - 1):
        d = pos[i + 1] - pos[i]
        energy[None] += 0.5 * (d.norm() - 1.0) ** 2


def run():
    for i in range(n):
        pos[i] = [i * 1.1, 0.2 * (i % 2)]
    with ti.ad.Tape(loss=energy):
        springs()
    return {"energy": energy.to_numpy(), "grad": pos.grad.to_numpy()}
