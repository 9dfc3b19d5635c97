"""ti.math.vec2/vec3, ti.types.vector/matrix, ti.math.length/dot/normalize/cross."""
import taichi as ti

ti.init(arch=ti.cpu)

vec3 = ti.types.vector(3, ti.f32)
mat2 = ti.types.matrix(2, 2, ti.f32)
n = 6
out = ti.Vector.field(3, ti.f32, shape=n)
s = ti.field(ti.f32, shape=(n, 3))
mm = ti.Matrix.field(2, 2, ti.f32, shape=n)


@ti.kernel
def work():
    for i in range(n):
        a = ti.math.vec3(1.0, i * 0.5, -1.0)
        b = vec3(0.5, 0.25, i)
        out[i] = ti.math.cross(a, b) + ti.math.normalize(b)
        s[i, 0] = ti.math.length(a)
        s[i, 1] = ti.math.dot(a, b)
        p = ti.math.vec2(i, 1.0)
        s[i, 2] = p.x * p.y + p[0]
        mm[i] = mat2([[i, 1.0], [0.0, 2.0]]) @ mat2([[1.0, 0.5], [0.5, 1.0]])


def run():
    work()
    return {"out": out.to_numpy(), "s": s.to_numpy(), "mm": mm.to_numpy()}
