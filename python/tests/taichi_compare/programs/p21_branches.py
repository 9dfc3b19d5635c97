"""if/elif/else, the conditional expression, and and/or/not."""
import taichi as ti

ti.init(arch=ti.cpu)

x = ti.field(ti.i32, shape=30)
y = ti.field(ti.f32, shape=30)


@ti.kernel
def classify():
    for i in x:
        if i % 15 == 0:
            x[i] = 15
        elif i % 5 == 0:
            x[i] = 5
        elif i % 3 == 0 and i > 10:
            x[i] = 3
        elif not (i % 2 == 0) or i == 4:
            x[i] = 1
        else:
            x[i] = 0
        y[i] = i * 0.5 if i < 12 else -1.0


def run():
    classify()
    return {"x": x.to_numpy(), "y": y.to_numpy()}
