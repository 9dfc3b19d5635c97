"""for k in ti.static(range(n)): unrolled loops over vector components."""
import taichi as ti

ti.init(arch=ti.cpu)

dim = 3
x = ti.Vector.field(dim, ti.f32, shape=10)
s = ti.field(ti.f32, shape=10)


@ti.kernel
def fill():
    for i in x:
        for k in ti.static(range(dim)):
            x[i][k] = i * (k + 1)
        acc = 0.0
        for k in ti.static(range(dim)):
            acc += x[i][k] * x[i][k]
        s[i] = acc


def run():
    fill()
    return {"x": x.to_numpy(), "s": s.to_numpy()}
