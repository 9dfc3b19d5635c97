"""The ti.* functions (math, vectors, atomics, sparse builtins, ti.static,
ti.ndrange, ...) and how each is translated inside a kernel. In Python
scope the math functions work on numbers and NumPy arrays."""
from __future__ import annotations

import ast
import builtins
import math as _m
import warnings
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from fusebox.taichi import _types
from fusebox.taichi._translate import (BoundFunc, Func, Grouped, NDRange, Static, Translator,
                                       fmt_float)

# ------------------------------------------------------------------ registry
# id(python object) -> translation: a .fbk builtin name (its arguments
# passed through) or a function (translator, call node, args) -> text
_T: Dict[int, Any] = {}


def _reg(fbk: Any) -> Callable[[Any], Any]:
    def deco(f: Any) -> Any:
        _T[id(f)] = fbk
        return f
    return deco


def _np1(name: str, npf: Any) -> Any:
    @_reg(name)
    def f(x: Any) -> Any:
        return npf(x)
    f.__name__ = name
    return f


sqrt = _np1("sqrt", np.sqrt)
sin = _np1("sin", np.sin)
cos = _np1("cos", np.cos)
tan = _np1("tan", np.tan)
asin = _np1("asin", np.arcsin)
acos = _np1("acos", np.arccos)
atan = _np1("atan", np.arctan)
exp = _np1("exp", np.exp)
log = _np1("log", np.log)
tanh_np = np.tanh


@_reg("rsqrt")
def rsqrt(x: Any) -> Any:
    return 1.0 / np.sqrt(x)


@_reg("atan2")
def atan2(y: Any, x: Any) -> Any:
    return np.arctan2(y, x)


@_reg("pow")
def pow(x: Any, y: Any) -> Any:  # noqa: A001
    return np.power(x, y)


@_reg("abs")
def abs(x: Any) -> Any:  # noqa: A001
    return np.abs(x)


@_reg("min")
def min(*a: Any) -> Any:  # noqa: A001
    return builtins.min(a) if builtins.all(np.isscalar(x) for x in a) else np.minimum(*a)


@_reg("max")
def max(*a: Any) -> Any:  # noqa: A001
    return builtins.max(a) if builtins.all(np.isscalar(x) for x in a) else np.maximum(*a)


@_reg("clamp")
def clamp(x: Any, lo: Any, hi: Any) -> Any:
    return np.clip(x, lo, hi)


@_reg("select")
def select(c: Any, a: Any, b: Any) -> Any:
    return np.where(c, a, b)


def _rounding(name: str, npf: Any) -> Any:
    def tr(t: Translator, n: Any, a: List[str], kw: Dict[str, Any]) -> str:
        dt = kw.get("dtype", a[1] if len(a) > 1 else None)
        s = f"{name}({a[0]})"
        return s if dt is None else f"{_tname(t, dt, n)}({s})"

    def f(x: Any, dtype: Any = None) -> Any:
        r = npf(x)
        return r if dtype is None else np.asarray(r).astype(_types.resolve(dtype).np)
    f.__name__ = name
    _T[id(f)] = ("raw", tr)
    return f


floor = _rounding("floor", np.floor)
ceil = _rounding("ceil", np.ceil)
round = _rounding("round", np.round)  # noqa: A001


@_reg(("expr", lambda t, n, a, kw: f"((exp({a[0]}) - exp(-({a[0]}))) / (exp({a[0]}) + "
                                    f"exp(-({a[0]}))))"))
def tanh(x: Any) -> Any:
    return np.tanh(x)


@_reg(("expr", lambda t, n, a, kw: f"(log({a[0]}) / log(2.0))"))
def log2(x: Any) -> Any:
    return np.log2(x)


@_reg(("expr", lambda t, n, a, kw: f"({a[0]} - floor({a[0]}))"))
def fract(x: Any) -> Any:
    return x - np.floor(x)


@_reg(("expr", lambda t, n, a, kw: f"({a[0]} * (1.0 - {a[2]}) + {a[1]} * {a[2]})"))
def mix(x: Any, y: Any, a: Any) -> Any:
    return x * (1 - a) + y * a


@_reg(("expr", lambda t, n, a, kw: f"select({a[0]} > 0, 1.0, select({a[0]} < 0, -1.0, 0.0))"))
def sign(x: Any) -> Any:
    return np.sign(x)


@_reg(("expr", lambda t, n, a, kw: f"select({a[1]} < {a[0]}, 0.0, 1.0)"))
def step(edge: Any, x: Any) -> Any:
    return np.where(x < edge, 0.0, 1.0)


@_reg(("expr", lambda t, n, a, kw: f"norm(({a[0]}) - ({a[1]}))"))
def distance(a: Any, b: Any) -> Any:
    return np.linalg.norm(np.asarray(a) - np.asarray(b))


@_reg(("expr", lambda t, n, a, kw: f"(({a[0]}) - 2.0 * dot({a[0]}, {a[1]}) * ({a[1]}))"))
def reflect(x: Any, nrm: Any) -> Any:
    return x - 2 * np.dot(x, nrm) * nrm


@_reg(("expr", lambda t, n, a, kw: f"clamp((({a[2]}) - ({a[0]})) / (({a[1]}) - ({a[0]})), 0.0, "
                                    f"1.0) * clamp((({a[2]}) - ({a[0]})) / (({a[1]}) - "
                                    f"({a[0]})), 0.0, 1.0) * (3.0 - 2.0 * clamp((({a[2]}) - "
                                    f"({a[0]})) / (({a[1]}) - ({a[0]})), 0.0, 1.0))"))
def smoothstep(e0: Any, e1: Any, x: Any) -> Any:
    t = np.clip((x - e0) / (e1 - e0), 0, 1)
    return t * t * (3 - 2 * t)


@_reg(("expr", lambda t, n, a, kw: f"[({a[0]}).x * ({a[1]}).x - ({a[0]}).y * ({a[1]}).y, "
                                    f"({a[0]}).x * ({a[1]}).y + ({a[0]}).y * ({a[1]}).x]"))
