"""@ti.func: return values, nested calls, arguments by value, vector returns."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.f32, shape=12)
v = ti.Vector.field(2, ti.f32, shape=12)


@ti.func
def sq(t):
    return t * t


@ti.func
def poly(t):
    return sq(t) - 3.0 * t + 1.0


@ti.func
def rot(p, c, s):
    return ti.Vector([c * p[0] - s * p[1], s * p[0] + c * p[1]])


@ti.func
def bump(k: ti.i32) -> ti.i32:
    k += 5  # a copy: the caller's value stays
    return k * 2


@ti.kernel
def work():
    for i in x:
        j = i
        x[i] = poly(i * 0.5) + bump(j) + j
        v[i] = rot(ti.Vector([1.0, i * 0.1]), ti.cos(0.3), ti.sin(0.3))


def run():
    work()
    return {"x": x.to_numpy(), "v": v.to_numpy()}
