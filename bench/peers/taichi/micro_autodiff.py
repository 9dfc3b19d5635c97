"""autodiff (bench/micro/autodiff.fbk): ti.Tape of loss = sum(a), with the
gradient kernels written by hand as in the Fusebox program."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
SCALE = 2


def make(ti):
    N = SCALE * 2 ** 20
    a, a_grad, b = (ti.field(ti.f32, shape=N) for _ in range(3))
    loss = ti.field(ti.f32, shape=())
    loss_grad = ti.field(ti.f32, shape=())

    @ti.kernel
    def init_a():
        for i in range(N):
            v = 0.5
            if i % 2 != 0:
                v = -0.5
            if i < 1000:
                v = 1.0
            a[i] = v

    @ti.kernel
    def clear_grads():
        for i in a_grad:
            a_grad[i] = 0.0
        loss_grad[None] = 0.0

    @ti.kernel
    def init_loss():
        loss[None] = 0.0
        loss_grad[None] = 1.0

    @ti.kernel
    def compute_loss():
        for i in a:
            loss[None] += a[i]

    @ti.kernel
    def compute_loss_grad():
        for i in a:
            a_grad[i] = a_grad[i] + loss_grad[None]

    @ti.kernel
    def accumulate_grad():
        for i in a:
            b[i] = b[i] + a_grad[i]

    def step():
        for _ in range(10):
            clear_grads()
            init_loss()
            compute_loss()
            compute_loss_grad()
            accumulate_grad()

    return {"setup": init_a, "step": step,
            "fields": {"a": a, "a_grad": a_grad, "b": b, "loss": loss, "loss_grad": loss_grad}}
