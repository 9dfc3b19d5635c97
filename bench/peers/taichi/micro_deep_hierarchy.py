"""deep_hierarchy (bench/micro/deep_hierarchy.fbk): 5 x jitter over a field
under eight nested pointer(4) levels above dense leaves of 8 cells."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
LEAF = 8


def make(ti):
    x = ti.field(ti.f32)
    s = ti.root
    for _ in range(8):
        s = s.pointer(ti.i, 4)
    s.dense(ti.i, LEAF).place(x)
    n = 4 ** 8 * LEAF

    @ti.kernel
    def initialize():
        for i in range(n):
            x[i] = i % 2

    @ti.kernel
    def jitter():
        for i in x:
            if i % 2 == 0:
                x[i] = x[i] + x[i + 1]

    def step():
        for _ in range(5):
            jitter()

    return {"setup": initialize, "step": step, "fields": {"x": x}}
