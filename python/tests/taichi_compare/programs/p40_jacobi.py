"""A Jacobi stencil on a 2-D grid: a kernel launched many times, ping-pong fields."""
import taichi as ti

ti.init(arch=ti.cpu)

RTOL = 1e-4
ATOL = 1e-5

n = 32
u = ti.field(ti.f32, shape=(n, n))
v = ti.field(ti.f32, shape=(n, n))
f = ti.field(ti.f32, shape=(n, n))


@ti.kernel
def init():
    for i, j in f:
        f[i, j] = 1.0 if (i - n // 2) ** 2 + (j - n // 2) ** 2 < 16 else 0.0


@ti.kernel
def step(src: ti.template(), dst: ti.template()):
    for i, j in ti.ndrange((1, n - 1), (1, n - 1)):
        dst[i, j] = 0.25 * (src[i - 1, j] + src[i + 1, j] + src[i, j - 1] + src[i, j + 1] + f[i, j])


def run():
    init()
    for _ in range(50):
        step(u, v)
        step(v, u)
    return {"u": u.to_numpy()}
