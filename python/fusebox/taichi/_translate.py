"""Python AST of a @ti.kernel / @ti.func -> .fbk source text.

Each emitted line remembers the Python file and line it came from, so
that errors the server reports for the generated program are shown at the
user's line. Values known when the kernel is compiled (Python numbers,
fields, ti.static(...), template arguments) are evaluated here
("static"); everything else becomes .fbk expression text.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import linecache
import math
import textwrap
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from fusebox.taichi import _types
from fusebox.taichi._errors import TaichiSyntaxError

RESERVED = {
    "layout", "place", "dense", "pointer", "bitmasked", "dynamic", "as", "const", "kernel",
    "func", "let", "var", "if", "else", "while", "for", "in", "break", "continue", "return",
    "true", "false", "and", "or", "not", "field", "chunk", "bool", "i32", "i64", "u32", "u64",
    "f32", "f64", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "exp", "log",
    "floor", "ceil", "round", "abs", "pow", "atan2", "min", "max", "clamp", "select", "int",
    "float", "dot", "cross", "norm", "norm_sqr", "normalized", "transpose", "outer", "trace",
    "determinant", "inverse", "identity", "svd", "polar", "assume_unique", "random",
    "is_active", "activate", "deactivate", "append", "length", "range",
}

Loc = Tuple[str, int]


class Static:
    """A value known at translation time."""
    __slots__ = ("v",)

    def __init__(self, v: Any):
        self.v = v

    def __repr__(self) -> str:
        return f"Static({self.v!r})"


class NDRange:
    """ti.ndrange(...): in Python scope (and under ti.static) an iterable
    of index tuples; in a kernel a parallel loop over the box."""

    def __init__(self, *dims: Any):
        self.bounds = []
        for d in dims:
            if isinstance(d, (tuple, list)):
                if len(d) != 2:
                    raise ValueError("ti.ndrange: an item is a size n or a pair (lo, hi)")
                self.bounds.append((int(d[0]), int(d[1])))
            else:
                self.bounds.append((0, int(d)))

    def __iter__(self):
        import itertools
        return iter(itertools.product(*[range(lo, hi) for lo, hi in self.bounds]))


class Grouped:
    def __init__(self, x: Any):
        self.x = x

    def __iter__(self):
        from fusebox.taichi._ops import TiArray
        for t in self.x:
            yield np.array(t if isinstance(t, tuple) else (t,)).view(TiArray)


def fmt_float(x: float, node: Any = None, tr: Any = None) -> str:
    if math.isnan(x) or math.isinf(x):
        s = "(0.0 / 0.0)" if math.isnan(x) else ("(1.0 / 0.0)" if x > 0 else "(-1.0 / 0.0)")
        return s
    r = repr(float(x))
    if "e" not in r and "." not in r:
        r += ".0"
    return r


class Func:
    """A @ti.func: translated into a .fbk func per set of compile-time
    arguments (fields, template numbers), inlined by the server."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *a: Any, **k: Any) -> Any:
        raise TaichiSyntaxError(f"ti.func '{self.fn.__name__}' can only be called from a "
                                "@ti.kernel or another @ti.func")

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        return self if obj is None else BoundFunc(self, obj)


class BoundFunc:
    """A @ti.func that is a method, with its object."""

    def __init__(self, func: Func, obj: Any):
        self.func = func
        self.obj = obj

    def __call__(self, *a: Any, **k: Any) -> Any:
        return self.func(*a, **k)


class Parsed:
    """The parsed source of a Python function, with its file and lines."""

    def __init__(self, fn: Any):
        try:
            lines, start = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise TaichiSyntaxError(f"the source of '{fn.__name__}' is not available ({e}): "
                                    "kernels must be defined in a file") from None
        self.file = inspect.getsourcefile(fn) or "<unknown>"
        self.start = start
        src = textwrap.dedent("".join(lines))
        tree = ast.parse(src)
        fd = tree.body[0]
        if not isinstance(fd, (ast.FunctionDef,)):
            raise TaichiSyntaxError(f"{self.file}:{start}: '{fn.__name__}' is not a plain def")
        self.fd = fd
        g = dict(fn.__globals__)
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    g[name] = cell.cell_contents
                except ValueError:
                    pass
        self.globals = g

    def line(self, node: Any) -> int:
        return self.start + getattr(node, "lineno", 1) - 1


def _assigned_names(body: Sequence[ast.stmt]) -> set:
    out = set()
    for st in body:
        for n in ast.walk(st):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                out.add(n.id)
            elif isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(
                    n.ctx, ast.Store):  # v[i] = ..., v.x = ...: v is changed too
                b = n.value
                while isinstance(b, (ast.Subscript, ast.Attribute)):
                    b = b.value
                if isinstance(b, ast.Name):
                    out.add(b.id)
    return out


