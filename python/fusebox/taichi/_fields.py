"""Fields and the SNode tree of fusebox.taichi, turned into a .fbk layout.

A field declared with ``shape=`` gets a dense block of its own (Taichi's
layout); ``ti.root.dense(...).place(...)`` builds the tree explicitly. The
layout is sent when the runtime materializes (first launch or first
Python-scope access); after that no field may be declared.
"""
from __future__ import annotations

import keyword
import sys
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from fusebox.taichi import _types
from fusebox.taichi._errors import TaichiRuntimeError, TaichiSyntaxError

_AXES = "ijkl"


class Axes:
    """ti.i, ti.ij, ti.ijk, ti.axes(0, 1): the axes an SNode splits."""

    def __init__(self, *ax: int):
        if not ax or any(not 0 <= a < 4 for a in ax) or len(set(ax)) != len(ax):
            raise ValueError(f"axes {ax}: give distinct axes from 0 to 3")
        self.ax = tuple(int(a) for a in ax)

    def __repr__(self) -> str:
        return "ti." + "".join(_AXES[a] for a in self.ax)


def axes(*ax: int) -> Axes:
    return Axes(*ax)


i, j, k, l = Axes(0), Axes(1), Axes(2), Axes(3)
ij, ik, jk, ijk, ijkl = Axes(0, 1), Axes(0, 2), Axes(1, 2), Axes(0, 1, 2), Axes(0, 1, 2, 3)


def _where(depth: int = 3) -> Tuple[Any, ...]:
    """The user's file, line, globals and frame a declaration came from
    (the first frame outside this package); the frame, kept until the
    layout is made, gives the name of a field declared in a function."""
    f: Any = sys._getframe(1)
    while f is not None and f.f_globals.get("__name__", "").startswith("fusebox.taichi"):
        f = f.f_back
    if f is None:
        return "<unknown>", 0, {}, None
    return f.f_code.co_filename, f.f_lineno, f.f_globals, f


def _names_of(obj: Any, where: Tuple[Any, ...]) -> str:
    """The variable of the declaring scope that holds obj ("" if none)."""
    fr = where[3]
    scopes = ([fr.f_locals] if fr is not None and fr.f_locals is not where[2] else []) + \
        [where[2]]
    for sc in scopes:
        for nm, v in list(sc.items()):
            if v is obj and not nm.startswith("__"):
                return nm
    if fr is not None and fr.f_locals is not where[2]:
        for v in list(fr.f_locals.values()):  # self.x = ti.field(...) in a method
            d = getattr(v, "__dict__", None)
            if isinstance(d, dict):
                for nm, a in list(d.items()):
                    if a is obj and not nm.startswith("_"):
                        return nm
    return ""


