"""Integer arithmetic: // and % with negative operands, bit operations, shifts."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 21
r = ti.field(ti.i32, shape=(n, 8))


@ti.kernel
def work():
    for i in range(n):
        a = i - 10
        b = 3
        r[i, 0] = a // b
        r[i, 1] = a % b
        r[i, 2] = a // -4
        r[i, 3] = a & 6
        r[i, 4] = a | 9
        r[i, 5] = a ^ 5
        r[i, 6] = (i << 3) >> 1
        r[i, 7] = ti.abs(a) * -a


def run():
    work()
    return {"r": r.to_numpy()}
