"""while loops with break and continue inside parallel loop bodies."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 40
steps = ti.field(ti.i32, shape=n)
odd_sum = ti.field(ti.i32, shape=n)
first_div = ti.field(ti.i32, shape=n)


@ti.kernel
def work():
    for i in range(1, n):
        k = i
        c = 0
        while k != 1:
            if k % 2 == 0:
                k = k // 2
            else:
                k = 3 * k + 1
            c += 1
        steps[i] = c
        s = 0
        for j in range(i):
            if j % 2 == 0:
                continue
            s += j
        odd_sum[i] = s
        d = -1
        for j in range(2, i):
            if i % j == 0:
                d = j
                break
        first_div[i] = d


def run():
    work()
    return {"steps": steps.to_numpy(), "odd_sum": odd_sum.to_numpy(),
            "first_div": first_div.to_numpy()}
