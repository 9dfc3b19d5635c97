"""ti.svd of 2x2 matrices: singular values and the rotation U V^T (unique), reconstruction."""
import taichi as ti

ti.init(arch=ti.cpu)

RTOL = 1e-4
ATOL = 1e-5

n = 12
A = ti.Matrix.field(2, 2, ti.f32, shape=n)
sig = ti.Vector.field(2, ti.f32, shape=n)
R = ti.Matrix.field(2, 2, ti.f32, shape=n)
back = ti.Matrix.field(2, 2, ti.f32, shape=n)


@ti.kernel
def work():
    for i in range(n):
        t = i * 0.4
        M = ti.Matrix([[1.0 + 0.1 * i, ti.sin(t)], [ti.cos(t) * 0.5, 2.0 - 0.05 * i]])
        if i == 0:
            M = ti.Matrix([[1.0, 0.0], [0.0, 1.0]])
        A[i] = M
        U, S, V = ti.svd(M)
        sig[i] = ti.Vector([S[0, 0], S[1, 1]])
        R[i] = U @ V.transpose()
        back[i] = U @ S @ V.transpose()


def run():
    work()
    return {"sig": sig.to_numpy(), "R": R.to_numpy(), "back": back.to_numpy()}
