"""ti.rescale_index: from a cell's index to its block's, over a pointer/dense tree."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.i32)
blk = ti.root.pointer(ti.ij, (4, 4))
blk.dense(ti.ij, (2, 2)).place(x)
owner = ti.field(ti.i32, shape=(8, 8))


@ti.kernel
def work():
    for i, j in ti.ndrange(8, 8):
        if (i * j) % 3 == 0:
            x[i, j] = 1
    for i, j in x:
        b = ti.rescale_index(x, blk, ti.Vector([i, j]))
        owner[i, j] = b[0] * 10 + b[1]


def run():
    owner.fill(-1)
    work()
    return {"owner": owner.to_numpy()}
