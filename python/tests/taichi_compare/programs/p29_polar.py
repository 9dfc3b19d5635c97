"""ti.polar_decompose in 2-D and 3-D: R and S, and R S == A."""
import taichi as ti

ti.init(arch=ti.cpu)

RTOL = 1e-4
ATOL = 1e-4

n = 8
R2 = ti.Matrix.field(2, 2, ti.f32, shape=n)
S2 = ti.Matrix.field(2, 2, ti.f32, shape=n)
R3 = ti.Matrix.field(3, 3, ti.f32, shape=n)
S3 = ti.Matrix.field(3, 3, ti.f32, shape=n)
back3 = ti.Matrix.field(3, 3, ti.f32, shape=n)


@ti.kernel
def work():
    for i in range(n):
        t = i * 0.5
        A = ti.Matrix([[1.5 + ti.cos(t), 0.2 * i], [-0.3, 1.0 + 0.1 * i]])
        r, s = ti.polar_decompose(A)
        R2[i] = r
        S2[i] = s
        B = ti.Matrix([[2.0, 0.1 * i, 0.0], [0.2, 1.5, ti.sin(t) * 0.3], [0.0, 0.1, 1.0 + t * 0.1]])
        r3, s3 = ti.polar_decompose(B)
        R3[i] = r3
        S3[i] = s3
        back3[i] = r3 @ s3


def run():
    work()
    return {"R2": R2.to_numpy(), "S2": S2.to_numpy(), "R3": R3.to_numpy(), "S3": S3.to_numpy(),
            "back3": back3.to_numpy()}
