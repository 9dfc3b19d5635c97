"""ti.static(...) conditions on template arguments and Python globals."""
import taichi as ti

ti.init(arch=ti.cpu)

USE_SQUARE = True
x = ti.field(ti.f32, shape=8)


@ti.kernel
def fill(mode: ti.template()):
    for i in x:
        if ti.static(mode == 0):
            x[i] = i
        elif ti.static(mode == 1):
            x[i] = -i
        else:
            if ti.static(USE_SQUARE):
                x[i] = i * i
            else:
                x[i] = 0


def run():
    out = {}
    for mode in (0, 1, 2):
        fill(mode)
        out[f"mode{mode}"] = x.to_numpy()
    return out