class SNode:
    """A node of the layout tree (ti.root and what .dense/.pointer/
    .bitmasked/.dynamic make)."""

    def __init__(self, rt: Any, kind: str, parent: Optional["SNode"], ax: Tuple[int, ...],
                 sizes: Tuple[int, ...], chunk: int = 0):
        self._rt = rt
        self.kind = kind
        self.parent = parent
        self.ax = ax
        self.sizes = sizes
        self.chunk = chunk
        self.children: List[Any] = []  # SNodes and fields, in order
        self.name: Optional[str] = None
        self.where = _where()

    # -- building
    def _child(self, kind: str, a: Any, sizes: Any, chunk: int = 0) -> "SNode":
        self._rt._check_open_layout("ti.root." + kind + "(...)")
        if isinstance(a, (list, tuple)):
            a = Axes(*a)
        if not isinstance(a, Axes):
            raise TypeError(f"{kind}(): the first argument is the axes (ti.i, ti.ij, ti.ijk or "
                            f"ti.axes(...)), not {a!r}")
        sz = (sizes,) * len(a.ax) if isinstance(sizes, (int, np.integer)) else tuple(sizes)
        if len(sz) == 1 and len(a.ax) > 1:
            sz = sz * len(a.ax)  # one size for every axis, as Taichi takes it
        if len(sz) != len(a.ax) or any(int(s) < 1 for s in sz):
            raise ValueError(f"{kind}({a!r}, {sizes!r}): give one size >= 1 per axis")
        used = self._axes_above()
        if kind == "dynamic" and len(a.ax) != 1:
            raise ValueError("dynamic(): exactly one axis")
        s = SNode(self._rt, kind, self, a.ax, tuple(int(x) for x in sz), chunk)
        del used
        self.children.append(s)
        return s

    def _axes_above(self) -> set:
        out, n = set(), self
        while n is not None:
            out.update(n.ax)
            n = n.parent
        return out

    def dense(self, a: Any, dimensions: Any) -> "SNode":
        return self._child("dense", a, dimensions)

    def pointer(self, a: Any, dimensions: Any) -> "SNode":
        return self._child("pointer", a, dimensions)

    def bitmasked(self, a: Any, dimensions: Any) -> "SNode":
        return self._child("bitmasked", a, dimensions)

    def dynamic(self, a: Any, dimension: Any, chunk_size: Optional[int] = None) -> "SNode":
        n = int(dimension if isinstance(dimension, (int, np.integer)) else dimension[0])
        return self._child("dynamic", a, n, int(chunk_size or min(n, 1024)))

    def place(self, *fields: Any, offset: Any = None) -> "SNode":
        if offset is not None:
            raise TaichiSyntaxError("place(..., offset=...) is not supported by fusebox.taichi: "
                                    "subtract the offset in the index instead")
        self._rt._check_open_layout("place(...)")
        for f in fields:
            if not isinstance(f, Field):
                raise TypeError(f"place(): {f!r} is not a field")
            if isinstance(f, DualField):  # place(x, x.dual): the dual lives beside x
                if f.primal.snode is not None and f.primal.snode is not self:
                    raise TaichiSyntaxError(_grad_beside(f.primal).replace("gradient", "dual")
                                            .replace("needs_grad", "needs_dual"))
                continue
            if isinstance(f, GradField):
                self._place_grad(f)
                continue
            if f.snode is not None:
                raise ValueError(f"place(): field {f!r} is placed already")
            if f.grad_snode is not None and f.grad_snode is not self:
                raise TaichiSyntaxError(_grad_beside(f))
            f.snode = self
            self.children.append(f)
        return self

    def _place_grad(self, g: "GradField") -> None:
        """place(x.grad) (Taichi's explicit placement of a gradient, e.g.
        ``ti.root.dense(ti.i, N).place(x, x.grad)``): fusebox keeps a
        gradient beside its field (``place x: f32 grad``), so x.grad must go
        to the SNode x goes to; it gives x its gradient."""
        f = g.primal
        if f.grad_snode is not None:
            raise ValueError(f"place(): the gradient of field {f!r} is placed already")
        if f.snode is not None and f.snode is not self:
            raise TaichiSyntaxError(_grad_beside(f))
        f.grad_snode = self
        f.needs_grad = True

    def lazy_grad(self) -> None:
        """Give every float field placed below this SNode a gradient (as
        if declared with needs_grad=True)."""
        self._rt._check_open_layout("lazy_grad()")
        for f in self._fields_below():
            if f.dtype.fbk.startswith("f"):
                f.needs_grad = True

    def lazy_dual(self) -> None:
        """Give every float field placed below this SNode a dual (as if
        declared with needs_dual=True): forward mode, ti.ad.FwdMode."""
        self._rt._check_open_layout("lazy_dual()")
        for f in self._fields_below():
            if f.dtype.fbk.startswith("f"):
                f.needs_dual = True

    # -- properties
    @property
    def shape(self) -> Tuple[int, ...]:
        ext = [1] * 4
        n: Optional[SNode] = self
        used = set()
        while n is not None:
            for a, s in zip(n.ax, n.sizes):
                ext[a] *= s
                used.add(a)
            n = n.parent
        return tuple(ext[a] for a in sorted(used))

    def _need_name(self) -> str:
        if self.kind == "root":
            raise TaichiSyntaxError("ti.root itself cannot be used here: use a field or an "
                                    "SNode made by dense/pointer/bitmasked/dynamic")
        self._rt._materialize()
        assert self.name
        return self.name

    def deactivate_all(self) -> None:
        """Deactivate every cell of this SNode (a kernel of the package's
        own: a struct-for over the SNode that deactivates each cell); on a
        dense SNode, the sparse SNodes below it."""
        rt = self._rt
        rt._materialize()
        if self.kind in ("root", "dense"):
            for c in self.children:
                if isinstance(c, SNode):
                    c.deactivate_all()
            return
        nm = self._need_name()
        idx = ", ".join(f"i{d}" for d in range(len(self.shape)))
        kname = f"deactivate_all_{nm}"
        rt.launch_helper(("deactivate_all", nm), kname,
                         [f"kernel {kname}() {{", f"  for {idx} in {nm} {{",
                          f"    deactivate({nm}, {idx})", "  }", "}"],
                         f"deactivate_all of {self.kind} SNode")

    def _fields_below(self) -> List["Field"]:
        out: List[Field] = []
        for c in self.children:
            if isinstance(c, Field):
                out.append(c)
            else:
                out.extend(c._fields_below())
        return out

    def __repr__(self) -> str:
        return f"<ti SNode {self.kind}{self.sizes}>"


