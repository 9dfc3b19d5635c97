"""Matrix products with @, 3x3 inverse and determinant, matrix-vector, identity, trace."""
import taichi as ti

ti.init(arch=ti.cpu)

RTOL = 1e-4
ATOL = 1e-5

n = 8
m = ti.Matrix.field(3, 3, ti.f32, shape=n)
prod = ti.Matrix.field(3, 3, ti.f32, shape=n)
inv = ti.Matrix.field(3, 3, ti.f32, shape=n)
det = ti.field(ti.f32, shape=n)
mv = ti.Vector.field(3, ti.f32, shape=n)
tr = ti.field(ti.f32, shape=n)


@ti.kernel
def work():
    for i in range(n):
        A = ti.Matrix([[2.0 + i, 0.5, 0.0], [0.1 * i, 3.0, -1.0], [0.0, 1.0, 4.0]])
        B = ti.Matrix.identity(ti.f32, 3) * 2.0 + A.transpose()
        m[i] = A
        prod[i] = A @ B
        inv[i] = A.inverse()
        det[i] = A.determinant()
        mv[i] = A @ ti.Vector([1.0, -1.0, 0.5])
        tr[i] = A.trace()


def run():
    work()
    return {"m": m.to_numpy(), "prod": prod.to_numpy(), "inv": inv.to_numpy(),
            "det": det.to_numpy(), "mv": mv.to_numpy(), "tr": tr.to_numpy()}
