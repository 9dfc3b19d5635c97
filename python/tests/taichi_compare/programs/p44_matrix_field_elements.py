"""Matrix fields indexed M[i][r, c] in kernels, matrices built in loops, scalar * matrix."""
import taichi as ti

ti.init(arch=ti.cpu)

n = 5
M = ti.Matrix.field(3, 3, ti.f32, shape=n)
diag = ti.Vector.field(3, ti.f32, shape=n)


@ti.kernel
def work():
    for i in range(n):
        for r, c in ti.static(ti.ndrange(3, 3)):
            M[i][r, c] = r * 3 + c + i
        M[i] = 0.5 * M[i] + M[i].transpose()
        for r in ti.static(range(3)):
            diag[i][r] = M[i][r, r]


def run():
    work()
    return {"M": M.to_numpy(), "diag": diag.to_numpy()}
