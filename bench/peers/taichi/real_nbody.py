"""real/nbody (bench/real/nbody.json): Taichi's examples/simulation/nbody.py,
N = 3000, a step is one frame of 10 substeps (compute_force, update); the
bodies are placed by the same integer hash as the .fbk instead of
ti.random()."""
import math
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
from real_mpm88 import hash01


def make(ti, N=3000):
    G, m = 1, 1
    galaxy_size = 0.4
    init_vel = 120
    h = 1e-4
    substepping = 10
    center = ti.Vector.field(2, ti.f32, ())
    pos = ti.Vector.field(2, ti.f32, N)
    vel = ti.Vector.field(2, ti.f32, N)
    force = ti.Vector.field(2, ti.f32, N)

    @ti.kernel
    def initialize():
        center[None] = [0.5, 0.5]
        for i in range(N):
            theta = hash01(2 * i) * 2 * math.pi
            r = (ti.sqrt(hash01(2 * i + 1)) * 0.6 + 0.4) * galaxy_size
            offset = r * ti.Vector([ti.cos(theta), ti.sin(theta)])
            pos[i] = center[None] + offset
            vel[i] = [-offset.y, offset.x]
            vel[i] *= init_vel

    @ti.kernel
    def compute_force():
        for i in range(N):
            force[i] = [0.0, 0.0]
        for i in range(N):
            p = pos[i]
            for j in range(N):
                if i != j:
                    diff = p - pos[j]
                    r = diff.norm(1e-5)
                    f = -G * m * m * (1.0 / r) ** 3 * diff
                    force[i] += f

    @ti.kernel
    def update():
        dt = h / substepping
        for i in range(N):
            vel[i] += dt * force[i] / m
            pos[i] += dt * vel[i]

    def step():
        for _ in range(substepping):
            compute_force()
            update()

    return {"setup": initialize, "step": step, "fields": {"pos": pos, "vel": vel}, "rtol": 1e-4}