class Program:
    """What a runtime has translated: func texts (kept once each) and the
    names used."""

    def __init__(self, rt: Any):
        self.rt = rt
        self.funcs: Dict[Any, str] = {}           # key -> .fbk func name
        self.func_lines: List[Tuple[str, Loc]] = []
        self.names: set = set()
        self.parsed: Dict[Any, Parsed] = {}
        self.new_funcs: List[Any] = []  # funcs added while translating the current kernel

    def parse(self, fn: Any) -> Parsed:
        p = self.parsed.get(fn)
        if p is None:
            p = self.parsed[fn] = Parsed(fn)
        return p

    def fresh(self, base: str) -> str:
        n, k = base, 1
        while n in self.names or n in RESERVED or n in self.rt.field_names:
            k += 1
            n = f"{base}_{k}"
        self.names.add(n)
        return n


BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
          ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
          ast.BitXor: "^", ast.BitAnd: "&", ast.MatMult: "@"}
CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
          ast.GtE: ">="}

EXPR_NAMES = {
    "ListComp": "a list comprehension", "DictComp": "a dict comprehension",
    "SetComp": "a set comprehension", "GeneratorExp": "a generator expression",
    "Lambda": "a lambda", "Dict": "a dict", "Set": "a set", "NamedExpr": "':='",
    "Await": "await", "Yield": "yield", "YieldFrom": "yield", "Starred": "a starred expression",
    "Slice": "a slice",
}

UNSUPPORTED_STMT = {
    ast.FunctionDef: ("a nested def", "move it to module level and decorate it with @ti.func"),
    ast.ClassDef: ("a class definition", "define classes outside kernels"),
    ast.With: ("'with'", "do it outside the kernel"),
    ast.Try: ("'try'", "check conditions with if instead"),
    ast.Raise: ("'raise'", "check in Python scope before launching"),
    ast.Import: ("'import'", "import at module level"),
    ast.ImportFrom: ("'import'", "import at module level"),
    ast.Global: ("'global'", "fields are visible without it; write results into a field"),
    ast.Nonlocal: ("'nonlocal'", "write results into a field"),
    ast.Delete: ("'del'", "leave the variable alone"),
}


