"""stencil_reduction (bench/micro/stencil_reduction.fbk): initialize, then
3 x {stencil, reduce, clear_b} over the active cells of a."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
K = 128


def make(ti):
    a = ti.field(ti.f32)
    b = ti.field(ti.f32)
    ti.root.pointer(ti.i, K).dense(ti.i, 1024).place(a, b)
    total = ti.field(ti.f32, shape=())

    @ti.kernel
    def initialize():
        for i in range(1024, 1024 * (K - 1)):
            a[i] = i

    @ti.kernel
    def stencil():
        for i in a:
            b[i] = a[i - 1] + a[i] + a[i + 1]

    @ti.kernel
    def reduce():
        for i in a:
            total[None] += b[i]

    @ti.kernel
    def clear_b():
        for i in a:
            b[i] = 0.0

    def step():
        initialize()
        for _ in range(3):
            stencil()
            reduce()
            clear_b()

    return {"setup": lambda: None, "step": step, "fields": {"a": a, "b": b}}
