"""``ti.ad.grad_replaced`` / ``ti.ad.grad_for``: custom gradients of
Python functions that launch kernels (docs/from-taichi.md, "Custom
gradients").

As in Taichi, a call of a ``grad_replaced`` function inside ``ti.ad.Tape``
is recorded as one step, the kernels it launches are not recorded (and not
held to the differentiation rules), and the backward sweep calls its
``grad_for`` function with the same arguments at that step, in reverse
order with the kernels recorded around it. The server's tape launches
adjoints only, so a tape that may meet such a call is recorded by the
front end instead (``FrontTape``): each kernel launch's adjoint is made
before it is recorded (a refusal is raised at once, at the user's line),
and at the end the front end sets ``loss.grad`` to 1 and launches the
adjoints newest first, calling each backward function in its place. The
gradients are those of the server's tape: Taichi's ``Tape`` clears them
when it is entered, and so does this one.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, List, Optional, Tuple

from fusebox.taichi._errors import TaichiSyntaxError

#: the grad_replaced functions alive in this process: while there are any,
#: a ti.ad.Tape is recorded by the front end (FrontTape)
defined: "weakref.WeakSet[GradReplaced]" = weakref.WeakSet()


class GradReplaced:
    """A function decorated with ``@ti.ad.grad_replaced``."""

    def __init__(self, fn: Callable[..., Any], obj: Any = None):
        from fusebox.taichi._runtime import Kernel
        if isinstance(fn, (staticmethod, classmethod)):
            raise TaichiSyntaxError(
                "@ti.ad.grad_replaced on a staticmethod or classmethod is not supported by "
                "fusebox.taichi: decorate a plain function or a method")
        if not callable(fn):
            raise TaichiSyntaxError(
                f"@ti.ad.grad_replaced takes a function, not {type(fn).__name__}")
        self.fn = fn
        self.obj = obj
        self.is_kernel = isinstance(fn, Kernel)
        self.backward: Optional[Callable[..., Any]] = None
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        defined.add(self)

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self
        b = GradReplaced.__new__(GradReplaced)
        b.__dict__.update(self.__dict__)
        b.obj = obj
        b._owner = self
        defined.add(b)
        return b

    def _root(self) -> "GradReplaced":
        return getattr(self, "_owner", self)

    def _args(self, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return (self.obj,) + args if self.obj is not None else args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from fusebox.taichi._runtime import rt
        r = rt()
        front = getattr(r.tape, "_front", None)
        if r.tape is None or (front is not None and front._inside):
            return self.fn(*self._args(args), **kwargs)
        name = getattr(self.fn, "__name__", "?")
        if front is None:
            raise TaichiSyntaxError(
                f"ti.ad.grad_replaced function '{name}' was defined after this ti.ad.Tape "
                "began: define grad_replaced functions before entering the tape")
        if self._root().backward is None:
            raise TaichiSyntaxError(
                f"ti.ad.grad_replaced function '{name}' is called inside ti.ad.Tape, but no "
                f"@ti.ad.grad_for({name}) function gives its gradient: define one")
        front._inside += 1
        try:
            out = self.fn(*self._args(args), **kwargs)
        finally:
            front._inside -= 1
        front._steps.append(("replaced", self._root().backward, self._args(args), kwargs))
        return out

    @property
    def grad(self) -> Callable[..., Any]:
        """``f.grad(args)``: its grad_for function, as Taichi gives it."""
        b = self._root().backward
        if b is None:
            raise TaichiSyntaxError(f"no @ti.ad.grad_for({getattr(self.fn, '__name__', '?')}) "
                                    "function is defined")
        return lambda *a, **kw: b(*self._args(a), **kw)


def grad_replaced(fn: Any) -> GradReplaced:
    """``@ti.ad.grad_replaced``: fn's gradient is given by a grad_for function."""
    return GradReplaced(fn)


def grad_for(primal: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@ti.ad.grad_for(primal)``: the decorated function is primal's gradient,
    called with primal's arguments in the backward sweep."""
    if not isinstance(primal, GradReplaced):
        raise TaichiSyntaxError(
            f"ti.ad.grad_for({getattr(primal, '__name__', type(primal).__name__)}): its "
            "argument must be a function decorated with @ti.ad.grad_replaced")
    root = primal._root()

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise TaichiSyntaxError(f"@ti.ad.grad_for takes a function, not {type(fn).__name__}")
        if root.backward is not None:
            raise TaichiSyntaxError(
                f"@ti.ad.grad_for({getattr(root.fn, '__name__', '?')}) is defined twice: a "
                "function has one gradient")
        root.backward = fn
        return fn
    return deco


class FrontTape:
    """The recording half of ti.ad.Tape while grad_replaced functions exist:
    the steps (kernel launches, grad_replaced calls) in order."""

    def __init__(self) -> None:
        self._steps: List[Tuple[Any, ...]] = []
        self._inside = 0

    def on_launch(self, kernel: Any, r: Any, inst: List[Any], values: List[Any]) -> None:
        if self._inside:
            return  # a grad_replaced function's kernels: its backward stands for them
        kernel._adjoint(r, inst)  # refused before it is recorded
        self._steps.append(("kernel", kernel, inst, values))

    def backward(self, r: Any, loss: Any) -> None:
        """loss.grad = 1, then the steps' adjoints newest first."""
        loss.grad.fill(1)
        for step in reversed(self._steps):
            if step[0] == "kernel":
                _, kernel, inst, values = step
                r.launch(kernel._adjoint(r, inst), values)
            else:
                _, back, args, kwargs = step
                back(*args, **kwargs)
        self._steps = []

