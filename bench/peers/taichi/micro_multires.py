"""multires (bench/micro/multires.fbk): downsample x0 -> x1 -> x2 -> x3, each
level pointer(n / 2^l / 256) -> pointer(16) -> dense(16)."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
N = 2 ** 20


def make(ti):
    xs = [ti.field(ti.f32) for _ in range(4)]
    for l, f in enumerate(xs):
        ti.root.pointer(ti.i, N // 2 ** l // 256).pointer(ti.i, 16).dense(ti.i, 16).place(f)
    x0 = xs[0]

    @ti.kernel
    def initialize():
        for i in range(N):
            v = 4.0
            if i % 8 == 0:
                v = 1.0
            elif i % 4 == 0:
                v = 2.0
            elif i % 2 == 0:
                v = 3.0
            x0[i] = v

    @ti.kernel
    def downsample(X: ti.template(), Y: ti.template()):
        for i in X:
            if i % 2 == 0:
                Y[i // 2] = X[i]

    def step():
        downsample(xs[0], xs[1])
        downsample(xs[1], xs[2])
        downsample(xs[2], xs[3])

    return {"setup": initialize, "step": step,
            "fields": {"x%d" % l: f for l, f in enumerate(xs)}}
