"""Nested loops: the outermost is parallel, inner ones serial; a serial kernel-level loop."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 16
a = ti.field(ti.f32, shape=(n, n))
rowsum = ti.field(ti.f32, shape=n)
prefix = ti.field(ti.i32, shape=n)


@ti.kernel
def work():
    for i in range(n):
        for j in range(n):
            a[i, j] = (i - j) * 0.25
        acc = 0.0
        for j in range(i, n):
            acc += a[i, j]
        rowsum[i] = acc


@ti.kernel
def scan():
    ti.loop_config(serialize=True)
    for i in range(n):
        if i == 0:
            prefix[i] = 1
        else:
            prefix[i] = prefix[i - 1] + i


def run():
    work()
    scan()
    return {"a": a.to_numpy(), "rowsum": rowsum.to_numpy(), "prefix": prefix.to_numpy()}