def cmul(a: Any, b: Any) -> Any:
    return np.array([a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]])


@_reg(("expr", lambda t, n, a, kw: f"(({a[0]}) * 0)"))
def zero(x: Any) -> Any:
    return np.zeros_like(x)


@_reg(("expr", lambda t, n, a, kw: f"(({a[0]}) * 0 + 1)"))
def one(x: Any) -> Any:
    return np.ones_like(x)


@_reg(("expr", lambda t, n, a, kw: f"[[cos({a[0]}), -sin({a[0]})], [sin({a[0]}), cos({a[0]})]]"))
def rotation2d(ang: Any) -> Any:
    return np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]])


dot = _reg("dot")(lambda a, b: np.dot(a, b))
cross = _reg("cross")(lambda a, b: np.cross(a, b))
length = _reg("norm")(lambda v: np.linalg.norm(v))
normalize = _reg("normalized")(lambda v: np.asarray(v) / np.linalg.norm(v))
determinant = _reg("determinant")(lambda m: np.linalg.det(m))
inverse = _reg("inverse")(lambda m: np.linalg.inv(m))
transpose = _reg("transpose")(lambda m: np.transpose(m))


@_reg(("expr", lambda t, n, a, kw: "(sqrt(-2.0 * log(max(1.0 - random(), 1e-30))) * "
                                    "cos(6.283185307179586 * random()))"))
def randn(dtype: Any = None) -> Any:
    return np.random.standard_normal()


@_reg("random")
def random(dtype: Any = None) -> Any:
    return np.random.random()


# ------------------------------------------------------------------ compile-time helpers
def static(x: Any, *more: Any) -> Any:
    """ti.static(x): x is known when the kernel is compiled."""
    return x if not more else (x,) + more


def ndrange(*dims: Any) -> NDRange:
    return NDRange(*dims)


def grouped(x: Any) -> Grouped:
    return Grouped(x)


def static_print(*a: Any) -> None:
    print(*a)


def static_assert(cond: Any, msg: str = "") -> None:
    assert cond, msg


def loop_config(**kw: Any) -> None:
    """Loop hints (block_dim, serialize, ...) are accepted and ignored."""


def block_local(*a: Any) -> None:
    pass


def no_activate(*a: Any) -> None:
    pass


# ------------------------------------------------------------------ atomics
def _atomic(op: str, name: str) -> Any:
    def f(x: Any, y: Any) -> Any:
        raise _scope_error(f"ti.atomic_{name}")
    f.__name__ = "atomic_" + name
    _T[id(f)] = ("atomic", op)
    return f


def _scope_error(name: str) -> Exception:
    from fusebox.taichi._errors import TaichiSyntaxError
    return TaichiSyntaxError(f"{name} can only be used inside a @ti.kernel or @ti.func")


atomic_add = _atomic("+", "add")
atomic_sub = _atomic("-", "sub")
atomic_min = _atomic("min", "min")
atomic_max = _atomic("max", "max")
atomic_and = _atomic("&", "and")
atomic_or = _atomic("|", "or")
atomic_xor = _atomic("^", "xor")


# ------------------------------------------------------------------ sparse
def _sparse(name: str) -> Any:
    def f(*a: Any) -> Any:
        raise _scope_error(f"ti.{name}")
    f.__name__ = name
    _T[id(f)] = ("sparse", name)
    return f


is_active = _sparse("is_active")
activate = _sparse("activate")
deactivate = _sparse("deactivate")
append = _sparse("append")
length_of = _sparse("length")


def rescale_index(a: Any, b: Any, I: Any) -> Any:  # noqa: E741
    raise _scope_error("ti.rescale_index")


_T[id(rescale_index)] = ("rescale", None)


# ------------------------------------------------------------------ decompositions
def svd(A: Any, dt: Any = None) -> Any:
    u, s, vt = np.linalg.svd(np.asarray(A))
    return u, np.diag(s), vt.T


def polar_decompose(A: Any, dt: Any = None) -> Any:
    u, s, vt = np.linalg.svd(np.asarray(A))
    return u @ vt, vt.T @ np.diag(s) @ vt


_T[id(svd)] = ("decomp", "svd")
_T[id(polar_decompose)] = ("decomp", "polar")


def cast(x: Any, dtype: Any) -> Any:
    return np.asarray(x).astype(_types.resolve(dtype).np)


_T[id(cast)] = ("cast", None)


# ------------------------------------------------------------------ vectors & matrices
class TiArray(np.ndarray):
    """What ti.Vector / ti.Matrix make in Python scope: a NumPy array that
    kernels may capture as a constant (a plain NumPy array may not), with
    .x .y .z .w. An element read from a field (``v[i]``) writes changes of
    its components back to the field (``v[i].x = 1``, ``v[i][0] = 1``)."""
    _owner: Any = None

    def __array_finalize__(self, obj: Any) -> None:
        self._owner = None

    def _wb(self) -> None:
        if self._owner is not None:
            f, key = self._owner
            f[key] = np.asarray(self)

    def __setitem__(self, k: Any, v: Any) -> None:
        super().__setitem__(k, v)
        self._wb()

    def _comp(i: int) -> Any:  # type: ignore[misc]
        def get(self: "TiArray") -> Any:
            return self[i].item() if self.ndim == 1 else self[i]

        def put(self: "TiArray", v: Any) -> None:
            self[i] = v
        return property(get, put)

    x, y, z, w = _comp(0), _comp(1), _comp(2), _comp(3)
    del _comp

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def m(self) -> int:
        return self.shape[1]

    def norm(self) -> Any:
        return float(np.linalg.norm(self))

    def dot(self, o: Any) -> Any:
        return np.dot(np.asarray(self), np.asarray(o))

    def to_numpy(self) -> np.ndarray:
        return np.asarray(self).copy()


