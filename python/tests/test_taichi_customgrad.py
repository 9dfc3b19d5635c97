"""fusebox.taichi: custom gradients, ``@ti.ad.grad_replaced`` and
``@ti.ad.grad_for`` (docs/from-taichi.md, "Custom gradients"), on a real
fuseboxd. Inside ``ti.ad.Tape`` a grad_replaced call is one step whose
backward is its grad_for function, called in reverse order with the
kernels recorded around it; its own kernels are neither recorded nor held
to the differentiation rules. The backward functions differ on purpose
from the true derivative of what the forward functions launch (the
forward launches a kernel twice, the backward its adjoint once, as in
Taichi's own test), so a generated adjoint in their place fails the
tests; where the backward is the true derivative (an in-place square the
pass refuses), the gradient is checked against finite differences."""
import os

import numpy as np
import pytest

import fusebox
import fusebox.taichi as ti
from conftest import FUSEBOXD

N = 16


@pytest.fixture(scope="module")
def client():
    if not os.access(FUSEBOXD, os.X_OK):
        pytest.fail(f"no fuseboxd at {FUSEBOXD}: build first")
    c = fusebox.connect(fuseboxd=FUSEBOXD)
    yield c
    c.close()


@pytest.fixture
def tinit(client):
    ti.init(server=client)
    yield
    ti.reset()


def test_grad_replaced_in_a_tape(tinit):
    x = ti.field(ti.f64, shape=N, needs_grad=True)
    total = ti.field(ti.f64, shape=(), needs_grad=True)

    @ti.kernel
    def func(mul: ti.f64):
        for i in range(N):
            total[None] += x[i] * mul

    @ti.ad.grad_replaced
    def forward(mul):
        func(mul)
        func(mul)

    @ti.ad.grad_for(forward)
    def backward(mul):
        func.grad(mul)

    x.from_numpy(np.arange(N, dtype=np.float64))
    with ti.ad.Tape(loss=total):
        forward(4.0)
    assert total[None] == 8.0 * np.arange(N).sum()  # the forward ran: twice
    np.testing.assert_array_equal(x.grad.to_numpy(), np.full(N, 4.0))  # its backward: once
    # called by hand outside a tape: forward.grad is the backward function
    x.grad.fill(0)
    total.grad.fill(1.0)
    forward.grad(2.0)
    np.testing.assert_array_equal(x.grad.to_numpy(), np.full(N, 2.0))


def test_rule_breaking_kernel_between_recorded_kernels(tinit):
    x = ti.field(ti.f64, shape=N, needs_grad=True)
    y = ti.field(ti.f64, shape=N, needs_grad=True)
    loss = ti.field(ti.f64, shape=(), needs_grad=True)

    @ti.kernel
    def scale(a: ti.f64):
        for i in x:
            y[i] = x[i] * a

    @ti.kernel
    def square_in_place():
        for i in y:
            y[i] = y[i] * y[i]  # read and overwritten: the pass refuses it

    @ti.kernel
    def square_in_place_adj():
        for i in y:
            y.grad[i] = y.grad[i] * 2.0 * ti.sqrt(y[i])

    @ti.kernel
    def total():
        for i in y:
            loss[None] += y[i]

    @ti.ad.grad_replaced
    def square():
        square_in_place()

    @ti.ad.grad_for(square)
    def square_grad():
        square_in_place_adj()

    with pytest.raises(ti.TaichiCompilationError):
        square_in_place.grad()  # what the custom gradient escapes

    x0 = 0.3 + 0.1 * np.arange(N)

    def run(xv):
        x.from_numpy(xv)
        with ti.ad.Tape(loss=loss):
            scale(1.5)
            square()
            total()
        return loss[None], x.grad.to_numpy()

    val, g = run(x0)
    np.testing.assert_allclose(g, 2 * 1.5 ** 2 * x0, rtol=1e-12)
    h = 1e-6
    for i in (0, 9, 15):
        e = np.eye(N)[i] * h
        fd = (run(x0 + e)[0] - run(x0 - e)[0]) / (2 * h)
        assert abs(fd - g[i]) <= 1e-6 * abs(fd)


def test_plain_tape_unchanged_while_grad_replaced_exist(tinit):
    x = ti.field(ti.f64, shape=N, needs_grad=True)
    loss = ti.field(ti.f64, shape=(), needs_grad=True)

    @ti.kernel
    def energy():
        for i in x:
            loss[None] += ti.sin(x[i]) * x[i]

    @ti.ad.grad_replaced
    def unused():
        energy()

    x0 = np.linspace(0.1, 1.5, N)
    x.from_numpy(x0)
    x.grad.from_numpy(np.full(N, 9.0))  # stale: the tape clears it
    with ti.ad.Tape(loss=loss):
        energy()
    np.testing.assert_allclose(x.grad.to_numpy(), np.cos(x0) * x0 + np.sin(x0), rtol=1e-12)
    assert unused is not None


def test_custom_gradient_errors(tinit):
    x = ti.field(ti.f64, shape=N, needs_grad=True)
    loss = ti.field(ti.f64, shape=(), needs_grad=True)

    @ti.kernel
    def k():
        for i in x:
            loss[None] += x[i]

    def plain():
        k()

    with pytest.raises(ti.TaichiSyntaxError, match="must be a function decorated with "
                                                   "@ti.ad.grad_replaced"):
        ti.ad.grad_for(plain)

    @ti.ad.grad_replaced
    def nobackward():
        k()

    with pytest.raises(ti.TaichiSyntaxError, match="no @ti.ad.grad_for\\(nobackward\\)"):
        with ti.ad.Tape(loss=loss):
            nobackward()

    @ti.ad.grad_replaced
    def once():
        k()

    @ti.ad.grad_for(once)
    def once_grad():
        k.grad()

    with pytest.raises(ti.TaichiSyntaxError, match="defined twice"):
        @ti.ad.grad_for(once)
        def again():
            pass
    with pytest.raises(ti.TaichiSyntaxError, match="takes a function"):
        ti.ad.grad_replaced(3)
    # the runtime goes on: a tape through the custom gradient works
    x.from_numpy(np.ones(N))
    with ti.ad.Tape(loss=loss):
        once()
    np.testing.assert_array_equal(x.grad.to_numpy(), np.ones(N))
