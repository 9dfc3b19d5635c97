"""Clearing a pointer SNode from Python (snode.deactivate_all()), then reusing it."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.f32)
block = ti.root.pointer(ti.i, 8)
block.dense(ti.i, 8).place(x)
count = ti.field(ti.i32, shape=())


@ti.kernel
def write(k: ti.i32):
    for i in range(64):
        if i % k == 0:
            x[i] = i * 0.5


@ti.kernel
def census():
    count[None] = 0
    for i in x:
        count[None] += 1


def run():
    write(3)
    census()
    before = count.to_numpy()
    block.deactivate_all()
    census()
    cleared = count.to_numpy()
    write(10)
    census()
    return {"before": before, "cleared": cleared, "after": count.to_numpy(), "x": x.to_numpy()}