def _tiarray(a: Any, dt: Any = None) -> Any:
    return np.array(a, dtype=None if dt is None else _types.resolve(dt).np).view(TiArray)


class Vector:
    """ti.Vector: ``ti.Vector([a, b])`` in kernels, ``ti.Vector.field``."""

    def __new__(cls, arr: Any, dt: Any = None) -> Any:  # Python scope: a NumPy array
        return _tiarray(arr, dt)

    @staticmethod
    def field(n: int, dtype: Any = None, shape: Any = None, name: str = "",
              needs_grad: bool = False, **kw: Any) -> Any:
        from fusebox.taichi import _runtime
        nd = bool(kw.pop("needs_dual", False))
        return _runtime.rt().make_field(dtype, (int(n),), shape, name, needs_grad, kw, nd)

    @staticmethod
    def zero(dt: Any, n: int) -> Any:
        return np.zeros(n, _types.resolve(dt).np)

    @staticmethod
    def one(dt: Any, n: int) -> Any:
        return np.ones(n, _types.resolve(dt).np)

    @staticmethod
    def unit(n: int, i: int, dt: Any = None) -> Any:
        v = np.zeros(n, _types.resolve(int if dt is None else dt).np)
        v[i] = 1
        return v


class Matrix:
    """ti.Matrix: ``ti.Matrix([[a, b], [c, d]])`` in kernels, ``ti.Matrix.field``."""

    def __new__(cls, arr: Any, dt: Any = None) -> Any:
        return _tiarray(arr, dt)

    @staticmethod
    def field(n: int, m: int, dtype: Any = None, shape: Any = None, name: str = "",
              needs_grad: bool = False, **kw: Any) -> Any:
        from fusebox.taichi import _runtime
        nd = bool(kw.pop("needs_dual", False))
        return _runtime.rt().make_field(dtype, (int(n), int(m)), shape, name, needs_grad, kw, nd)

    @staticmethod
    def zero(dt: Any, n: int, m: Optional[int] = None) -> Any:
        return np.zeros((n, m) if m else (n,), _types.resolve(dt).np)

    @staticmethod
    def identity(dt: Any, n: int) -> Any:
        return np.eye(n, dtype=_types.resolve(dt).np)

    @staticmethod
    def rows(rows: Any) -> Any:
        return np.array(rows)

    @staticmethod
    def cols(cols: Any) -> Any:
        return np.array(cols).T

    @staticmethod
    def diag(dim: int, val: Any) -> Any:
        return np.eye(dim) * val


def _vec_ctor(t: Translator, n: Any, a: List[str], kw: Dict[str, Any], rows: bool) -> str:
    arg = n.args[0]
    dt = kw.get("dt")
    if isinstance(arg, (ast.List, ast.Tuple)):
        items = []
        for e in arg.elts:
            if isinstance(e, (ast.List, ast.Tuple)):
                items.append("[" + ", ".join(t.expr_code(x) for x in e.elts) + "]")
            else:
                items.append(t.expr_code(e))
        lit = "[" + ", ".join(items) + "]"
    else:
        v = t.expr(arg)
        lit = t.code(v, arg)
    if dt is not None:
        return f"{_tname(t, dt, n)}({lit})"
    return lit


def _all_any(t: Translator, n: ast.Call, every: bool) -> Any:
    """all(v) / any(v) of a vector of bools (a comparison of vectors); a chained comparison inside (all(lo <= v <= hi)) compares each
    component: (lo <= v) & (v <= hi)."""
    a = n.args[0]
    if isinstance(a, ast.Compare) and len(a.ops) > 1:
        from fusebox.taichi._translate import CMPOPS
        items = [t.expr_code(e) for e in [a.left] + list(a.comparators)]
        parts = []
        for o, x, y in zip(a.ops, items, items[1:]):
            if type(o) not in CMPOPS:
                raise t.unsupported(a, "this comparison", "compare with == != < <= > >=")
            parts.append(f"({x} {CMPOPS[type(o)]} {y})")
        v: Any = "(" + " & ".join(parts) + ")"
    else:
        v = t.expr(a)
        if isinstance(v, Static):
            try:
                return Static(builtins.all(v.v) if every else builtins.any(v.v))
            except TypeError as e:
                raise t.err(n, f"{'all' if every else 'any'}(): {e}")
    ones = f"(i32({v}) * 0 + 1)"
    count = f"dot(i32({v}), {ones})"
    return f"({count} == dot({ones}, {ones}))" if every else f"({count} > 0)"


def _random_int(tn: str) -> str:
    """ti.random(int type): uniform over the type's range, built from 16-bit
    pieces (random() is an f32 with 24 random bits, so one draw scaled
    by 2**32 would leave the low bits zero)."""
    def piece(tt: str) -> str:
        return f"{tt}(random() * 65536.0)"
    if tn == "i32":
        return f"(({piece('i32')} - 32768) * 65536 + {piece('i32')})"
    if tn == "u32":
        return f"u32({piece('i64')} * 65536 + {piece('i64')})"
    hi = f"({piece('i64')} - 32768) * 281474976710656"
    body = f"({hi} + {piece('i64')} * 4294967296 + {piece('i64')} * 65536 + {piece('i64')})"
    return body if tn == "i64" else f"u64({body})"


def _arg_or_type(t: Translator, a: Any) -> Any:
    """An argument's .fbk text, or the Static of a type given as an argument
    (ti.floor(x, ti.i32))."""
    v = t.expr(a)
    if isinstance(v, Static) and isinstance(v.v, (_types.DataType, type)) and not \
            isinstance(v.v, (bool, int, float)):
        try:
            _types.resolve(v.v)
            return v
        except TypeError:
            pass
    return t.code(v, a)


def _tname(t: Translator, dt: Any, node: Any) -> str:
    if isinstance(dt, str):
        raise t.err(node, "the type must be known when the kernel is compiled")
    if isinstance(dt, Static):
        dt = dt.v
    try:
        return _types.resolve(dt).fbk
    except TypeError as e:
        raise t.err(node, str(e))