class Field:
    """A field: ``ti.field``, ``ti.Vector.field`` or ``ti.Matrix.field``.
    Python-scope access (``x[i]``, ``to_numpy``, ...) materializes the
    runtime and goes to the session's field."""

    def __init__(self, rt: Any, dtype: _types.DataType, elem: Tuple[int, ...], name: str = ""):
        self._rt = rt
        self.dtype = dtype
        self.elem = elem
        self.snode: Optional[SNode] = None
        self.name = ""  # the .fbk name, given when the layout is made
        self.hint = name
        self.where = _where()
        self.n = elem[0] if elem else None
        self.m = elem[1] if len(elem) > 1 else None
        self.needs_grad = False
        self.grad_snode: Optional[SNode] = None  # where place(x.grad) put the gradient
        self._grad: Optional["GradField"] = None
        self.needs_dual = False
        self._dual: Optional["DualField"] = None

    @property
    def shape(self) -> Tuple[int, ...]:
        if self.snode is None:
            raise TaichiRuntimeError("this field is not placed yet (ti.root....place(x))")
        return self.snode.shape if self.snode.kind != "root" else ()

    @property
    def grad(self) -> "GradField":
        """The gradient field (``place x: T grad`` in the layout; its .fbk
        name is ``x.grad``): Python-scope access and ``x.grad[i]`` in
        kernels, like any field."""
        if not self.needs_grad and self._grad_placeable():
            if self._grad is None:
                self._grad = GradField(self)
            return self._grad  # to be placed: ti.root....place(x, x.grad)
        if not self.needs_grad:
            raise self._no_grad()
        if self._grad is None:
            self._grad = GradField(self)
        return self._grad

    @property
    def dual(self) -> "DualField":
        """The dual field (forward mode; ``place x: T dual`` in the layout,
        its .fbk name ``x.dual``): Python-scope access and ``x.dual[i]`` in
        kernels, like any field."""
        if not self.needs_dual:
            raise TaichiRuntimeError(
                f"field '{self.name or self.hint or '?'}' (declared at {self.where[0]}:"
                f"{self.where[1]}) has no dual: declare it with needs_dual=True (or call "
                "ti.root.lazy_dual() after placing it)")
        if self._dual is None:
            self._dual = DualField(self)
        return self._dual

    def _no_grad(self) -> TaichiRuntimeError:
        return TaichiRuntimeError(
            f"field '{self.name or self.hint or '?'}' (declared at {self.where[0]}:"
            f"{self.where[1]}) has no gradient: declare it with needs_grad=True (or call "
            "ti.root.lazy_grad() after placing it)")

    def _grad_placeable(self) -> bool:
        """Taichi gives every float field a gradient field that may be
        placed explicitly; here only while the layout is open."""
        return (self.dtype.fbk.startswith("f") and self._rt.session is None
                and not isinstance(self, GradField))

    def fbk_type(self) -> str:
        return self.dtype.fbk + "".join(f"[{e}]" for e in self.elem)

    def _f(self) -> Any:
        from fusebox.taichi import _runtime
        if self._rt is not _runtime.rt() or self._rt.closed:
            raise TaichiRuntimeError(f"field '{self.name or self.hint or '?'}' belongs to an "
                                     "earlier ti.init() (or ti.reset()): declare the fields "
                                     "again after ti.init")
        self._rt._materialize()
        return self._rt.session.fields[self.name]

    @staticmethod
    def _key(key: Any) -> Any:
        if key is None:
            return ()
        if isinstance(key, (list, np.ndarray)) and np.asarray(key).ndim == 1:
            return tuple(int(x) for x in key)
        return key

    # Python-scope reads of one cell (x[i, j]) of fields at least this big
    # launch a kernel that returns the cell instead of reading the field
    CELL_READ_MIN = 64

    def _cell(self, k: Any) -> Any:
        """x[i, j] of one cell of a big scalar field under dense SNodes
        only: one launch of a kernel returning that cell (the package's
        own, registered once per field), its value from the sync, instead
        of the whole field read to take one number (what to_numpy()[k]
        costs: a 1024 x 1024 f32 field moves 4 MiB). The same value:
        the cell as stored, as a Python number. None where this does not
        apply (the caller reads the field)."""
        sh = self.shape
        if isinstance(k, (int, np.integer)):
            k = (k,)
        if self.elem or not isinstance(k, tuple) or len(k) != len(sh) or not sh or \
                self.dtype.fbk not in ("f32", "f64", "i32", "i64") or \
                int(np.prod(sh)) < self.CELL_READ_MIN or isinstance(self, GradField) or \
                not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in k):
            return None
        n: Optional[SNode] = self.snode
        while n is not None:
            if n.kind not in ("dense", "root"):
                return None  # a sparse cell: the field read says what is active
            n = n.parent
        idx = tuple(int(x) + (d if x < 0 else 0) for x, d in zip(k, sh))
        if not all(0 <= x < d for x, d in zip(idx, sh)):
            return None  # the field read raises NumPy's IndexError
        from fusebox._proto import pb
        rt = self._rt
        self._f()
        nm = self.name
        key = ("cell", nm)
        kid = rt.helpers.get(key)
        if kid is None:
            kname = "cell_" + nm.replace(".", "__")
            ix = [f"i{d}" for d in range(len(sh))]
            body = [f"kernel {kname}({', '.join(x + ': i32' for x in ix)}) -> {self.dtype.fbk} {{",
                    f"  return {nm}[{', '.join(ix)}]", "}"]
            kid = rt.helpers[key] = rt.register(rt.layout + [(ln, ("", 0)) for ln in body], kname,
                                                f"reading a cell of field '{nm}'")
        rt.launch(kid, [pb.Value(type=2, i=x) for x in idx])
        res = rt.session.sync()
        rt.cell_reads += 1
        return res.returns[-1][2]

    def __getitem__(self, key: Any) -> Any:
        k = self._key(key)
        v = self._cell(k)
        if v is not None:
            return v
        v = self._f()[k]
        if isinstance(v, np.ndarray) and v.ndim == 0 or isinstance(v, np.generic):
            return v.item()
        if self.elem and isinstance(v, np.ndarray) and v.shape == self.elem:
            from fusebox.taichi._ops import TiArray
            # as Taichi's Python-scope vectors: entries are Python numbers
            # (float64 / int64 once made an array again)
            e = v.astype(np.float64 if v.dtype.kind == "f" else np.int64).view(TiArray)
            e._owner = (self, key)  # v[i].x = 1 writes the element back
            return e
        return v

    def __setitem__(self, key: Any, value: Any) -> None:
        value = np.asarray(value)
        if value.dtype != self.dtype.np:
            value = value.astype(self.dtype.np)  # Taichi converts on assignment
        self._f()[self._key(key)] = value

    def to_numpy(self, dtype: Any = None) -> np.ndarray:
        a = self._f().to_numpy()
        return a if dtype is None else a.astype(dtype)

    def from_numpy(self, arr: Any) -> None:
        a = np.asarray(arr)
        self._f().from_numpy(a.astype(self.dtype.np, copy=False))

    def fill(self, value: Any) -> None:
        """Set every active element to value. As in Taichi this is a
        kernel over the field's active cells (a struct-for), so a sparse
        field's inactive cells stay inactive; a vector value for a vector
        field writes every cell (and activates it)."""
        self._f()
        v = np.asarray(value)
        if v.ndim:
            self._f().fill(v.astype(self.dtype.np))
            return
        from fusebox.taichi._runtime import _wire_value
        nm, t = self.name, self.dtype.fbk
        val = "v" if not self.elem else f"{self.fbk_type()}(v)"
        nd = len(self.shape)
        idx = ", ".join(f"i{d}" for d in range(nd))
        kname = "fill_" + nm.replace(".", "__")
        body = ([f"kernel {kname}(v: {t}) {{"] +
                ([f"  {nm}[] = {val}"] if nd == 0 else
                 [f"  for {idx} in {nm} {{", f"    {nm}[{idx}] = {val}", "  }"]) + ["}"])
        self._rt.launch_helper(("fill", nm), kname, body, f"fill of field '{nm}'",
                               [_wire_value(t, v.item(), f"fill of field '{nm}'")])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.to_numpy(dtype)

    def copy_from(self, other: "Field") -> None:
        self.from_numpy(other.to_numpy())

    def parent(self) -> SNode:
        assert self.snode is not None
        return self.snode

    def snode_(self) -> SNode:
        assert self.snode is not None
        return self.snode

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<ti field {self.name or self.hint or '?'} {self.fbk_type()} shape={self.shape}>"


