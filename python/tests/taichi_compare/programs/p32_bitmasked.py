"""bitmasked cells: only written cells are visited; ti.deactivate and ti.activate."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 16
x = ti.field(ti.f32)
mask = ti.root.bitmasked(ti.ij, (n, n))
mask.place(x)
count = ti.field(ti.i32, shape=())
flags = ti.field(ti.i32, shape=(n, n))


@ti.kernel
def paint():
    for i, j in ti.ndrange(n, n):
        if (i + j) % 5 == 0:
            x[i, j] = i - j


@ti.kernel
def edit():
    for i in range(n):
        ti.deactivate(mask, [i, (n - i) % n])
        ti.activate(mask, [i, i])


@ti.kernel
def census():
    count[None] = 0
    for i, j in x:
        count[None] += 1
        x[i, j] += 100.0
    for i, j in flags:
        flags[i, j] = ti.is_active(mask, [i, j])


def run():
    paint()
    edit()
    census()
    return {"count": count.to_numpy(), "flags": flags.to_numpy(), "x": x.to_numpy()}