def _shaped(t: Translator, node: Any, dt: Any, shape: tuple, fill: str) -> str:
    tn = _tname(t, dt, node) + "".join(f"[{s}]" for s in shape)
    return f"{tn}({fill})"


def _matrix_static(t: Translator, f: Any, n: Any, sv: List[Any], kw: Dict[str, Any]) -> str:
    name = f.__name__
    if name == "zero":
        dt, dims = sv[0], [x for x in sv[1:] if x is not None]
        return _shaped(t, n, dt, tuple(dims), "0")
    if name == "one":
        return _shaped(t, n, sv[0], (sv[1],), "1")
    if name == "unit":
        nn, i = sv[0], sv[1]
        dt = sv[2] if len(sv) > 2 else kw.get("dt")
        tn = _tname(t, int if dt is None else dt, n) + f"[{nn}]"  # an int vector by default
        return f"{tn}({', '.join('1' if k == i else '0' for k in range(nn))})"
    if name == "identity":
        dt, nn = sv[0], sv[1]
        tn = _tname(t, dt, n) + f"[{nn}][{nn}]"
        return f"{tn}({', '.join('1' if r == c else '0' for r in range(nn) for c in range(nn))})"
    if name == "diag":
        dim, val = sv[0], sv[1]
        vc = val if isinstance(val, str) else t.code(Static(val), n)
        rows = ", ".join("[" + ", ".join(vc if r == c else "0" for c in range(dim)) + "]"
                         for r in range(dim))
        return f"[{rows}]"
    raise t.err(n, f"ti.Matrix.{name} is not supported in kernels")


# ------------------------------------------------------------------ call translation
PY_BUILTIN = {id(builtins.abs): "abs", id(builtins.min): "min", id(builtins.max): "max",
              id(builtins.pow): "pow"}


