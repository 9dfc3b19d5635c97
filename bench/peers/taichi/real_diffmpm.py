"""real/diffmpm (bench/real/diffmpm.json): a differentiable MLS-MPM after
DiffTaichi's diffmpm.py, 64 x 32 particles, grid 64^2, 64 states (63
advances), dt = 1e-3; a step is one optimisation iteration: the forward
pass under ti.ad.Tape(loss), then gradient descent on the controller.
Written the way diffmpm writes it: per-step fields x[s, p], one kernel
each for the actuation, P2G, the grid and G2P per step; the block and its
four muscle groups as in the .fbk (a fixed start, no random numbers)."""
import math

import taichi as ti  # also a global: ti.func bodies are compiled against module globals


def make(ti, NX=64, NY=32, n_grid=64, steps=64, lr=100.0):
    n_particles = NX * NY
    dx = 1 / n_grid
    inv_dx = float(n_grid)
    dt = 1e-3
    E = 10.0
    mu, la = E, E
    gravity = 3.8
    act_strength = 4.0
    bound = 3

    x = ti.Vector.field(2, ti.f32, (steps, n_particles), needs_grad=True)
    v = ti.Vector.field(2, ti.f32, (steps, n_particles), needs_grad=True)
    C = ti.Matrix.field(2, 2, ti.f32, (steps, n_particles), needs_grad=True)
    F = ti.Matrix.field(2, 2, ti.f32, (steps, n_particles), needs_grad=True)
    aid = ti.field(ti.i32, n_particles)
    grid_v_in = ti.Vector.field(2, ti.f32, (steps, n_grid, n_grid), needs_grad=True)
    grid_m_in = ti.field(ti.f32, (steps, n_grid, n_grid), needs_grad=True)
    grid_v_out = ti.Vector.field(2, ti.f32, (steps, n_grid, n_grid), needs_grad=True)
    weights = ti.field(ti.f32, (4, 4), needs_grad=True)
    bias = ti.field(ti.f32, 4, needs_grad=True)
    actuation = ti.field(ti.f32, (steps, 4), needs_grad=True)
    x_avg = ti.Vector.field(2, ti.f32, (), needs_grad=True)
    loss = ti.field(ti.f32, (), needs_grad=True)

    @ti.kernel
    def init():
        for p in range(n_particles):
            i = p % NX
            j = p // NX
            x[0, p] = [0.1 + (i + 0.5) * dx * 0.5, bound * dx + (j + 0.5) * dx * 0.5]
            v[0, p] = [0.0, 0.0]
            F[0, p] = [[1.0, 0.0], [0.0, 1.0]]
            C[0, p] = [[0.0, 0.0], [0.0, 0.0]]
            aid[p] = (i * 2) // NX + 2 * ((j * 2) // NY)
        for k in range(4):
            for j in range(4):
                weights[k, j] = 0.3 * ti.sin(1.7 * k + 0.9 * j + 0.4)
            bias[k] = 0.1 * (k - 1.5)

    @ti.kernel
    def clear_grid():
        for s, i, j in grid_m_in:
            grid_v_in[s, i, j] = [0.0, 0.0]
            grid_m_in[s, i, j] = 0.0
            grid_v_out[s, i, j] = [0.0, 0.0]

    @ti.kernel
    def compute_actuation(s: ti.i32):
        for k in range(4):
            a = bias[k]
            for j in ti.static(range(4)):
                a += weights[k, j] * ti.sin(10.0 * s * dt + 2 * math.pi / 4 * j)
            actuation[s, k] = ti.tanh(a)

    @ti.kernel
    def p2g(s: ti.i32):
        for p in range(n_particles):
            base = ti.cast(x[s, p] * inv_dx - 0.5, ti.i32)
            fx = x[s, p] * inv_dx - ti.cast(base, ti.f32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_F = (ti.Matrix.identity(ti.f32, 2) + dt * C[s, p]) @ F[s, p]
            F[s + 1, p] = new_F
            J = new_F.determinant()
            act = actuation[s, aid[p]] * act_strength
            A = ti.Matrix([[0.0, 0.0], [0.0, 1.0]]) * act
            cauchy = mu * (new_F @ new_F.transpose() - ti.Matrix.identity(ti.f32, 2)) + \
                ti.Matrix.identity(ti.f32, 2) * la * J * (J - 1) + new_F @ A @ new_F.transpose()
            affine = -(dt * 4 * inv_dx * inv_dx) * cauchy + C[s, p]
            for i, j in ti.static(ti.ndrange(3, 3)):
                offset = ti.Vector([i, j])
                dpos = (ti.cast(offset, ti.f32) - fx) * dx
                weight = w[i][0] * w[j][1]
                grid_v_in[s, base + offset] += weight * (v[s, p] + affine @ dpos)
                grid_m_in[s, base + offset] += weight

    @ti.kernel
    def grid_op(s: ti.i32):
        for i, j in ti.ndrange(n_grid, n_grid):
            m = grid_m_in[s, i, j]
            g = ti.Vector([0.0, 0.0])
            if m > 0:
                g = grid_v_in[s, i, j] / m
                g[1] -= dt * gravity
                if i < bound and g[0] < 0:
                    g[0] = 0.0
                if i > n_grid - bound and g[0] > 0:
                    g[0] = 0.0
                if j < bound and g[1] < 0:
                    g[0] = 0.0
                    g[1] = 0.0
                if j > n_grid - bound and g[1] > 0:
                    g[1] = 0.0
            grid_v_out[s, i, j] = g

    @ti.kernel
    def g2p(s: ti.i32):
        for p in range(n_particles):
            base = ti.cast(x[s, p] * inv_dx - 0.5, ti.i32)
            fx = x[s, p] * inv_dx - ti.cast(base, ti.f32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = ti.Vector([0.0, 0.0])
            new_C = ti.Matrix([[0.0, 0.0], [0.0, 0.0]])
            for i, j in ti.static(ti.ndrange(3, 3)):
                dpos = ti.Vector([i, j], dt=ti.f32) - fx
                g_v = grid_v_out[s, base[0] + i, base[1] + j]
                weight = w[i][0] * w[j][1]
                new_v += weight * g_v
                new_C += 4 * weight * g_v.outer_product(dpos) * inv_dx
            v[s + 1, p] = new_v
            C[s + 1, p] = new_C
            x[s + 1, p] = x[s, p] + dt * new_v

    @ti.kernel
    def compute_x_avg():
        for p in range(n_particles):
            x_avg[None] += (1.0 / n_particles) * x[steps - 1, p]

    @ti.kernel
    def compute_loss():
        loss[None] = -x_avg[None][0]

    @ti.kernel
    def descend():
        for k, j in weights:
            weights[k, j] -= lr * weights.grad[k, j]
        for k in bias:
            bias[k] -= lr * bias.grad[k]

    tape = ti.ad.Tape if hasattr(ti, "ad") else ti.Tape

    def step():
        clear_grid()
        x_avg[None] = [0.0, 0.0]
        with tape(loss=loss):
            for s in range(steps - 1):
                compute_actuation(s)
                p2g(s)
                grid_op(s)
                g2p(s)
            compute_x_avg()
            compute_loss()
        descend()

    return {"setup": init, "step": step, "rtol": 1e-3,
            "fields": {"loss": loss, "weights": weights, "bias": bias,
                       "weights.grad": weights.grad, "bias.grad": bias.grad}}
