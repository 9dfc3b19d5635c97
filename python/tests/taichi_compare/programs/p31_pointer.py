"""A pointer SNode over dense blocks: activation by writing, ti.is_active, struct-for
over the active cells."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.i32)
blk = ti.root.pointer(ti.ij, 4)
blk.dense(ti.ij, 4).place(x)
active_blocks = ti.field(ti.i32, shape=(4, 4))
visited = ti.field(ti.i32, shape=())


@ti.kernel
def touch():
    for i in range(16):
        if i % 5 == 0:
            x[i, (i * 3) % 16] = i + 1


@ti.kernel
def scan():
    for i, j in x:
        visited[None] += 1
    for I in ti.grouped(active_blocks):
        active_blocks[I] = ti.is_active(blk, I)


def run():
    touch()
    scan()
    return {"x": x.to_numpy(), "visited": visited.to_numpy(),
            "active": active_blocks.to_numpy()}