class GradField(Field):
    """x.grad: the gradient of a field, a field of the same type and shape
    placed beside it (docs/autodiff.md "Gradient places")."""

    def __init__(self, primal: Field):
        super().__init__(primal._rt, primal.dtype, primal.elem, "")
        self.primal = primal
        self.where = primal.where

    _suffix = ".grad"

    @property  # type: ignore[override]
    def name(self) -> str:
        return self.primal.name + self._suffix if self.primal.name else ""

    @name.setter
    def name(self, v: str) -> None:
        pass

    @property  # type: ignore[override]
    def snode(self) -> Optional[SNode]:
        return self.primal.snode

    @snode.setter
    def snode(self, v: Any) -> None:
        pass

    def _f(self) -> Any:
        if not self.primal.needs_grad:  # taken while the layout was open, never placed
            raise self.primal._no_grad()
        return super()._f()

    @property
    def grad(self) -> "GradField":
        raise TaichiRuntimeError("a gradient field has no gradient of its own (second "
                                 "derivatives are not supported)")

    @property
    def dual(self) -> "DualField":
        raise TaichiRuntimeError("a gradient or dual field has no dual of its own (second "
                                 "derivatives are not supported)")

    def __repr__(self) -> str:
        return f"<ti field {self.name or '?'} {self.fbk_type()} shape={self.shape}>"


