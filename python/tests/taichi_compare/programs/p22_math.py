"""Math builtins: ti.sin/cos/tan/exp/log/sqrt/floor/ceil/abs/atan2/tanh/pow/min/max, ti.math.*."""
import taichi as ti

ti.init(arch=ti.cpu)

RTOL = 1e-5
ATOL = 1e-5

n = 32
r = ti.field(ti.f32, shape=(n, 14))


@ti.kernel
def work():
    for i in range(n):
        t = (i - 10) * 0.37
        r[i, 0] = ti.sin(t)
        r[i, 1] = ti.cos(t)
        r[i, 2] = ti.tan(t * 0.3)
        r[i, 3] = ti.exp(t * 0.2)
        r[i, 4] = ti.log(ti.abs(t) + 1.0)
        r[i, 5] = ti.sqrt(ti.abs(t))
        r[i, 6] = ti.floor(t)
        r[i, 7] = ti.ceil(t)
        r[i, 8] = ti.atan2(t, 1.5)
        r[i, 9] = ti.tanh(t)
        r[i, 10] = ti.pow(ti.abs(t), 1.5)
        r[i, 11] = ti.min(t, 0.5) + ti.max(t, -0.5)
        r[i, 12] = ti.math.clamp(t, -1.0, 1.0)
        r[i, 13] = t ** 2 + abs(t)


def run():
    work()
    return {"r": r.to_numpy()}
