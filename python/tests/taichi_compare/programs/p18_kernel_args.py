"""Scalar kernel arguments of several types, and Python ints/floats passed to them."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.f32, shape=4)
y = ti.field(ti.i32, shape=4)
z = ti.field(ti.f64, shape=4)


@ti.kernel
def set_all(a: ti.f32, b: ti.i32, c: ti.f64, flag: ti.i32):
    for i in x:
        x[i] = a * i
        y[i] = b + i
        z[i] = c / (i + 1)
        if flag:
            y[i] = -y[i]


def run():
    set_all(0.1, 7, 1.0 / 3.0, 0)
    out = {"x0": x.to_numpy(), "y0": y.to_numpy(), "z0": z.to_numpy()}
    set_all(3, -4, 2, 1)  # Python ints to f32 and f64
    out.update({"x1": x.to_numpy(), "y1": y.to_numpy(), "z1": z.to_numpy()})
    return out
