"""real/mass_spring (bench/real/mass_spring.json): Taichi's
examples/simulation/mass_spring_game.py (max_num_particles = 1024, dt =
1e-3, 10 substeps a frame, spring_Y 1000, drag 1, dashpot 100); instead of
clicked particles, a 32 x 32 cloth (spacing 0.025, springs to the 8
neighbours at their initial length) hanging from its top row, as the .fbk
builds it. A step is one frame."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals


def make(ti, side=32):
    max_num_particles = side * side
    spacing = 0.8 / side
    particle_mass = 1.0
    dt = 1e-3
    substeps = 10
    spring_Y = ti.field(dtype=ti.f32, shape=())
    drag_damping = ti.field(dtype=ti.f32, shape=())
    dashpot_damping = ti.field(dtype=ti.f32, shape=())
    num_particles = ti.field(dtype=ti.i32, shape=())
    x = ti.Vector.field(2, dtype=ti.f32, shape=max_num_particles)
    v = ti.Vector.field(2, dtype=ti.f32, shape=max_num_particles)
    f = ti.Vector.field(2, dtype=ti.f32, shape=max_num_particles)
    fixed = ti.field(dtype=ti.i32, shape=max_num_particles)
    rest_length = ti.field(dtype=ti.f32, shape=(max_num_particles, max_num_particles))

    @ti.kernel
    def substep():
        n = num_particles[None]
        for i in range(n):
            f[i] = ti.Vector([0, -9.8]) * particle_mass
            for j in range(n):
                if rest_length[i, j] != 0:
                    x_ij = x[i] - x[j]
                    d = x_ij.normalized()
                    f[i] += -spring_Y[None] * (x_ij.norm() / rest_length[i, j] - 1) * d
                    v_rel = (v[i] - v[j]).dot(d)
                    f[i] += -dashpot_damping[None] * v_rel * d
        for i in range(n):
            if not fixed[i]:
                v[i] += dt * f[i] / particle_mass
                v[i] *= ti.exp(-dt * drag_damping[None])
                x[i] += v[i] * dt
            else:
                v[i] = ti.Vector([0, 0])
            for d in ti.static(range(2)):
                if x[i][d] < 0:
                    x[i][d] = 0
                    v[i][d] = 0
                if x[i][d] > 1:
                    x[i][d] = 1
                    v[i][d] = 0

    @ti.kernel
    def init():
        spring_Y[None] = 1000
        drag_damping[None] = 1
        dashpot_damping[None] = 100
        num_particles[None] = side * side
        for k in range(side * side):
            a, b = k // side, k % side
            x[k] = [0.1 + a * spacing, 0.95 - b * spacing]
            v[k] = [0, 0]
            fixed[k] = 1 if b == 0 else 0

    @ti.kernel
    def connect():
        n = num_particles[None]
        for i in range(n):
            for j in range(n):
                d = (x[i] - x[j]).norm()
                if i != j and d < 1.5 * spacing:
                    rest_length[i, j] = d

    def setup():
        init()
        connect()

    def step():
        for _ in range(substeps):
            substep()

    return {"setup": setup, "step": step, "fields": {"x": x, "v": v}, "rtol": 1e-3}
