"""A kernel that reads and bumps a 0-D counter, then loops up to the value it read
(mass_spring_game's new_particle), and a simulation step gated by a 0-D flag from Python."""
import taichi as ti

ti.init(arch=ti.cpu)

n_max = 16
count = ti.field(ti.i32, shape=())
paused = ti.field(ti.i32, shape=())
x = ti.Vector.field(2, ti.f32, shape=n_max)
v = ti.Vector.field(2, ti.f32, shape=n_max)
link = ti.field(ti.f32, shape=(n_max, n_max))


@ti.kernel
def add(px: ti.f32, py: ti.f32):
    k = count[None]
    x[k] = [px, py]
    count[None] += 1
    for i in range(k):
        if (x[k] - x[i]).norm() < 0.15:
            link[i, k] = 0.1
            link[k, i] = 0.1


@ti.kernel
def step():
    for i in range(count[None]):
        v[i] += ti.Vector([0.0, -9.8]) * 1e-3
        x[i] += v[i] * 1e-3


def run():
    add(0.3, 0.3)
    add(0.3, 0.4)
    add(0.4, 0.4)
    add(0.9, 0.9)
    for _ in range(3):
        if not paused[None]:
            step()
    return {"count": count.to_numpy(), "x": x.to_numpy(), "v": v.to_numpy(),
            "link": link.to_numpy()}
