"""fusebox.taichi: Taichi-style programs on fuseboxd by changing one import.

    import fusebox.taichi as ti

    ti.init(arch=ti.gpu)                      # FUSEBOX_SERVER, or a private fuseboxd
    x = ti.field(ti.f32, shape=(64, 64))

    @ti.kernel
    def fill(k: ti.f32):
        for i, j in x:
            x[i, j] = k * i + j

    fill(0.5)
    print(x.to_numpy().sum())

Kernels are translated on the client (Python's ast) into ``.fbk`` source
that the server checks like any client's; see docs/from-taichi.md for
what is supported and what to write instead of the rest. No Taichi
package is needed.
"""
from __future__ import annotations

from typing import Any

from fusebox.taichi import _customgrad, _ops, _runtime, _types
from fusebox.taichi._errors import (TaichiCompilationError, TaichiRuntimeError,
                                    TaichiSyntaxError, TaichiTypeError)
from fusebox.taichi._fields import (Axes, Field, SNode, axes, i, ij, ijk, ijkl, ik, j, jk,
                                    k, l)
from fusebox.taichi._ops import (Matrix, Vector, abs, acos, activate, append, asin, atan,
                                 atan2, atomic_add, atomic_and, atomic_max, atomic_min,
                                 atomic_or, atomic_sub, atomic_xor, block_local, cast, ceil,
                                 cos, deactivate, exp, floor, grouped, is_active, log,
                                 loop_config, max, min, ndrange, no_activate, one,
                                 polar_decompose, pow, randn, random, rescale_index, round,
                                 rsqrt, select, sin, sqrt, static, static_assert, static_print,
                                 svd, tan, tanh, zero)
from fusebox.taichi._ops import length_of as length
from fusebox.taichi._runtime import (Kernel, amdgpu, arm64, cpu, cuda, dx11, dx12, gles, gpu,
                                     init, metal, opengl, reset, sync, vulkan, x64)
from fusebox.taichi._translate import Func
from fusebox.taichi._types import (f32, f64, float32, float64, i8, i16, i32, i64, int8, int16,
                                   int32, int64, template, types, u1, u8, u16, u32, u64, uint8,
                                   uint16, uint32, uint64)

atan2 = atan2
FieldsBuilder = None


def kernel(fn: Any) -> Kernel:
    """@ti.kernel: translated to .fbk and run on fuseboxd when called."""
    return Kernel(fn)


def func(fn: Any) -> Func:
    """@ti.func: a helper inlined into the kernels that call it."""
    return Func(fn)


def deactivate_all_snodes() -> None:
    """Deactivate every cell of every sparse SNode."""
    from fusebox.taichi import _runtime
    _runtime.rt().root.deactivate_all()


def data_oriented(cls: Any) -> Any:
    """@ti.data_oriented: kernels and funcs that are methods take self as
    a compile-time argument (its fields and numbers are read when the
    kernel is compiled, once per object)."""
    return cls


def field(dtype: Any, shape: Any = None, name: str = "", offset: Any = None,
          needs_grad: bool = False, needs_dual: bool = False, order: Any = None,
          layout: Any = None) -> Field:
    """ti.field(dtype, shape=...): with shape, a dense block of its own;
    without, place it later with ti.root....place(x); shape=() is 0-D."""
    from fusebox.taichi import _runtime
    return _runtime.rt().make_field(dtype, (), shape, name, needs_grad, {"offset": offset},
                                    needs_dual)


from fusebox.taichi import math  # noqa: E402  (ti.math; also importable as taichi.math)



class _Ad:
    """ti.ad: the tape and gradient helpers (docs/from-taichi.md)."""
    Tape = _runtime.Tape
    FwdMode = _runtime.FwdMode
    grad_replaced = staticmethod(_customgrad.grad_replaced)
    grad_for = staticmethod(_customgrad.grad_for)

    @staticmethod
    def clear_all_gradients(gradient_type: Any = None) -> None:
        _runtime.clear_all_gradients()


ad = _Ad()
Tape = _runtime.Tape
clear_all_gradients = _runtime.clear_all_gradients


class _Profiler:
    """ti.profiler: Fusebox has no kernel profiler in this module; its calls
    do nothing (the session's counters are fusebox.Session.counters())."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


profiler = _Profiler()


class Layout:
    AOS = "aos"
    SOA = "soa"


try:  # the headless GUI stand-in (another module of the package)
    from fusebox.taichi._gui import GUI  # type: ignore
except ImportError:
    class GUI:  # type: ignore[no-redef]
        """Placeholder: the headless GUI is not installed in this build."""

        def __init__(self, *a: Any, **kw: Any):
            raise TaichiRuntimeError("ti.GUI: the headless GUI stand-in "
                                     "(fusebox/taichi/_gui.py) is not part of this build")

from fusebox.taichi import _ui as ui  # noqa: E402  (ti.ui: the headless GGUI stand-in)


class _Lib:
    """ti._lib.core.with_vulkan() / with_cuda() ...: which of Taichi's
    backends this build has (programs pick ti.init's arch with them);
    fusebox.taichi has none of them, fuseboxd chooses the backend."""

    class core:  # noqa: N801
        @staticmethod
        def with_vulkan() -> bool:
            return False

        @staticmethod
        def with_cuda() -> bool:
            return False

        @staticmethod
        def with_metal() -> bool:
            return False

        @staticmethod
        def with_opengl() -> bool:
            return False


_lib = _Lib()

try:
    from fusebox.taichi import tools  # type: ignore
except ImportError:
    class _NoTools:
        def __getattr__(self, name: str) -> Any:
            raise TaichiRuntimeError(f"ti.tools.{name}: fusebox/taichi/tools.py is not part "
                                     "of this build")
    tools = _NoTools()  # type: ignore


def __getattr__(name: str) -> Any:
    if name == "root":
        from fusebox.taichi import _runtime
        return _runtime.rt().root
    raise AttributeError(f"fusebox.taichi has no attribute '{name}' (see docs/from-taichi.md "
                         "for what is supported)")
