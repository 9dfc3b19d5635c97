"""0-D fields: x[None] in kernels and from Python."""
import taichi as ti

ti.init(arch=ti.cpu)

total = ti.field(ti.f32, shape=())
count = ti.field(ti.i32, shape=())
vals = ti.field(ti.f32, shape=16)


@ti.kernel
def accumulate():
    for i in vals:
        total[None] += vals[i]
        count[None] += 1


@ti.kernel
def scale(k: ti.f32):
    total[None] = total[None] * k


def run():
    for i in range(16):
        vals[i] = i * 0.25
    total[None] = 1.5
    accumulate()
    scale(2.0)
    return {"total": total.to_numpy(), "count": count.to_numpy(),
            "total_py": total[None], "count_py": count[None]}