class DualField(GradField):
    """x.dual: the dual (tangent) of a field in forward mode, a field of the
    same type and shape placed beside it (docs/autodiff.md "Forward mode")."""
    _suffix = ".dual"

    def _f(self) -> Any:
        return Field._f(self)  # x.dual exists only for a field declared with a dual


def _grad_beside(f: Field) -> str:
    return (f"place(): the gradient of field '{f.hint or _names_of(f, f.where) or '?'}' "
            f"(declared at {f.where[0]}:{f.where[1]}) must be placed in the same SNode as the "
            "field (fusebox keeps a gradient beside its field): place(x, x.grad) together, or "
            "declare the field with needs_grad=True")


def shape_tuple(shape: Any) -> Tuple[int, ...]:
    if shape is None:
        return ()
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def name_fields(fields: Sequence[Field], snodes: Sequence[SNode]) -> None:
    """Give every field a .fbk name: the name the user's module gives it
    where there is one, else f0, f1, ...; SNodes that kernels may loop
    over or (de)activate get block0, block1, ..."""
    from fusebox.taichi._translate import RESERVED
    taken: set = set()

    def free(base: str) -> str:
        if not base.isidentifier() or keyword.iskeyword(base) or base in RESERVED:
            base = base + "_" if base.isidentifier() else "field"
        n, k = base, 1
        while n in taken:
            k += 1
            n = f"{base}_{k}"
        taken.add(n)
        return n

    taken.update(f.name for f in fields if f.name)  # named by an earlier layout: kept
    taken.update(s.name for s in snodes if s.name)
    for f in fields:
        if not f.name:
            f.name = free(f.hint or _names_of(f, f.where) or f"f{len(taken)}")
        f.where = f.where[:3]  # the frame is not needed any more
    for s in snodes:
        if not s.name:
            s.name = free(_names_of(s, s.where) or f"block{len(taken)}")
        s.where = s.where[:3]


def layout_lines(root: SNode) -> List[Tuple[str, Tuple[str, int]]]:
    """The layout block: (text, (file, line)) per line."""
    out: List[Tuple[str, Tuple[str, int]]] = [("layout {", ("", 0))]

    def walk(n: SNode, ind: str) -> None:
        for c in n.children:
            if isinstance(c, Field):
                g = (" grad" if c.needs_grad else "") + (" dual" if c.needs_dual else "")
                out.append((f"{ind}place {c.name}: {c.fbk_type()}{g}", c.where[:2]))
            else:
                ax = "".join(_AXES[a] for a in c.ax)
                szs = ", ".join(str(s) for s in c.sizes)
                if c.kind == "dynamic":
                    szs += f", chunk: {c.chunk}"
                nm = f" as {c.name}" if c.name else ""
                out.append((f"{ind}{c.kind}({ax}: {szs}){nm} {{", c.where[:2]))
                walk(c, ind + "  ")
                out.append((f"{ind}}}", c.where[:2]))

    walk(root, "  ")
    out.append(("}", ("", 0)))
    return out
