"""@ti.func with default arguments and keyword arguments."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.f32, shape=(5, 3))


@ti.func
def lerp(a, b, t=0.5):
    return a + (b - a) * t


@ti.kernel
def work():
    for i in range(5):
        x[i, 0] = lerp(0.0, i * 1.0)
        x[i, 1] = lerp(0.0, i * 1.0, 0.25)
        x[i, 2] = lerp(b=2.0, a=i * 1.0, t=0.75)


def run():
    work()
    return {"x": x.to_numpy()}
