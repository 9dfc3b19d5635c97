"""A differentiable MLS-MPM in the style of DiffTaichi's diffmpm: a soft
block on a sticky floor, four muscle groups driven by a sine-wave
controller; per-step state x[s, p], v[s, p], C[s, p], F[s, p] and a grid
per step; the loss is minus the x of the final centre of mass; ti.ad.Tape
gives the gradient w.r.t. the controller (weights, bias) and the initial
velocities; three steps of gradient descent.

Tolerance: the P2G scatter adds with float atomics in an order that differs
between engines (and between runs of one engine), so f32 values differ in
their last bits and the differences grow over the 40 steps and three
iterations; RTOL 2e-3 / ATOL 1e-7 holds them (the gradients are 1e-5 to 1e-2), and is still far below what
a wrong adjoint (a missing term, a dropped branch) changes."""
import math

import taichi as ti

ti.init(arch=ti.cpu)

NEEDS_AD = True
RTOL = 2e-3
ATOL = 1e-7

steps = 40
n_grid = 32
dx = 1 / n_grid
inv_dx = float(n_grid)
dt = 2e-3
p_vol = 1.0
p_mass = 1.0
E = 10.0
mu = E
la = E
gravity = 3.8
bound = 3
act_strength = 10.0
n_actuators = 4
n_sin_waves = 4
omega = 10.0
nx, ny = 16, 8
n_particles = nx * ny
learning_rate = 100.0
iterations = 3

x = ti.Vector.field(2, ti.f32, shape=(steps, n_particles), needs_grad=True)
v = ti.Vector.field(2, ti.f32, shape=(steps, n_particles), needs_grad=True)
C = ti.Matrix.field(2, 2, ti.f32, shape=(steps, n_particles), needs_grad=True)
F = ti.Matrix.field(2, 2, ti.f32, shape=(steps, n_particles), needs_grad=True)
actuator_id = ti.field(ti.i32, shape=n_particles)
grid_v_in = ti.Vector.field(2, ti.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
grid_m_in = ti.field(ti.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
grid_v_out = ti.Vector.field(2, ti.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
weights = ti.field(ti.f32, shape=(n_actuators, n_sin_waves), needs_grad=True)
bias = ti.field(ti.f32, shape=n_actuators, needs_grad=True)
actuation = ti.field(ti.f32, shape=(steps, n_actuators), needs_grad=True)
x_avg = ti.Vector.field(2, ti.f32, shape=(), needs_grad=True)
loss = ti.field(ti.f32, shape=(), needs_grad=True)


@ti.kernel
def clear_grid():
    for s, i, j in grid_m_in:
        grid_v_in[s, i, j] = [0.0, 0.0]
        grid_m_in[s, i, j] = 0.0
        grid_v_out[s, i, j] = [0.0, 0.0]


@ti.kernel
def compute_actuation(s: ti.i32):
    for k in range(n_actuators):
        a = 0.0
        for j in ti.static(range(n_sin_waves)):
            a += weights[k, j] * ti.sin(omega * s * dt + 2 * math.pi / n_sin_waves * j)
        a += bias[k]
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
        act = actuation[s, actuator_id[p]] * act_strength
        A = ti.Matrix([[0.0, 0.0], [0.0, 1.0]]) * act
        cauchy = mu * (new_F @ new_F.transpose() - ti.Matrix.identity(ti.f32, 2)) + \
            ti.Matrix.identity(ti.f32, 2) * la * J * (J - 1)
        cauchy += new_F @ A @ new_F.transpose()
        stress = -(dt * p_vol * 4 * inv_dx * inv_dx) * cauchy
        affine = stress + p_mass * C[s, p]
        for i, j in ti.static(ti.ndrange(3, 3)):
            offset = ti.Vector([i, j])
            dpos = (ti.cast(offset, ti.f32) - fx) * dx
            weight = w[i][0] * w[j][1]
            grid_v_in[s, base + offset] += weight * (p_mass * v[s, p] + affine @ dpos)
            grid_m_in[s, base + offset] += weight * p_mass


@ti.kernel
def grid_op(s: ti.i32):
    for i, j in ti.ndrange(n_grid, n_grid):
        m = grid_m_in[s, i, j]
        v_out = ti.Vector([0.0, 0.0])
        if m > 0:
            v_out = grid_v_in[s, i, j] / m
            v_out[1] -= dt * gravity
            if i < bound and v_out[0] < 0:
                v_out[0] = 0.0
            if i > n_grid - bound and v_out[0] > 0:
                v_out[0] = 0.0
            if j < bound and v_out[1] < 0:
                v_out[0] = 0.0
                v_out[1] = 0.0
            if j > n_grid - bound and v_out[1] > 0:
                v_out[1] = 0.0
        grid_v_out[s, i, j] = v_out


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
        weights[k, j] -= learning_rate * weights.grad[k, j]
    for k in bias:
        bias[k] -= learning_rate * bias.grad[k]


def init_state():
    for p in range(n_particles):
        i, j = p % nx, p // nx
        x[0, p] = [0.2 + (i + 0.5) * 0.0125, 0.1 + (j + 0.5) * 0.0125]
        v[0, p] = [0.0, 0.0]
        F[0, p] = [[1.0, 0.0], [0.0, 1.0]]
        C[0, p] = [[0.0, 0.0], [0.0, 0.0]]
        actuator_id[p] = (i * 2) // nx + 2 * ((j * 2) // ny)


def forward():
    for s in range(steps - 1):
        compute_actuation(s)
        p2g(s)
        grid_op(s)
        g2p(s)
    compute_x_avg()
    compute_loss()


def run():
    for k in range(n_actuators):
        for j in range(n_sin_waves):
            weights[k, j] = 0.3 * math.sin(1.7 * k + 0.9 * j + 0.4)
        bias[k] = 0.1 * (k - 1.5)
    init_state()
    losses = []
    grads = []
    for _ in range(iterations):
        clear_grid()
        x_avg[None] = [0.0, 0.0]
        with ti.ad.Tape(loss=loss):
            forward()
        losses.append(loss[None])
        grads.append(weights.grad.to_numpy())
        descend()
    return {"loss_history": losses, "weights_grad_history": grads,
            "weights": weights.to_numpy(), "bias": bias.to_numpy(),
            "bias_grad": bias.grad.to_numpy(), "v0_grad": v.grad.to_numpy()[0],
            "x0_grad": x.grad.to_numpy()[0], "x_final": x.to_numpy()[steps - 1]}
