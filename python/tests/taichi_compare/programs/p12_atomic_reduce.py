"""Augmented assignment in parallel loops is atomic: +=, -=, and ti.atomic_sub."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 1000
s = ti.field(ti.i32, shape=())
d = ti.field(ti.i32, shape=())
hist = ti.field(ti.i32, shape=7)
fsum = ti.field(ti.f32, shape=())


@ti.kernel
def reduce():
    for i in range(n):
        s[None] += i
        d[None] -= 2 * i
        ti.atomic_sub(d[None], 1)
        hist[i % 7] += 1
        fsum[None] += 0.5


def run():
    reduce()
    return {"s": s.to_numpy(), "d": d.to_numpy(), "hist": hist.to_numpy(),
            "fsum": fsum.to_numpy()}
