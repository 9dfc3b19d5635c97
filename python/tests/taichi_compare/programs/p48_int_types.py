"""Integer and float types beyond i32/f32: i64, u32, f64 fields and casts."""
import taichi as ti

ti.init(arch=ti.cpu)

a = ti.field(ti.i64, shape=6)
b = ti.field(ti.u32, shape=6)
c = ti.field(ti.f64, shape=6)


@ti.kernel
def work():
    for i in range(6):
        a[i] = ti.cast(i, ti.i64) * ti.i64(3000000000)
        b[i] = ti.u32(4000000000) - ti.cast(i, ti.u32)
        c[i] = ti.cast(a[i], ti.f64) / 7.0


def run():
    work()
    return {"a": a.to_numpy(), "b": b.to_numpy(), "c": c.to_numpy()}
