"""ti.ndrange with (begin, end) pairs, and a plain extent, as parallel loops."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.i32, shape=(8, 6))
hits = ti.field(ti.i32, shape=())


@ti.kernel
def mark():
    for i, j in ti.ndrange((1, 7), (2, 5)):
        x[i, j] = i * 100 + j
        hits[None] += 1
    for i, j in ti.ndrange(2, (-3, -1)):
        x[i, j + 3] += 1000


def run():
    mark()
    return {"x": x.to_numpy(), "hits": hits.to_numpy()}