class Translator:
    """Translates one kernel or func instance."""

    def __init__(self, prog: Program, parsed: Parsed, name: str, statics: Dict[str, Any],
                 kind: str):
        self.prog = prog
        self.p = parsed
        self.name = name
        self.kind = kind
        self.lines: List[Tuple[str, Loc]] = []
        self.scopes: List[Dict[str, Any]] = [dict((k, Static(v)) for k, v in statics.items())]
        self.depth = 1
        self.loop_depth = 0
        self.private: set = set()
        self.private_depth = 0
        self.tmp = 0
        self.cur: Any = parsed.fd

    # ---------------------------------------------------------------- errors
    def err(self, node: Any, msg: str) -> TaichiSyntaxError:
        line = self.p.line(node)
        src = linecache.getline(self.p.file, line).strip()
        return TaichiSyntaxError(f"{self.p.file}:{line}: error: {msg}" +
                                 (f"\n    {src}" if src else ""))

    def unsupported(self, node: Any, what: str, instead: str) -> TaichiSyntaxError:
        return self.err(node, f"{what} is not supported in Fusebox kernels; {instead}")

    # ---------------------------------------------------------------- output
    def emit(self, text: str, node: Any) -> None:
        self.lines.append(("  " * self.depth + text, (self.p.file, self.p.line(node))))

    def new_tmp(self) -> str:
        self.tmp += 1
        return f"tmp{self.tmp}_"

    # ---------------------------------------------------------------- names
    def lookup(self, name: str, node: Any) -> Any:
        for sc in reversed(self.scopes):
            if name in sc:
                return sc[name]
        if name in self.p.globals:
            return Static(self.p.globals[name])
        if hasattr(builtins, name):
            return Static(getattr(builtins, name))
        raise self.err(node, f"name '{name}' is not defined")

    def safe(self, name: str) -> str:
        """A .fbk name for a user's variable (one that is a keyword, a
        builtin or a field's name gets a suffix)."""
        if name in RESERVED or name in self.prog.rt.field_names:
            return name + "_v"
        return name

    def declare(self, name: str, node: Any) -> str:
        fb = self.safe(name)
        self.scopes[-1][name] = fb
        return fb

    # ---------------------------------------------------------------- values
    def code(self, v: Any, node: Any) -> str:
        """.fbk text of a translated value."""
        if isinstance(v, str):
            return v
        x = v.v
        from fusebox.taichi._fields import Field, SNode
        if isinstance(x, (bool, np.bool_)):
            return "true" if x else "false"
        if isinstance(x, (int, np.integer)):
            return str(int(x))
        if isinstance(x, (float, np.floating)):
            lit = fmt_float(float(x))
            # Taichi's float literals have the default float type
            return lit if _types.defaults.fp.fbk == "f32" else f"{_types.defaults.fp.fbk}({lit})"
        if isinstance(x, Field):
            if x._rt is not self.prog.rt:
                raise self.err(node, "this field belongs to an earlier ti.init(): declare it "
                                     "again after ti.init")
            if not x.name:
                raise self.err(node, "this field is not part of the layout (it was declared "
                                     "after the layout was sent)")
            return x.name
        if isinstance(x, SNode):
            return x._need_name()
        from fusebox.taichi._ops import TiArray
        if isinstance(x, TiArray) and x.ndim in (1, 2) and x.size <= 16:
            return self.code(Static(x.tolist()), node)  # a ti.Vector/ti.Matrix constant
        if isinstance(x, np.ndarray):
            raise self.err(node, "a NumPy array cannot be used inside a kernel (only Python "
                                 "numbers are captured as constants); put the data in a field "
                                 "with from_numpy() and read the field")
        if isinstance(x, (list, tuple)) and x and all(
                isinstance(e, (int, float, np.number, list, tuple)) for e in x):
            return "[" + ", ".join(self.code(Static(e), node) for e in x) + "]"
        if isinstance(x, Func):
            raise self.err(node, f"ti.func '{x.fn.__name__}' must be called")
        if isinstance(x, str):
            raise self.unsupported(node, "a string", "strings exist only in Python scope (a "
                                   "string may index a Python dict of constants)")
        raise self.err(node, f"the Python value {x!r} cannot be used inside a kernel (only "
                             "numbers, fields and ti.func calls are)")

    def expr_code(self, node: Any) -> str:
        return self.code(self.expr(node), node)

    def is_static_num(self, v: Any) -> bool:
        return isinstance(v, Static) and isinstance(v.v, (int, float, bool, np.number, np.bool_))

    def static_eval(self, node: Any, what: str = "ti.static") -> Any:
        v = self.expr(node)
        if not isinstance(v, Static):
            raise self.err(node, f"{what}(...) needs a value known when the kernel is compiled "
                                 "(a Python number, a field, range(...) of constants); this one "
                                 "depends on run-time values")
        return v.v

    # ---------------------------------------------------------------- expressions
    def expr(self, node: Any) -> Any:
        m = getattr(self, "e_" + type(node).__name__, None)
        if m is None:
            what = EXPR_NAMES.get(type(node).__name__, f"the Python expression "
                                                        f"'{type(node).__name__}'")
            raise self.unsupported(node, what, "write a @ti.func or a loop, or use "
                                   "ti.static([...]) for a list of compile-time values")
        return m(node)

    def e_Constant(self, n: ast.Constant) -> Any:
        if n.value is None:
            return Static(None)
        return Static(n.value)

    def e_Name(self, n: ast.Name) -> Any:
        return self.lookup(n.id, n)

    def e_Attribute(self, n: ast.Attribute) -> Any:
        base = self.expr(n.value)
        if isinstance(base, Static):
            try:
                return Static(getattr(base.v, n.attr))
            except AttributeError:
                raise self.err(n, f"{type(base.v).__name__} has no attribute '{n.attr}'")
            except Exception as e:  # a property that cannot be evaluated
                raise self.err(n, str(e))
        if n.attr in ("x", "y", "z", "w"):
            return f"{base}.{n.attr}"
        if n.attr in ("r", "g", "b", "a"):
            return f"{base}[{'rgba'.index(n.attr)}]"
        if n.attr == "T":
            return f"transpose({base})"
        raise self.unsupported(n, f"the attribute '.{n.attr}' of a run-time value",
                               "use .x/.y/.z/.w, an index, or a method such as .norm()")

    def e_Tuple(self, n: Any) -> Any:
        vals = [self.expr(e) for e in n.elts]
        if all(isinstance(v, Static) for v in vals):
            return Static(tuple(v.v for v in vals))
        return "[" + ", ".join(self.code(v, e) for v, e in zip(vals, n.elts)) + "]"

    e_List = e_Tuple

    def e_ListComp(self, n: ast.ListComp) -> Any:
        """[e for v in <compile-time iterable>]: unrolled into a vector."""
        if len(n.generators) != 1 or n.generators[0].is_async:
            raise self.unsupported(n, "a list comprehension with several 'for's",
                                   "nest ti.Vector([...]) literals")
        g = n.generators[0]
        it = self.expr(g.iter)
        if not isinstance(it, Static):
            raise self.unsupported(n, "a list comprehension over run-time values",
                                   "write a loop")
        names = ([g.target.id] if isinstance(g.target, ast.Name) else
                 [e.id for e in g.target.elts] if isinstance(g.target, ast.Tuple) and all(
                     isinstance(e, ast.Name) for e in g.target.elts) else None)
        if names is None:
            raise self.unsupported(n, "this comprehension target", "use plain names")
        vals = []
        for item in it.v:
            b = {names[0]: Static(item)} if len(names) == 1 else {
                nm: Static(x) for nm, x in zip(names, item)}
            self.scopes.append(b)
            try:
                if all(self.static_eval(c, "a comprehension's if") for c in g.ifs):
                    vals.append((self.expr(n.elt)))
            finally:
                self.scopes.pop()
        if all(isinstance(v, Static) for v in vals):
            return Static([v.v for v in vals])
        return "[" + ", ".join(self.code(v, n) for v in vals) + "]"

    def e_BinOp(self, n: ast.BinOp) -> Any:
        a, b = self.expr(n.left), self.expr(n.right)
        op = BINOPS.get(type(n.op))
        if op is None:
            raise self.unsupported(n, "this operator", "use + - * / // % ** @ << >> & | ^")
        if self.is_static_num(a) and self.is_static_num(b):
            try:
                return Static(_pyop(op, a.v, b.v))
            except Exception as e:
                raise self.err(n, f"constant arithmetic failed: {e}")
        if isinstance(a, Static) and isinstance(b, Static) and isinstance(
                a.v, (list, tuple, np.ndarray)) and op in ("+", "*", "-", "@"):
            try:  # [n] * dim, (a, b) + (c,), constant vectors
                return Static(_pyop(op, a.v, b.v) if op != "@" else a.v @ b.v)
            except Exception:
                pass
        return f"({self.code(a, n.left)} {op} {self.code(b, n.right)})"

    def e_UnaryOp(self, n: ast.UnaryOp) -> Any:
        a = self.expr(n.operand)
        if self.is_static_num(a):
            v = a.v
            return Static({ast.USub: lambda: -v, ast.UAdd: lambda: +v, ast.Not: lambda: not v,
                           ast.Invert: lambda: ~v}[type(n.op)]())
        c = self.code(a, n.operand)
        if isinstance(n.op, ast.USub):
            return f"(-{c})"
        if isinstance(n.op, ast.UAdd):
            return c
        if isinstance(n.op, ast.Not):
            return f"(not {c})"
        return f"(~{c})"

    def e_BoolOp(self, n: ast.BoolOp) -> Any:
        vals = [self.expr(v) for v in n.values]
        if all(self.is_static_num(v) for v in vals):
            r = vals[0].v
            for v in vals[1:]:
                r = (r and v.v) if isinstance(n.op, ast.And) else (r or v.v)
            return Static(r)
        op = " and " if isinstance(n.op, ast.And) else " or "
        return "(" + op.join(self.code(v, e) for v, e in zip(vals, n.values)) + ")"

    def e_Compare(self, n: ast.Compare) -> Any:
        items = [self.expr(n.left)] + [self.expr(c) for c in n.comparators]
        for o in n.ops:
            if type(o) not in CMPOPS:
                raise self.unsupported(n, f"the comparison '{type(o).__name__}' "
                                       "(is / in)", "compare numbers with == != < <= > >=")
        if all(self.is_static_num(v) for v in items):
            ok = True
            for o, a, b in zip(n.ops, items, items[1:]):
                ok = ok and _pyop(CMPOPS[type(o)], a.v, b.v)
            return Static(bool(ok))
        nodes = [n.left] + list(n.comparators)
        out = self.code(items[0], nodes[0])
        for o, v, e in zip(n.ops, items[1:], nodes[1:]):
            out += f" {CMPOPS[type(o)]} {self.code(v, e)}"
        return f"({out})"

    def e_IfExp(self, n: ast.IfExp) -> Any:
        c = self.expr(n.test)
        if isinstance(c, Static):
            return self.expr(n.body if c.v else n.orelse)
        return f"({c} ? {self.expr_code(n.body)} : {self.expr_code(n.orelse)})"

    def e_Subscript(self, n: ast.Subscript) -> Any:
        from fusebox.taichi._fields import Field, SNode
        base = self.expr(n.value)
        sl = n.slice
        if isinstance(sl, ast.Slice):
            lo, hi, st = (None if x is None else self.static_eval(x, "a slice bound")
                          for x in (sl.lower, sl.upper, sl.step))
            if isinstance(base, Static):
                try:
                    return Static(base.v[slice(lo, hi, st)])
                except Exception as e:
                    raise self.err(n, f"slicing a compile-time value failed: {e}")
            if hi is None or (lo or 0) < 0 or hi < 0:
                raise self.unsupported(n, "a slice without an upper bound (or with negative "
                                       "bounds) of a run-time vector", "write v[a:b]")
            b = self.code(base, n.value)
            return "[" + ", ".join(f"{b}[{k}]" for k in range(lo or 0, hi, st or 1)) + "]"
        if isinstance(base, Static) and isinstance(base.v, (Field, SNode)):
            name = self.code(base, n.value)
            if isinstance(sl, ast.Constant) and sl.value is None:
                return f"{name}[]"
            idx = sl.elts if isinstance(sl, ast.Tuple) else [sl]
            return f"{name}[{', '.join(self.expr_code(i) for i in idx)}]"
        idx_nodes = sl.elts if isinstance(sl, ast.Tuple) else [sl]
        idx = [self.expr(i) for i in idx_nodes]
        if isinstance(base, Static) and isinstance(base.v, np.ndarray) and not isinstance(
                base.v, __import__("fusebox.taichi._ops", fromlist=["TiArray"]).TiArray):
            self.code(base, n.value)  # the NumPy array error
        if isinstance(base, Static) and all(isinstance(i, Static) for i in idx):
            try:
                v = base.v
                for i in idx:
                    v = v[i.v]
                return Static(v)
            except Exception as e:
                raise self.err(n, f"indexing a compile-time value failed: {e}")
        b = self.code(base, n.value)
        return b + "".join(f"[{self.code(i, e)}]" for i, e in zip(idx, idx_nodes))

    def e_Call(self, n: ast.Call) -> Any:
        from fusebox.taichi import _ops
        if isinstance(n.func, ast.Attribute):
            base = self.expr(n.func.value)
            if not isinstance(base, Static):
                return _ops.method(self, n, base, n.func.attr)
            try:
                f = getattr(base.v, n.func.attr)
            except AttributeError:
                from fusebox.taichi._fields import Field
                if isinstance(base.v, Field) or n.func.attr in _ops.METHODS:
                    return _ops.method(self, n, self.code(base, n.func.value), n.func.attr)
                raise self.err(n, f"{type(base.v).__name__} has no attribute '{n.func.attr}'")
        else:
            fv = self.expr(n.func)
            if not isinstance(fv, Static):
                raise self.unsupported(n, "calling a run-time value", "call a ti.func")
            f = fv.v
        return _ops.call(self, n, f)

    def e_JoinedStr(self, n: Any) -> Any:
        raise self.unsupported(n, "an f-string", "strings exist only in Python scope")

    # ---------------------------------------------------------------- statements
    def block(self, body: Sequence[ast.stmt], new_scope: bool = True) -> None:
        if new_scope:
            self.scopes.append({})
        self.depth += 1
        try:
            for st in body:
                self.stmt(st)
        finally:
            self.depth -= 1
            if new_scope:
                self.scopes.pop()

    def stmt(self, st: ast.stmt) -> None:
        self.cur = st
        for t, (what, instead) in UNSUPPORTED_STMT.items():
            if isinstance(st, t):
                raise self.unsupported(st, what, instead)
        m = getattr(self, "s_" + type(st).__name__, None)
        if m is None:
            raise self.unsupported(st, f"the Python statement '{type(st).__name__}'",
                                   "see docs/from-taichi.md for what kernels may contain")
        m(st)

    def s_Pass(self, st: Any) -> None:
        pass

    def s_Expr(self, st: ast.Expr) -> None:
        v = st.value
        if isinstance(v, ast.Constant):
            return  # a docstring
        if isinstance(v, ast.Call):
            from fusebox.taichi import _ops
            r = _ops.call_stmt(self, v)
            if r is not None:
                if r:
                    self.emit(r, st)
                return
        c = self.expr(v)
        if isinstance(c, Static):
            return
        self.emit(c, st)

    def s_Assert(self, st: Any) -> None:
        import warnings
        warnings.warn(f"{self.p.file}:{self.p.line(st)}: assert in a kernel is not checked on "
                      "Fusebox (as in Taichi without debug=True); it is left out", stacklevel=2)

    def _assign_to(self, tgt: Any, val: Any, node: Any, op: str = "=") -> None:
        if isinstance(tgt, ast.Name):
            cur = None
            for d in range(len(self.scopes) - 1, -1, -1):
                if tgt.id in self.scopes[d]:
                    cur = self.scopes[d][tgt.id]
                    if tgt.id in self.private and d < self.private_depth and op == "=":
                        cur = None  # a fresh local of the loop's iteration
                    break
            if isinstance(cur, Static) or (cur is None and op != "="):
                if cur is None:
                    raise self.err(node, f"'{tgt.id}' is used before it is assigned")
                raise self.err(node, f"'{tgt.id}' is a compile-time value (a template "
                                     "argument, a ti.static loop variable or ti.static(...)) "
                                     "and cannot be assigned in the kernel")
            if cur is None:
                fb = self.declare(tgt.id, tgt)
                self.emit(f"var {fb} = {self.code(val, node)}", node)
            else:
                self.emit(f"{cur} {op} {self.code(val, node)}", node)
            return
        if isinstance(tgt, (ast.Subscript, ast.Attribute)):
            t = self.expr(tgt)
            if isinstance(t, Static):
                raise self.err(node, "this target is a compile-time value and cannot be "
                                     "assigned in a kernel")
            self.emit(f"{t} {op} {self.code(val, node)}", node)
            return
        if isinstance(tgt, ast.Starred):
            raise self.unsupported(node, "starred assignment", "assign each name")
        raise self.unsupported(node, f"assigning to {type(tgt).__name__}", "assign to names, "
                               "field elements or components")

    def s_Assign(self, st: ast.Assign) -> None:
        val_node = st.value
        for tgt in st.targets:
            if isinstance(tgt, (ast.Tuple, ast.List)):
                self._assign_tuple(tgt, val_node, st)
                continue
            if len(st.targets) > 1:
                raise self.unsupported(st, "chained assignment (a = b = ...)",
                                       "write one assignment per name")
            # x = ti.static(...) binds a compile-time value
            if isinstance(tgt, ast.Name) and _is_static_call(self, val_node):
                if any(tgt.id in sc for sc in self.scopes[1:]) and not isinstance(
                        self.lookup(tgt.id, tgt), Static):
                    raise self.err(st, f"'{tgt.id}' is a variable; ti.static(...) cannot be "
                                       "assigned to it")
                self.scopes[-1][tgt.id] = Static(self.static_eval(val_node.args[0]))
                continue
            val = self.expr(val_node)
            if isinstance(val, Static) and isinstance(tgt, ast.Name) and not self.is_static_num(
                    val) and not isinstance(val.v, (list, tuple, np.ndarray)):
                self.scopes[-1][tgt.id] = val  # an alias of a field, a func, a module ...
                continue
            self._assign_to(tgt, val, st)

    def _assign_tuple(self, tgt: Any, val_node: Any, st: Any) -> None:
        from fusebox.taichi import _ops
        n = len(tgt.elts)
        if isinstance(val_node, ast.Call) and _ops.is_decomp(self, val_node):
            tmps = [self.new_tmp() for _ in range(n)]
            code = _ops.decomp_code(self, val_node, n)
            self.emit(f"let ({', '.join(tmps)}) = {code}", st)
            for t, tm in zip(tgt.elts, tmps):
                self._assign_to(t, tm, st)
            return
        if isinstance(val_node, (ast.Tuple, ast.List)):
            if len(val_node.elts) != n:
                raise self.err(st, f"{n} names but {len(val_node.elts)} values")
            vals = [self.expr(e) for e in val_node.elts]
            tmps = []
            for v, e in zip(vals, val_node.elts):
                if isinstance(v, Static):
                    tmps.append(v)
                else:
                    tm = self.new_tmp()
                    self.emit(f"let {tm} = {v}", st)
                    tmps.append(tm)
            for t, v in zip(tgt.elts, tmps):
                self._assign_to(t, v, st)
            return
        v = self.expr(val_node)
        if isinstance(v, Static):
            try:
                items = list(v.v)
            except TypeError:
                raise self.err(st, "this value cannot be unpacked")
            if len(items) != n:
                raise self.err(st, f"{n} names but {len(items)} values")
            for t, x in zip(tgt.elts, items):
                self._assign_to(t, Static(x), st)
            return
        tm = self.new_tmp()
        self.emit(f"let {tm} = {v}", st)
        for k, t in enumerate(tgt.elts):
            self._assign_to(t, f"{tm}[{k}]", st)

    def s_AnnAssign(self, st: ast.AnnAssign) -> None:
        if not isinstance(st.target, ast.Name):
            raise self.unsupported(st, "an annotated assignment to this target",
                                   "annotate plain names only")
        ty = self.static_eval(st.annotation, "an annotation")
        tname = _ops_type(self, ty, st)
        fb = self.declare(st.target.id, st.target)
        if st.value is None:
            self.emit(f"var {fb}: {tname}", st)
        else:
            self.emit(f"var {fb}: {tname} = {self.expr_code(st.value)}", st)

    def s_AugAssign(self, st: ast.AugAssign) -> None:
        op = BINOPS.get(type(st.op))
        if op is None or op == "@":
            raise self.unsupported(st, "this augmented assignment", "write x = x @ y")
        self._assign_to(st.target, self.expr(st.value), st, op + "=")

    def s_If(self, st: ast.If) -> None:
        c = self.expr(st.test)
        if isinstance(c, Static):  # decided now: the branch is inlined, as Python scopes it
            for s in (st.body if c.v else st.orelse):
                self.stmt(s)
            return
        self.emit(f"if {c} {{", st)
        self.block(st.body)
        if st.orelse:
            self.emit("} else {", st.orelse[0])
            self.block(st.orelse)
        self.emit("}", st)

    def s_While(self, st: ast.While) -> None:
        if st.orelse:
            raise self.unsupported(st, "while ... else", "use a flag variable")
        c = self.expr(st.test)
        self.emit(f"while {self.code(c, st.test)} {{", st)
        self.loop_depth += 1
        self.block(st.body)
        self.loop_depth -= 1
        self.emit("}", st)

    def s_Break(self, st: Any) -> None:
        self.emit("break", st)

    def s_Continue(self, st: Any) -> None:
        self.emit("continue", st)

    def s_Return(self, st: ast.Return) -> None:
        if st.value is None:
            if self.kind == "kernel":
                raise self.unsupported(st, "a bare 'return' in a kernel",
                                       "use if/else around the rest of the body")
            self.emit("return", st)
            return
        if isinstance(st.value, ast.Tuple):
            raise self.unsupported(st, "returning several values",
                                   "return a ti.Vector([...]) or write the values to fields")
        self.emit(f"return {self.expr_code(st.value)}", st)

    def s_For(self, st: ast.For) -> None:
        from fusebox.taichi import _ops
        if st.orelse:
            raise self.unsupported(st, "for ... else", "use a flag variable")
        if getattr(self, "serialize_next", False):
            # ti.loop_config(serialize=True): a loop inside a block runs serially
            self.serialize_next = False
            self.emit("if true {", st)
            self.depth += 1
            try:
                _ops.for_loop(self, st)
            finally:
                self.depth -= 1
            self.emit("}", st)
            return
        if self.kind == "kernel" and self.loop_depth == 0 and self.depth == 1:
            # a kernel-scope variable that each iteration of a parallel loop
            # assigns before reading it is a local of the iteration (Taichi
            # runs such a program; .fbk refuses the shared write)
            self.private = _privatized(st.body, self.scopes)
            self.private_depth = len(self.scopes)
            try:
                _ops.for_loop(self, st)
            finally:
                self.private = set()
            return
        _ops.for_loop(self, st)


