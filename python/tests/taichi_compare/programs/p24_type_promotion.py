"""Type promotion: int / int is a float, int + float is float, ti.cast, int(), f64 fields."""
import taichi as ti

ti.init(arch=ti.cpu)

f = ti.field(ti.f32, shape=(10, 6))
d = ti.field(ti.f64, shape=10)
k = ti.field(ti.i32, shape=(10, 3))


@ti.kernel
def work():
    for i in range(10):
        a = i - 4
        f[i, 0] = a / 3
        f[i, 1] = a + 0.5
        f[i, 2] = ti.cast(a, ti.f32) * 0.1
        f[i, 3] = a // 3
        f[i, 4] = 7 / 2
        f[i, 5] = a * 1.5 / 2
        d[i] = ti.cast(1, ti.f64) / (i + 3)
        k[i, 0] = int(a * 1.7)
        k[i, 1] = ti.cast(a * -1.3, ti.i32)
        k[i, 2] = ti.floor(a * 0.5, ti.i32)


def run():
    work()
    return {"f": f.to_numpy(), "d": d.to_numpy(), "k": k.to_numpy()}
