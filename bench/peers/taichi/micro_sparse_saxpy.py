"""sparse_saxpy (bench/micro/sparse_saxpy.fbk): initialize, then six saxpys
over the active cells of a B x B pointer grid of 32 x 32 dense blocks."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
B = 4


def make(ti):
    a = ti.field(ti.f32)
    b = ti.field(ti.f32)
    ti.root.pointer(ti.ij, (B, B)).dense(ti.ij, (32, 32)).place(a, b)

    @ti.kernel
    def initialize():
        for i in range(B * 32):      # outer loop parallel, inner serial
            for j in range(B * 32):
                if (i // 32 + j // 32) % 4 == 0:
                    a[i, j] = i + j

    @ti.kernel
    def saxpy(X: ti.template(), Y: ti.template(), alpha: ti.f32):
        for i, j in X:
            Y[i, j] = alpha * X[i, j] + Y[i, j]

    def step():
        initialize()
        saxpy(a, b, 2.0)
        for _ in range(2):
            saxpy(b, a, 1.1)
        for _ in range(3):
            saxpy(a, b, 1.1)

    return {"setup": lambda: None, "step": step, "fields": {"a": a, "b": b}}