def _mentions(node: Any, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _privatized(body: Sequence[ast.stmt], scopes: List[Dict[str, Any]]) -> set:
    """Run-time variables of the enclosing scopes whose first mention in a
    loop body is a plain assignment that does not read them."""
    out = set()
    for nm in {k for sc in scopes for k, v in sc.items() if isinstance(v, str)}:
        for st in body:
            if not _mentions(st, nm):
                continue
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(
                    st.targets[0], ast.Name) and st.targets[0].id == nm and not _mentions(
                    st.value, nm):
                out.add(nm)
            break
    return out


def _is_static_call(tr: Translator, node: Any) -> bool:
    from fusebox.taichi import _ops
    if not isinstance(node, ast.Call):
        return False
    try:
        f = tr.expr(node.func)
    except TaichiSyntaxError:
        return False
    return isinstance(f, Static) and f.v is _ops.static


def _ops_type(tr: Translator, ty: Any, node: Any) -> str:
    if isinstance(ty, (_types.VectorType, _types.MatrixType)):
        return ty.fbk()
    try:
        return _types.resolve(ty).fbk
    except TypeError as e:
        raise tr.err(node, str(e))


def _pyop(op: str, a: Any, b: Any) -> Any:
    import operator
    f = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
         "//": operator.floordiv, "%": operator.mod, "**": operator.pow,
         "<<": operator.lshift, ">>": operator.rshift, "|": operator.or_, "^": operator.xor,
         "&": operator.and_, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
         "<=": operator.le, ">": operator.gt, ">=": operator.ge}[op]
    if op in ("//", "%") and b == 0 and isinstance(a, int) and isinstance(b, int):
        return 0  # as the language defines it
    return f(a, b)


