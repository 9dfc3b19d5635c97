"""chain_copy (bench/micro/chain_copy.fbk): y = x + 1, then z = y + 4."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
SCALE = 2


def make(ti):
    N = SCALE * 2 ** 20
    x, y, z = (ti.field(ti.i32, shape=N) for _ in range(3))

    @ti.kernel
    def init_x():
        for i in x:
            x[i] = 3

    @ti.kernel
    def x_to_y():
        for i in x:
            y[i] = x[i] + 1

    @ti.kernel
    def y_to_z():
        for i in x:
            z[i] = y[i] + 4

    def step():
        x_to_y()
        y_to_z()

    return {"setup": init_x, "step": step, "fields": {"x": x, "y": y, "z": z}}
