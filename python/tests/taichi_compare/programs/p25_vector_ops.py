"""Vector methods: dot, cross, norm, norm_sqr, normalized, outer_product, arithmetic."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 10
a = ti.Vector.field(3, ti.f32, shape=n)
b = ti.Vector.field(3, ti.f32, shape=n)
dot = ti.field(ti.f32, shape=n)
cross = ti.Vector.field(3, ti.f32, shape=n)
norm = ti.field(ti.f32, shape=n)
nsq = ti.field(ti.f32, shape=n)
unit = ti.Vector.field(3, ti.f32, shape=n)
outer = ti.Matrix.field(3, 3, ti.f32, shape=n)
mix = ti.Vector.field(3, ti.f32, shape=n)


@ti.kernel
def work():
    for i in range(n):
        a[i] = ti.Vector([i + 1.0, -0.5 * i, 2.0])
        b[i] = ti.Vector([0.25, i * 0.1, -1.0])
        dot[i] = a[i].dot(b[i])
        cross[i] = a[i].cross(b[i])
        norm[i] = a[i].norm()
        nsq[i] = a[i].norm_sqr()
        unit[i] = a[i].normalized()
        outer[i] = a[i].outer_product(b[i])
        mix[i] = 2.0 * a[i] - b[i] * 3.0 + a[i] * b[i] / 4.0


def run():
    work()
    return {"dot": dot.to_numpy(), "cross": cross.to_numpy(), "norm": norm.to_numpy(),
            "nsq": nsq.to_numpy(), "unit": unit.to_numpy(), "outer": outer.to_numpy(),
            "mix": mix.to_numpy()}
