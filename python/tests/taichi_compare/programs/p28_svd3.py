"""ti.svd of 3x3 matrices: singular values (sorted), U V^T and the reconstruction."""
import numpy as np
import taichi as ti

ti.init(arch=ti.cpu)

RTOL = 1e-3
ATOL = 1e-4

n = 10
sig = ti.Vector.field(3, ti.f32, shape=n)
R = ti.Matrix.field(3, 3, ti.f32, shape=n)
back = ti.Matrix.field(3, 3, ti.f32, shape=n)


@ti.kernel
def work():
    for i in range(n):
        t = i * 0.3
        M = ti.Matrix([[2.0 + t, 0.3, -0.2], [0.1, 1.0 + ti.sin(t), 0.4],
                       [0.0, -0.5, 3.0 - t * 0.2]])
        U, S, V = ti.svd(M)
        sig[i] = ti.Vector([S[0, 0], S[1, 1], S[2, 2]])
        R[i] = U @ V.transpose()
        back[i] = U @ S @ V.transpose()


def run():
    work()
    return {"sig": np.sort(sig.to_numpy(), axis=1), "R": R.to_numpy(), "back": back.to_numpy()}
