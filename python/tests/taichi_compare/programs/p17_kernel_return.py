"""Kernels that return a value (-> ti.f32, -> ti.i32)."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.f32, shape=10)


@ti.kernel
def total() -> ti.f32:
    s = 0.0
    for i in range(10):
        s += x[i]
    return s


@ti.kernel
def argmax_serial() -> ti.i32:
    best = 0
    ti.loop_config(serialize=True)
    for i in range(10):
        if x[i] > x[best]:
            best = i
    return best


@ti.kernel
def add(a: ti.i32, b: ti.i32) -> ti.i32:
    return a + b


def run():
    for i in range(10):
        x[i] = (i * 7 % 10) * 0.5
    return {"total": total(), "argmax": argmax_serial(), "add": add(20, 22)}