def call(t: Translator, n: ast.Call, f: Any) -> Any:
    from fusebox.taichi._fields import Field, SNode
    kw = {k.arg: t.expr(k.value) for k in n.keywords if k.arg}
    if any(k.arg is None for k in n.keywords):
        raise t.unsupported(n, "**kwargs in a call", "pass each argument")
    if any(isinstance(a, ast.Starred) for a in n.args):
        if f in (ndrange, builtins.range, grouped, static):
            vals: List[Any] = []
            for a in n.args:
                if isinstance(a, ast.Starred):
                    vals.extend(t.static_eval(a.value, "*args"))
                else:
                    vals.append(t.static_eval(a, "an argument"))
            return Static(static(*vals) if f is static else f(*vals))
        raise t.unsupported(n, "*args in a call", "pass each argument")
    if f is grouped:
        v = t.expr(n.args[0])
        if isinstance(v, Static):
            return Static(Grouped(v.v))
        raise t.unsupported(n, "ti.grouped(...) outside a for loop", "loop over it with for")
    if f is static:
        if len(n.args) == 1:
            return Static(t.static_eval(n.args[0]))
        return Static(tuple(t.static_eval(a) for a in n.args))
    if isinstance(f, Func):
        return _call_func(t, n, f)
    if isinstance(f, BoundFunc):
        return _call_func(t, n, f.func, (f.obj,))
    from fusebox.taichi._runtime import Kernel
    if isinstance(f, Kernel):
        raise t.unsupported(n, f"calling the kernel '{f.fn.__name__}' from a kernel",
                            "make the callee a @ti.func")
    if f in (print, static_print):
        return Static(None)  # (statement: see call_stmt)
    if f in (builtins.all, builtins.any) and len(n.args) == 1 and not n.keywords:
        return _all_any(t, n, f is builtins.all)
    if f is builtins.range:
        vals = [t.expr(a) for a in n.args]
        if all(isinstance(v, Static) for v in vals):
            return Static(range(*[v.v for v in vals]))
        raise t.unsupported(n, "range(...) outside a for loop", "loop over it with for")
    if f is ndrange:
        vals = [t.expr(a) for a in n.args]
        if all(isinstance(v, Static) for v in vals):
            return Static(NDRange(*[v.v for v in vals]))
        raise t.unsupported(n, "ti.ndrange(...) outside a for loop", "loop over it with for")
    if f is builtins.len:
        v = t.static_eval(n.args[0], "len")
        return Static(len(v))
    if f in (builtins.int, builtins.float, builtins.bool) or isinstance(f, _types.DataType):
        a = t.expr(n.args[0])
        if isinstance(a, Static) and t.is_static_num(a):
            return Static(f(a.v) if not isinstance(f, _types.DataType) else f(a.v))
        tn = ("i32" if f is builtins.int else "bool" if f is builtins.bool else
              _types.defaults.fp.fbk if f is builtins.float else f.fbk)
        if f is builtins.int:
            tn = _types.defaults.ip.fbk
        return f"{tn}({t.code(a, n.args[0])})"
    owner = getattr(f, "__self__", None)
    if isinstance(owner, (Field, SNode)) and getattr(f, "__name__", "") in ("parent", "snode_"):
        return Static(f())
    if f in (Vector, Matrix):
        return _vec_ctor(t, n, [], {k: v for k, v in kw.items()}, f is Matrix)
    if isinstance(f, (_types.VectorType, _types.MatrixType)):
        args = [t.expr_code(a) for a in n.args]
        if len(args) == 1 and isinstance(n.args[0], (ast.List, ast.Tuple)):
            return f"{f.fbk()}({args[0]})"
        return f"{f.fbk()}({', '.join(args)})"
    if getattr(f, "__qualname__", "").startswith(("Vector.", "Matrix.")) and \
            f.__name__ in ("zero", "one", "unit", "identity", "diag"):
        sv = [t.static_eval(a, f"ti.Matrix.{f.__name__}") for a in n.args]
        return _matrix_static(t, f, n, sv, {k: v.v if isinstance(v, Static) else v
                                            for k, v in kw.items()})
    if getattr(f, "__qualname__", "") in ("Matrix.rows", "Matrix.cols"):
        arg = n.args[0]
        if not isinstance(arg, (ast.List, ast.Tuple)):
            raise t.err(n, f"{f.__qualname__} needs a list written in the call")
        lit = "[" + ", ".join(t.expr_code(e) for e in arg.elts) + "]"
        return lit if f.__name__ == "rows" else f"transpose({lit})"
    tr = _T.get(id(f)) or PY_BUILTIN.get(id(f))
    if tr is None:
        if isinstance(f, Field):
            raise t.err(n, "a field is indexed with [ ], not called")
        name = getattr(f, "__name__", repr(f))
        raise t.unsupported(n, f"calling '{name}'",
                            "call ti.* functions, @ti.func functions or builtins such as "
                            "min/max/abs/int/float (see docs/from-taichi.md)")
    if isinstance(tr, str):
        if tr == "random":
            dt = kw.get("dtype")
            if n.args:
                dt = Static(t.static_eval(n.args[0]))
            if dt is not None:
                tn = _tname(t, dt, n)
                if tn in ("i32", "i64", "u32", "u64"):
                    return _random_int(tn)
                return f"{tn}(random())"
            return "random()"
        args = [t.expr_code(a) for a in n.args]
        if tr in ("min", "max") and len(args) == 1:
            raise t.unsupported(n, f"{tr}() of one value", f"give {tr}(a, b, ...)")
        return f"{tr}({', '.join(args)})"
    kind, what = tr
    if kind in ("expr", "raw"):
        args = [_arg_or_type(t, a) for a in n.args]
        return what(t, n, args, kw)
    if kind == "atomic":
        # .fbk's atomic_OP(target, value) updates and returns the old value
        if len(n.args) != 2 or kw:
            raise t.unsupported(n, f"ti.{f.__name__} with {len(n.args)} arguments",
                                f"write ti.{f.__name__}(x, v)")
        tgt = t.expr(n.args[0])
        if isinstance(tgt, Static):
            raise t.err(n, f"ti.{f.__name__} needs a field element or variable to update")
        return f"{f.__name__}({tgt}, {t.expr_code(n.args[1])})"
    if kind == "sparse":
        return _sparse_call(t, n, what)
    if kind == "decomp":
        raise t.unsupported(n, f"ti.{f.__name__} used as a single value",
                            f"unpack it: U, S, V = ti.{f.__name__}(M)")
    if kind == "cast":
        dt = t.static_eval(n.args[1], "ti.cast's type")
        if isinstance(dt, (_types.VectorType, _types.MatrixType)):
            return f"{dt.fbk()}({t.expr_code(n.args[0])})"
        return f"{_tname(t, dt, n)}({t.expr_code(n.args[0])})"
    if kind == "rescale":
        from fusebox.taichi._fields import Field, SNode
        a, b = (t.static_eval(x, "ti.rescale_index") for x in n.args[:2])
        if not all(isinstance(x, (Field, SNode)) for x in (a, b)):
            raise t.err(n, "ti.rescale_index(a, b, I) takes two fields or SNodes and an index")
        sa, sb = a.shape, b.shape
        if len(sa) != len(sb) or any(p % q for p, q in zip(sa, sb)):
            raise t.err(n, f"ti.rescale_index: shapes {sa} and {sb} do not nest")
        ratios = [p // q for p, q in zip(sa, sb)]
        idx = _idx(t, n.args[2])
        if len(idx) == len(ratios):
            return "[" + ", ".join(c if r == 1 else f"({c}) // {r}"
                                   for c, r in zip(idx, ratios)) + "]"
        return f"(({idx[0]}) // [{', '.join(str(r) for r in ratios)}])"
    raise t.err(n, "internal: unknown translation")


def _idx(t: Translator, node: Any) -> List[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [t.expr_code(e) for e in node.elts]
    v = t.expr(node)
    if isinstance(v, Static) and isinstance(v.v, (tuple, list)):
        return [t.code(Static(x), node) for x in v.v]
    return [t.code(v, node)]


def _sparse_target(t: Translator, node: Any, for_field: bool) -> str:
    from fusebox.taichi._fields import Field, SNode
    v = t.expr(node)
    if not isinstance(v, Static) or not isinstance(v.v, (Field, SNode)):
        raise t.err(node, "the first argument must be a field or an SNode")
    x = v.v
    if for_field and isinstance(x, SNode):
        fs = x._fields_below()
        if not fs:
            raise t.err(node, "this SNode holds no field")
        return t.code(Static(fs[0]), node)
    return t.code(v, node)


def _sparse_call(t: Translator, n: ast.Call, what: str) -> str:
    if what in ("append", "length"):
        tgt = _sparse_target(t, n.args[0], True)
        idx = _idx(t, n.args[1]) if len(n.args) > 1 else []
        if what == "append":
            return f"append({tgt}, {', '.join(idx + [t.expr_code(n.args[2])])})"
        return f"length({', '.join([tgt] + idx)})"
    tgt = _sparse_target(t, n.args[0], False)
    return f"{what}({', '.join([tgt] + _idx(t, n.args[1]))})"


def call_stmt(t: Translator, n: ast.Call) -> Optional[str]:
    """A call used as a statement: atomics become augmented assignments,
    x.fill(v) a loop over x's cells, print is dropped with a warning.
    None: an ordinary call."""
    from fusebox.taichi._fields import Field
    if isinstance(n.func, ast.Attribute) and n.func.attr == "fill" and len(n.args) == 1:
        try:
            base = t.expr(n.func.value)
        except Exception:
            base = None
        if isinstance(base, Static) and isinstance(base.v, Field):
            fld = base.v
            nm = t.code(base, n.func.value)
            v = t.expr_code(n.args[0])
            val = f"{fld.fbk_type()}({v})" if fld.elem else v
            nd = len(fld.shape)
            if nd == 0:
                return f"{nm}[] = {val}"
            idx = [t.prog.fresh(f"{nm}_i{d}") for d in range(nd)]
            t.emit(f"for {', '.join(idx)} in {nm} {{", n)
            t.emit(f"  {nm}[{', '.join(idx)}] = {val}", n)
            t.emit("}", n)
            return ""
    try:
        fv = t.expr(n.func) if not isinstance(n.func, ast.Attribute) or not _dyn_attr(t, n) \
            else None
    except Exception:
        fv = None
    f = fv.v if isinstance(fv, Static) else None
    if f in (print, static_print):
        if f is static_print:
            print(*[t.static_eval(a, "ti.static_print") for a in n.args])
        else:
            warnings.warn(f"{t.p.file}:{t.p.line(n)}: print() in a kernel is not supported on "
                          "Fusebox and is left out; read the values with to_numpy() or x[i] "
                          "after the launch", stacklevel=2)
        return ""
    if f in (loop_config, block_local, no_activate, static_assert):
        if f is loop_config:
            kw = {k.arg: t.static_eval(k.value, "ti.loop_config") for k in n.keywords}
            t.serialize_next = bool(kw.get("serialize"))
        if f is static_assert:
            vals = [t.static_eval(a, "ti.static_assert") for a in n.args]
            if not vals[0]:
                raise t.err(n, f"ti.static_assert failed: {vals[1] if len(vals) > 1 else ''}")
        return ""
    tr = _T.get(id(f)) if f is not None else None
    if isinstance(tr, tuple) and tr[0] == "atomic":
        tgt = t.expr(n.args[0])
        if isinstance(tgt, Static):
            raise t.err(n, f"ti.{f.__name__} needs a field element or variable to update")
        return f"{tgt} {tr[1]}= {t.expr_code(n.args[1])}"
    return None


def _dyn_attr(t: Translator, n: ast.Call) -> bool:
    try:
        return not isinstance(t.expr(n.func.value), Static)
    except Exception:
        return True


def is_decomp(t: Translator, n: ast.Call) -> bool:
    try:
        f = t.expr(n.func)
    except Exception:
        return False
    return isinstance(f, Static) and isinstance(_T.get(id(f.v)), tuple) and \
        _T[id(f.v)][0] == "decomp"


def decomp_code(t: Translator, n: ast.Call, count: int) -> str:
    f = t.expr(n.func).v
    what = _T[id(f)][1]
    want = 3 if what == "svd" else 2
    if count != want:
        raise t.err(n, f"ti.{f.__name__} gives {want} matrices; unpack {want} names")
    return f"{what}({t.expr_code(n.args[0])})"


# ------------------------------------------------------------------ methods
METHODS = {"norm": "norm", "norm_sqr": "norm_sqr", "normalized": "normalized", "dot": "dot",
           "cross": "cross", "outer_product": "outer", "transpose": "transpose",
           "determinant": "determinant", "inverse": "inverse", "trace": "trace"}


def method(t: Translator, n: ast.Call, base: Any, name: str) -> str:
    b = base if isinstance(base, str) else t.code(base, n.func.value)
    if name == "cast":
        dt = t.static_eval(n.args[0], "cast's type")
        return f"{_tname(t, dt, n)}({b})"
    args = [t.expr_code(a) for a in n.args]
    if name == "norm" and args:
        return f"sqrt(norm_sqr({b}) + {args[0]})"
    if name == "normalized" and args:
        return f"(({b}) / sqrt(norm_sqr({b}) + {args[0]}))"
    if name in METHODS:
        return f"{METHODS[name]}({', '.join([b] + args)})"
    if name == "sum":
        return f"dot({b}, ({b}) * 0 + 1)"
    if name == "cast":
        dt = t.static_eval(n.args[0], "cast's type")
        return f"{_tname(t, dt, n)}({b})"
    if name == "append" and isinstance(n.func.value, ast.Subscript):
        fld, idx = _field_subscript(t, n.func.value)
        return f"append({', '.join([fld] + idx + args)})"
    if name == "length" and isinstance(n.func.value, ast.Subscript):
        fld, idx = _field_subscript(t, n.func.value)
        return f"length({', '.join([fld] + idx)})"
    if name == "length" and isinstance(base, str) and not n.args:
        return f"length({b})"
    raise t.unsupported(n, f"the method '.{name}()'",
                        "see docs/from-taichi.md for the vector and matrix methods supported")


def _field_subscript(t: Translator, sub: ast.Subscript) -> Any:
    from fusebox.taichi._fields import Field
    v = t.expr(sub.value)
    if not isinstance(v, Static) or not isinstance(v.v, Field):
        raise t.err(sub, "append/length need a field of a dynamic SNode: x[i].append(v)")
    sl = sub.slice
    idx = [] if isinstance(sl, ast.Constant) and sl.value is None else _idx(t, sl)
    return t.code(v, sub.value), idx


# ------------------------------------------------------------------ funcs
def _call_func(t: Translator, n: ast.Call, f: Func, bound: tuple = ()) -> str:
    import inspect
    from fusebox.taichi._fields import Field, SNode
    from fusebox.taichi._translate import translate_func
    prog = t.prog
    sig = inspect.signature(f.fn)
    try:
        ba = sig.bind(*bound, *n.args, **{k.arg: k.value for k in n.keywords})
    except TypeError as e:
        raise t.err(n, f"calling ti.func '{f.fn.__name__}': {e}")
    ba.apply_defaults()
    key: List[Any] = [id(f)]
    statics: Dict[str, Any] = {}
    params: List[Any] = []
    args: List[str] = []
    for pname, anode in ba.arguments.items():
        prm = sig.parameters[pname]
        ann = prm.annotation
        annv = None
        if ann is not inspect.Parameter.empty:
            annv = ann if not isinstance(ann, str) else t.p.globals.get(ann.split(".")[-1])
        if isinstance(anode, ast.AST):
            v = t.expr(anode)
        else:
            v = Static(anode)  # a default value
        if isinstance(v, Static) and (isinstance(v.v, (Field, SNode, Func)) or
                                      isinstance(annv, _types.Template) or
                                      not t.is_static_num(v)):
            if isinstance(v.v, (Field, SNode, Func)):
                key.append(("s", id(v.v)))
            else:
                try:
                    hash(v.v)
                    key.append(("s", v.v))
                except TypeError:
                    key.append(("s", id(v.v)))
            statics[pname] = v.v
            continue
        pt = None
        if isinstance(annv, (_types.VectorType, _types.MatrixType)):
            pt = annv.fbk()
        elif annv is not None and not isinstance(annv, _types.Template):
            try:
                pt = _types.resolve(annv).fbk
            except TypeError:
                pt = None
        key.append(("v", pt))
        params.append((pname, pt))
        args.append(t.code(v, anode if isinstance(anode, ast.AST) else n))
    k = tuple(key)
    name = prog.funcs.get(k)
    if name is None:
        name = prog.fresh(f.fn.__name__)
        prog.funcs[k] = name
        ret = None
        r = sig.return_annotation
        # one return statement: the func's value is the returned expression
        # (Taichi does not hold a func to its annotation: examples return a
        # vector from "-> ti.f32"); several need the declared type
        nret = sum(isinstance(x, ast.Return) and x.value is not None
                   for x in ast.walk(prog.parse(f.fn).fd))
        if r is not inspect.Signature.empty and r is not None and nret > 1:
            ret = (r.fbk() if isinstance(r, (_types.VectorType, _types.MatrixType)) else
                   _types.resolve(r).fbk)
        try:
            translate_func(prog, f, name, statics, params, ret)
        except BaseException:
            del prog.funcs[k]
            raise
        prog.new_funcs.append(k)
    return f"{name}({', '.join(args)})"


# ------------------------------------------------------------------ loops
def for_loop(t: Translator, st: ast.For) -> None:
    from fusebox.taichi._fields import Field, SNode
    it = st.iter
    targets = st.target.elts if isinstance(st.target, ast.Tuple) else [st.target]
    for tg in targets:
        if not isinstance(tg, ast.Name):
            raise t.unsupported(st, "this loop target", "loop over plain names")
    names = [tg.id for tg in targets]
    iv = None
    fcall = None
    if isinstance(it, ast.Call):
        fv = t.expr(it.func) if not isinstance(it.func, ast.Attribute) or not _dyn_attr(
            t, it) else None
        fcall = fv.v if isinstance(fv, Static) else None
    if fcall is static:
        vals = t.static_eval(it.args[0], "ti.static")
        _unroll(t, st, names, vals)
        return
    if fcall is grouped:
        inner = it.args[0]
        if len(names) != 1:
            raise t.err(st, "for I in ti.grouped(...) takes one loop variable")
        if isinstance(inner, ast.Call):
            f2 = t.expr(inner.func)
            if isinstance(f2, Static) and f2.v is ndrange:
                _ndrange_loop(t, st, inner, names, grouped_=True)
                return
            if isinstance(f2, Static) and f2.v is builtins.range:
                _range_loop(t, st, inner, ["I__"], grouped_name=names[0])
                return
        v = t.expr(inner)
        if not isinstance(v, Static) or not isinstance(v.v, (Field, SNode)):
            raise t.err(st, "ti.grouped needs a field, an SNode or ti.ndrange(...)")
        x = v.v
        nd = len(x.shape)
        if nd == 0:
            raise t.unsupported(st, "a struct-for over a 0-D field",
                                "access it directly as x[None]")
        idx = [t.prog.fresh(f"{names[0]}_{d}") for d in range(nd)]
        t.emit(f"for {', '.join(idx)} in {t.code(v, inner)} {{", st)
        _loop_body(t, st, {}, pre=[(names[0], f"i32[{nd}]({', '.join(idx)})")])
        return
    if fcall is ndrange:
        _ndrange_loop(t, st, it, names)
        return
    if fcall is builtins.range:
        _range_loop(t, st, it, names)
        return
    if fcall is builtins.enumerate or fcall is builtins.zip:
        raise t.unsupported(st, f"{fcall.__name__}() in a kernel loop",
                            "loop over range(...) and index")
    iv = t.expr(it)
    if isinstance(iv, Static) and isinstance(iv.v, (Field, SNode)):
        if len(iv.v.shape) == 0:
            raise t.unsupported(st, "a struct-for over a 0-D field",
                                "access it directly as x[None]")
        fbn = [t.safe(nm) for nm in names]
        t.emit(f"for {', '.join(fbn)} in {t.code(iv, it)} {{", st)
        _loop_body(t, st, dict(zip(names, fbn)))
        return
    if isinstance(iv, Static) and isinstance(iv.v, (range, NDRange, list, tuple)):
        if isinstance(iv.v, range) and iv.v.step == 1:
            fbn = t.safe(names[0]) if len(names) == 1 else None
            if fbn is None:
                raise t.err(st, "range gives one loop variable")
            t.emit(f"for {fbn} in range({iv.v.start}, {iv.v.stop}) {{", st)
            _loop_body(t, st, {names[0]: fbn})
            return
        raise t.unsupported(st, "looping over a Python list or tuple without ti.static",
                            "write for v in ti.static([...]) to unroll it")
    raise t.unsupported(st, "this loop", "loop over range(...), ti.ndrange(...), a field, "
                        "ti.grouped(field) or ti.static(...)")


def _loop_body(t: Translator, st: ast.For, names: Dict[str, str],
               pre: Optional[List[Any]] = None) -> None:
    t.scopes.append(dict(names))
    t.depth += 1
    t.loop_depth += 1
    try:
        for nm, code in (pre or []):
            fb = t.declare(nm, st)
            t.emit(f"let {fb} = {code}", st)
        for s in st.body:
            t.stmt(s)
    finally:
        t.loop_depth -= 1
        t.depth -= 1
        t.scopes.pop()
    t.emit("}", st)


def _range_loop(t: Translator, st: ast.For, it: ast.Call, names: List[str],
                grouped_name: Optional[str] = None) -> None:
    if len(names) != 1:
        raise t.err(st, "range(...) gives one loop variable")
    if it.keywords or not 1 <= len(it.args) <= 3:
        raise t.err(st, "range takes 1 to 3 arguments")
    args = [t.expr(a) for a in it.args]
    if len(args) == 3:
        step = args[2]
        if not (isinstance(step, Static) and step.v == 1):
            if not isinstance(step, Static) or not isinstance(step.v, int) or step.v == 0:
                raise t.unsupported(st, "range with a run-time step",
                                    "loop over range(n) and compute the value")
            lo, hi = t.code(args[0], it.args[0]), t.code(args[1], it.args[1])
            s = step.v
            cnt = (f"(({hi}) - ({lo}) + {s - 1}) // {s}" if s > 0 else
                   f"(({lo}) - ({hi}) + {-s - 1}) // {-s}")
            k = t.prog.fresh(names[0] + "_k")
            t.emit(f"for {k} in range(max({cnt}, 0)) {{", st)
            _loop_body(t, st, {}, pre=[(names[0], f"({lo}) + {k} * ({s})")])
            return
        args = args[:2]
    rng = ", ".join(t.code(a, e) for a, e in zip(args, it.args))
    if grouped_name:
        k = t.prog.fresh(grouped_name + "_0")
        t.emit(f"for {k} in range({rng}) {{", st)
        _loop_body(t, st, {}, pre=[(grouped_name, f"i32[1]({k})")])
        return
    fb = t.safe(names[0])
    t.emit(f"for {fb} in range({rng}) {{", st)
    _loop_body(t, st, {names[0]: fb})


def _ndrange_loop(t: Translator, st: ast.For, it: ast.Call, names: List[str],
                  grouped_: bool = False) -> None:
    bounds = []
    for a in it.args:
        if isinstance(a, ast.Starred):  # ti.ndrange(*[n] * dim): compile-time items
            for item in t.static_eval(a.value, "*args of ti.ndrange"):
                if isinstance(item, (tuple, list)):
                    bounds.append((Static(item[0]), Static(item[1]), a))
                else:
                    bounds.append((Static(0), Static(item), a))
            continue
        if isinstance(a, (ast.Tuple, ast.List)):
            if len(a.elts) != 2:
                raise t.err(a, "a ti.ndrange item is a size n or a pair (lo, hi)")
            bounds.append((t.expr(a.elts[0]), t.expr(a.elts[1]), a))
        else:
            v = t.expr(a)
            if isinstance(v, Static) and isinstance(v.v, (tuple, list)):
                bounds.append((Static(v.v[0]), Static(v.v[1]), a))
            else:
                bounds.append((Static(0), v, a))
    nd = len(bounds)
    if not grouped_ and len(names) != nd:
        raise t.err(st, f"ti.ndrange with {nd} dimensions gives {nd} loop variables; "
                        f"{len(names)} given")
    ext = []
    los = []
    for lo, hi, a in bounds:
        if t.is_static_num(lo) and t.is_static_num(hi):
            ext.append(str(builtins.max(int(hi.v) - int(lo.v), 0)))
            los.append(str(int(lo.v)))
        else:
            ext.append(f"max(({t.code(hi, a)}) - ({t.code(lo, a)}), 0)")
            los.append(f"({t.code(lo, a)})")
    base = names[0] if not grouped_ else names[0]
    flat = t.prog.fresh(f"{base}_flat")
    total = " * ".join(f"({e})" if not e.isdigit() else e for e in ext) or "1"
    if builtins.all(e.isdigit() for e in ext):
        total = str(int(np.prod([int(e) for e in ext])))
    t.emit(f"for {flat} in range({total}) {{", st)
    comps = []
    for d in range(nd):
        stride = " * ".join(ext[d + 1:]) or "1"
        if builtins.all(e.isdigit() for e in ext[d + 1:]):
            stride = str(int(np.prod([int(e) for e in ext[d + 1:]])) if ext[d + 1:] else 1)
        q = f"{flat} // ({stride})" if stride != "1" else flat
        c = f"({q}) % ({ext[d]})" if d > 0 else q
        comps.append(c if los[d] == "0" else f"{los[d]} + {c}")
    if grouped_:
        pre = [(names[0], f"i32[{nd}]({', '.join(comps)})")]
    else:
        pre = list(zip(names, comps))
    _loop_body(t, st, {}, pre=pre)


def _unroll(t: Translator, st: ast.For, names: List[str], vals: Any) -> None:
    from fusebox.taichi._fields import Field
    if isinstance(vals, Field):
        raise t.unsupported(st, "ti.static over a field", "loop over the field without "
                            "ti.static (a struct-for) or over ti.static(range(n))")
    try:
        items = list(vals)
    except TypeError:
        raise t.err(st, f"ti.static(...) of {type(vals).__name__} cannot be iterated")
    def loose(body: List[ast.stmt]) -> Optional[ast.stmt]:
        """A break/continue of this loop (not of a loop nested in it)."""
        for b in body:
            if isinstance(b, (ast.Break, ast.Continue)):
                return b
            if isinstance(b, ast.If):
                r = loose(b.body) or loose(b.orelse)
                if r is not None:
                    return r
        return None
    bad = loose(st.body)
    if bad is not None:
        raise t.unsupported(bad, f"'{type(bad).__name__.lower()}' in a ti.static loop",
                            "use ti.static(if ...) or a run-time loop")
    for item in items:
        if len(names) == 1:
            binding = {names[0]: Static(item)}
        else:
            if len(item) != len(names):
                raise t.err(st, f"{len(names)} loop variables but items of {len(item)}")
            binding = {nm: Static(x) for nm, x in zip(names, item)}
        t.scopes.append(binding)
        try:
            for s in st.body:
                t.stmt(s)
        finally:
            t.scopes.pop()
