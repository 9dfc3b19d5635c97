"""dynamic SNodes: ti.append (returning the slot), ti.length, struct-for over the lists."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 6
lst = ti.field(ti.i32)
lists = ti.root.dense(ti.i, n).dynamic(ti.j, 64, chunk_size=8)
lists.place(lst)
lengths = ti.field(ti.i32, shape=n)
sums = ti.field(ti.i32, shape=n)


@ti.kernel
def fill():
    for i in range(n):
        for k in range(i * 5):
            ti.append(lists, i, k * 2)


@ti.kernel
def measure():
    for i in range(n):
        lengths[i] = ti.length(lists, i)
    for i, j in lst:
        sums[i] += lst[i, j]


def run():
    fill()
    measure()
    return {"lengths": lengths.to_numpy(), "sums": sums.to_numpy()}
