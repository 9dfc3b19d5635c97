"""fill_array (bench/micro/fill_array.fbk): 10 launches of a[i] = 1.0."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
SCALE = 2


def make(ti):
    N = SCALE * 2 ** 20
    a = ti.field(ti.f32, shape=N)

    @ti.kernel
    def poison():
        for i in a:
            a[i] = -1.0

    @ti.kernel
    def fill():
        for i in a:
            a[i] = 1.0

    def step():
        for _ in range(10):
            fill()

    return {"setup": poison, "step": step, "fields": {"a": a}}
