"""increments (bench/micro/increments.fbk): 10 launches of x[i] = x[i] + 1."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
SCALE = 2


def make(ti):
    N = SCALE * 2 ** 20
    x = ti.field(ti.i32, shape=N)

    @ti.kernel
    def reset():
        for i in range(N):
            x[i] = 0

    @ti.kernel
    def inc():
        for i in x:
            x[i] = x[i] + 1

    def step():
        for _ in range(10):
            inc()

    return {"setup": reset, "step": step, "fields": {"x": x}}