def translate_kernel(prog: Program, fn: Any, name: str, statics: Dict[str, Any],
                     params: List[Tuple[str, str]], ret: Optional[str]
                     ) -> List[Tuple[str, Loc]]:
    p = prog.parse(fn)
    tr = Translator(prog, p, name, statics, "kernel")
    assigned = _assigned_names(p.fd.body)
    decl = []
    pro = []
    for pn, pt in params:
        if pn in assigned or pn in RESERVED or pn in prog.rt.field_names:
            decl.append(f"{pn}_arg: {pt}")
            fb = tr.declare(pn, p.fd)
            pro.append(f"var {fb}: {pt} = {pn}_arg")
        else:
            decl.append(f"{pn}: {pt}")
            tr.scopes[0][pn] = pn
    for line in pro:
        tr.emit(line, p.fd)
    for nm, slot in _reductions(p.fd.body, set(tr.scopes[0])).items():
        tr.scopes[0][nm] = slot  # a kernel-scope accumulator of a parallel loop
    head = f"kernel {name}({', '.join(decl)})" + (f" -> {ret}" if ret else "") + " {"
    for st in p.fd.body:
        tr.stmt(st)
    return [(head, (p.file, p.line(p.fd)))] + tr.lines + [("}", (p.file, p.line(p.fd)))]


