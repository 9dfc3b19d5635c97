"""A differentiable mass-spring robot in the style of DiffTaichi's
mass_spring: masses joined by springs, some of them muscles whose rest
length a small controller sets (sine waves and the masses' offsets from
the centre -> tanh hidden layer -> tanh actuation), semi-implicit Euler
with a sticky ground, per-step state x[t, i], v[t, i]; loss = minus the
distance the centre travelled; ti.ad.Tape gives the gradient w.r.t. both
layers' weights and biases; three steps of gradient descent.

Tolerance: the spring forces are summed with float atomics in an order
that differs between engines, so f32 values differ in their last bits and
the difference grows over 60 steps and three iterations: RTOL 2e-3 and
ATOL 1e-8 (the gradients are 1e-5 to 1e-1)."""
import math

import taichi as ti

ti.init(arch=ti.cpu)

NEEDS_AD = True
RTOL = 2e-3
ATOL = 1e-8

steps = 60
dt = 0.004
gravity = -4.8
stiffness = 1000.0
damping = 15.0
ground = 0.1
n_sin_waves = 4
spring_omega = 10.0
act_scale = 0.2
learning_rate = 100.0
iterations = 3

# a 4 x 2 lattice of masses, springs to the right, up and along both diagonals
cols, rows, spacing = 4, 2, 0.05
n_objects = cols * rows
spring_list = []
for r in range(rows):
    for c in range(cols):
        i = r * cols + c
        if c + 1 < cols:
            spring_list.append((i, i + 1, 1.0 if r == 0 else 0.0))
        if r + 1 < rows:
            spring_list.append((i, i + cols, 0.0))
        if c + 1 < cols and r + 1 < rows:
            spring_list.append((i, i + cols + 1, 1.0))
            spring_list.append((i + 1, i + cols, 1.0))
n_springs = len(spring_list)
n_input = n_sin_waves + 2 * n_objects
n_hidden = 8

x = ti.Vector.field(2, ti.f32, shape=(steps, n_objects), needs_grad=True)
v = ti.Vector.field(2, ti.f32, shape=(steps, n_objects), needs_grad=True)
v_inc = ti.Vector.field(2, ti.f32, shape=(steps, n_objects), needs_grad=True)
center = ti.Vector.field(2, ti.f32, shape=steps, needs_grad=True)
hidden = ti.field(ti.f32, shape=(steps, n_hidden), needs_grad=True)
act = ti.field(ti.f32, shape=(steps, n_springs), needs_grad=True)
weights1 = ti.field(ti.f32, shape=(n_hidden, n_input), needs_grad=True)
bias1 = ti.field(ti.f32, shape=n_hidden, needs_grad=True)
weights2 = ti.field(ti.f32, shape=(n_springs, n_hidden), needs_grad=True)
bias2 = ti.field(ti.f32, shape=n_springs, needs_grad=True)
spring_a = ti.field(ti.i32, shape=n_springs)
spring_b = ti.field(ti.i32, shape=n_springs)
rest_length = ti.field(ti.f32, shape=n_springs)
muscle = ti.field(ti.f32, shape=n_springs)
loss = ti.field(ti.f32, shape=(), needs_grad=True)


@ti.kernel
def compute_center(t: ti.i32):
    for i in range(n_objects):
        center[t] += x[t, i] * (1.0 / n_objects)


@ti.kernel
def nn1(t: ti.i32):
    for i in range(n_hidden):
        a = 0.0
        for j in ti.static(range(n_sin_waves)):
            a += weights1[i, j] * ti.sin(spring_omega * t * dt + 2 * math.pi / n_sin_waves * j)
        for j in ti.static(range(n_objects)):
            offset = x[t, j] - center[t]
            a += weights1[i, n_sin_waves + 2 * j] * offset[0] * 5.0
            a += weights1[i, n_sin_waves + 2 * j + 1] * offset[1] * 5.0
        a += bias1[i]
        hidden[t, i] = ti.tanh(a)


@ti.kernel
def nn2(t: ti.i32):
    for i in range(n_springs):
        a = 0.0
        for j in ti.static(range(n_hidden)):
            a += weights2[i, j] * hidden[t, j]
        a += bias2[i]
        act[t, i] = ti.tanh(a)


@ti.kernel
def apply_spring_force(t: ti.i32):
    for i in range(n_springs):
        a = spring_a[i]
        b = spring_b[i]
        d = x[t, a] - x[t, b]
        length = d.norm() + 1e-4
        target = rest_length[i] * (1.0 + act[t, i] * act_scale * muscle[i])
        impulse = dt * (length - target) * stiffness / length * d
        v_inc[t, a] += -impulse
        v_inc[t, b] += impulse


@ti.kernel
def advance(t: ti.i32):
    for i in range(n_objects):
        s = ti.exp(-dt * damping)
        new_v = s * v[t - 1, i] + dt * gravity * ti.Vector([0.0, 1.0]) + v_inc[t - 1, i]
        old_x = x[t - 1, i]
        if old_x[1] + dt * new_v[1] < ground and new_v[1] < 0:
            new_v = ti.Vector([0.0, 0.0])
        v[t, i] = new_v
        x[t, i] = old_x + dt * new_v


@ti.kernel
def compute_loss():
    loss[None] = -(center[steps - 1][0] - center[0][0])


@ti.kernel
def descend():
    for i, j in weights1:
        weights1[i, j] -= learning_rate * weights1.grad[i, j]
    for i in bias1:
        bias1[i] -= learning_rate * bias1.grad[i]
    for i, j in weights2:
        weights2[i, j] -= learning_rate * weights2.grad[i, j]
    for i in bias2:
        bias2[i] -= learning_rate * bias2.grad[i]


def forward():
    for t in range(1, steps):
        compute_center(t - 1)
        nn1(t - 1)
        nn2(t - 1)
        apply_spring_force(t - 1)
        advance(t)
    compute_center(steps - 1)
    compute_loss()


def run():
    for k, (a, b, m) in enumerate(spring_list):
        spring_a[k] = a
        spring_b[k] = b
        muscle[k] = m
        dxy = [((b % cols) - (a % cols)) * spacing, ((b // cols) - (a // cols)) * spacing]
        rest_length[k] = math.sqrt(dxy[0] ** 2 + dxy[1] ** 2)
    for i in range(n_hidden):
        for j in range(n_input):
            weights1[i, j] = 0.4 * math.sin(0.7 * i + 1.3 * j + 0.2) / math.sqrt(n_input)
        bias1[i] = 0.0
    for i in range(n_springs):
        for j in range(n_hidden):
            weights2[i, j] = 0.5 * math.cos(1.1 * i + 0.6 * j) / math.sqrt(n_hidden)
        bias2[i] = 0.0
    for i in range(n_objects):
        x[0, i] = [0.3 + (i % cols) * spacing, ground + 0.01 + (i // cols) * spacing]
        v[0, i] = [0.0, 0.0]
    losses = []
    grads = []
    for _ in range(iterations):
        center.fill(0.0)
        v_inc.fill(0.0)
        with ti.ad.Tape(loss=loss):
            forward()
        losses.append(loss[None])
        grads.append(weights2.grad.to_numpy())
        descend()
    return {"loss_history": losses, "weights2_grad_history": grads,
            "weights1_grad": weights1.grad.to_numpy(), "bias1_grad": bias1.grad.to_numpy(),
            "bias2_grad": bias2.grad.to_numpy(), "weights1": weights1.to_numpy(),
            "x0_grad": x.grad.to_numpy()[0], "x_final": x.to_numpy()[steps - 1]}
