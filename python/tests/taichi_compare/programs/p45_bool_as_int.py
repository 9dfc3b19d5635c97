"""Comparisons and ti.is_active used as integers (t += cond)."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 32
x = ti.field(ti.f32, shape=n)
positives = ti.field(ti.i32, shape=())
sp = ti.field(ti.f32)
blk = ti.root.pointer(ti.i, 8)
blk.place(sp)
n_active = ti.field(ti.i32, shape=())


@ti.kernel
def work():
    for i in x:
        x[i] = ti.sin(i * 0.7)
    for i in x:
        positives[None] += x[i] > 0
    sp[1] = 1.0
    sp[5] = 2.0
    for i in range(8):
        n_active[None] += ti.is_active(blk, [i])


def run():
    work()
    return {"positives": positives.to_numpy(), "n_active": n_active.to_numpy()}