REDUCE_SLOTS = 2  # per type: 0-D fields the layout holds for kernel-scope accumulators


def reduce_slot(t: str, k: int) -> str:
    return f"ti_reduce_{t}_{k}"


def _reductions(body: Sequence[ast.stmt], taken: set) -> Dict[str, str]:
    """Kernel-scope variables that a top-level (parallel) loop updates with
    an augmented assignment (``s = 0.0; for i in x: s += x[i]``), as Taichi
    allows: each gets a 0-D field of the layout (ti_reduce_f32_0, ...), so
    the update is atomic. Only variables first assigned a number literal (or
    annotated with a scalar type) at the kernel's top level qualify."""
    init: Dict[str, str] = {}
    for st in body:
        tgt, val, ty = None, None, None
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(
                st.targets[0], ast.Name):
            tgt, val = st.targets[0].id, st.value
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            tgt, val = st.target.id, st.value
            ann = st.annotation
            nm = ann.attr if isinstance(ann, ast.Attribute) else getattr(ann, "id", "")
            ty = {"f32": "f32", "f64": "f64", "i32": "i32", "i64": "i64", "float": "fp",
                  "int": "ip"}.get(nm)
        if tgt is None or tgt in init or tgt in taken:
            continue
        if ty is None and isinstance(val, ast.UnaryOp) and isinstance(val.op, ast.USub):
            val = val.operand
        if ty is None and isinstance(val, ast.Constant) and not isinstance(val.value, bool):
            ty = "fp" if isinstance(val.value, float) else "ip" if isinstance(
                val.value, int) else None
        if ty:
            init[tgt] = {"fp": _types.defaults.fp.fbk, "ip": _types.defaults.ip.fbk}.get(ty, ty)
    updated: set = set()
    for st in body:
        if isinstance(st, ast.For):
            for n in ast.walk(st):
                if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                    updated.add(n.target.id)
                elif isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Name) \
                        and (getattr(n.func, "attr", None) or getattr(n.func, "id", "")
                             ).startswith("atomic_"):
                    updated.add(n.args[0].id)  # ti.atomic_add(s, 1) on a kernel-scope s
    out: Dict[str, str] = {}
    used: Dict[str, int] = {}
    for nm, t in init.items():
        if nm in updated and used.get(t, 0) < REDUCE_SLOTS:
            out[nm] = reduce_slot(t, used.get(t, 0)) + "[]"
            used[t] = used.get(t, 0) + 1
    return out


def translate_func(prog: Program, f: Func, name: str, statics: Dict[str, Any],
                   params: List[Tuple[str, Optional[str]]], ret: Optional[str]) -> None:
    p = prog.parse(f.fn)
    tr = Translator(prog, p, name, statics, "func")
    assigned = _assigned_names(p.fd.body)
    decl, pro = [], []
    for pn, pt in params:
        nm = pn + "_arg" if (pn in assigned or pn in RESERVED or pn in prog.rt.field_names) \
            else pn
        decl.append(nm + (f": {pt}" if pt else ""))
        if nm != pn:
            fb = tr.declare(pn, p.fd)
            pro.append(f"var {fb} = {nm}")
        else:
            tr.scopes[0][pn] = pn
    for line in pro:
        tr.emit(line, p.fd)
    for st in p.fd.body:
        tr.stmt(st)
    head = f"func {name}({', '.join(decl)})" + (f" -> {ret}" if ret else "") + " {"
    prog.func_lines += ([(head, (p.file, p.line(p.fd)))] + tr.lines +
                        [("}", (p.file, p.line(p.fd)))])
