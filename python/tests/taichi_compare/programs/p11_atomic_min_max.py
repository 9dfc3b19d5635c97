"""ti.atomic_min / ti.atomic_max on ints and floats, and their old values."""
import taichi as ti

ti.init(arch=ti.cpu)

data = ti.field(ti.i32, shape=100)
fdata = ti.field(ti.f32, shape=100)
lo = ti.field(ti.i32, shape=())
hi = ti.field(ti.i32, shape=())
flo = ti.field(ti.f32, shape=())
fhi = ti.field(ti.f32, shape=())
old_first = ti.field(ti.i32, shape=())


@ti.kernel
def init():
    for i in data:
        data[i] = (i * 37) % 101 - 50
        fdata[i] = ti.sin(i * 0.3) * 10.0


@ti.kernel
def reduce():
    for i in data:
        ti.atomic_min(lo[None], data[i])
        ti.atomic_max(hi[None], data[i])
        ti.atomic_min(flo[None], fdata[i])
        ti.atomic_max(fhi[None], fdata[i])


@ti.kernel
def serial_old():
    old_first[None] = ti.atomic_max(hi[None], 1000)


def run():
    init()
    lo[None] = 10 ** 6
    hi[None] = -10 ** 6
    flo[None] = 1e9
    fhi[None] = -1e9
    reduce()
    r = {"lo": lo.to_numpy(), "hi": hi.to_numpy(), "flo": flo.to_numpy(), "fhi": fhi.to_numpy()}
    serial_old()
    r["old"] = old_first.to_numpy()
    r["hi_after"] = hi.to_numpy()
    return r
