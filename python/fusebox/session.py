"""Sessions on fuseboxd: kernels as callables, fields as NumPy arrays.

A session is made from ``.fbk`` source that the server parses
(DescribeSource, CreateSession and RegisterKernels carry the source; see
docs/python.md). Launches are batched on the session's stream and run in
order; :meth:`Session.sync` waits for them and raises :class:`LaunchError`
for any that failed. Field reads and writes first sync, so they see every
launch made before them.
"""
from __future__ import annotations

import math
import json
import logging
import os
import queue
import tempfile
import re
import secrets
import struct
import threading
import time
import warnings
from dataclasses import dataclass, fields as dc_fields
from typing import (Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union)

import grpc
import numpy as np

from fusebox import _wire
from fusebox import autodiff as _ad
from fusebox._proto import pb
from fusebox.errors import (ConnectionLostError, DeadlineExceededError, Error, LaunchError, LayoutWarning,
                            NotFoundError, ServerError, SessionLostError, from_rpc,
                            replica_gone)

#: Bytes of field data per message (under the 4 MiB message limit;
#: FB_CHUNK_BYTES_DEFAULT of include/fusebox/limits.h, tests/test_lists.py).
CHUNK_BYTES = 1 << 20
#: CreateSession refused by a draining replica is tried again with a new
#: routing key this many times in all (among 3 replicas, one draining, all
#: fail with chance (1/3)**12)
CREATE_TRIES = 12
#: Messages of launches sent since the last answered sync that the session
#: keeps, to send again when it resumes from a drain's checkpoint.
INFLIGHT_KEPT = 256
#: The name of a drained session's checkpoint in the reason its replica
#: gives (server/drain.c): "... its state is in checkpoint NAME (Restore ...".
_DRAIN_CKPT = re.compile(r"its state is in checkpoint (\S+) \(Restore it by that name")
#: Moves of sessions off draining replicas are logged here at INFO.
log = logging.getLogger("fusebox")
#: With progress=None, transfers of at least this many bytes show a tqdm
#: bar (when tqdm is installed).
PROGRESS_BYTES = 64 << 20
#: A partial write (``f[key] = v``) of at most this many cells goes as cell
#: writes (launches of a kernel the package adds); a larger one reads the
#: field, changes it and writes it back whole, when every cell is active.
CELL_WRITES = 4096

# ScalarType numbers of the protocol (fb_type) -> (name, NumPy dtype)
_TYPES = {
    1: ("bool", np.dtype(np.bool_)), 2: ("i32", np.dtype(np.int32)),
    3: ("i64", np.dtype(np.int64)), 4: ("u32", np.dtype(np.uint32)),
    5: ("u64", np.dtype(np.uint64)), 6: ("f32", np.dtype(np.float32)),
    7: ("f64", np.dtype(np.float64)),
}
_INT_RANGE = {2: (-2**31, 2**31 - 1), 3: (-2**63, 2**63 - 1), 4: (0, 2**32 - 1),
              5: (0, 2**64 - 1)}


def type_name(t: int) -> str:
    """The .fbk name of a ScalarType number ("f32", ...; "void" for 0)."""
    return _TYPES[t][0] if t in _TYPES else "void"


def _source_pb(source: str, params: Optional[Mapping[str, Any]], filename: str) -> Any:
    if not isinstance(source, str):
        raise TypeError(f"source must be a str (the .fbk program), not {type(source).__name__}")
    ps = {}
    for k, v in (params or {}).items():
        ps[str(k)] = (v if isinstance(v, str) else ("true" if v else "false")
                      if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v))
    return pb.Source(text=source, filename=filename or "<source>", params=ps)


# ------------------------------------------------------------------ records

#: The counters that are levels, not cumulative (LEVEL in FB_COUNTERS,
#: include/fusebox/counters.h; tests/test_lists.py checks the two agree).
_LEVEL_COUNTERS = ("device_bytes", "tasks_pending")


@dataclass
class Counters:
    """The session's counters (mirrors fb_counters): cumulative since the
    session was made, except device_bytes and tasks_pending."""
    launches: int = 0
    tasks_launched: int = 0
    statements_emitted: int = 0
    tasks_compiled: int = 0
    cache_hits: int = 0
    backend_s: float = 0.0
    compile_s: float = 0.0
    listgens_removed: int = 0
    tasks_fused: int = 0
    dead_stores_removed: int = 0
    activations_demoted: int = 0
    optimizer_s: float = 0.0
    device_bytes: int = 0
    flushes: int = 0
    tasks_pending: int = 0
    fuse_refused: int = 0
    fuse_fallbacks: int = 0
    plans_reused: int = 0  # async: flushes whose optimized batch a repeated window reused

    @classmethod
    def _from_pb(cls, m: Any) -> "Counters":
        return cls(**{f.name: getattr(m, f.name) for f in dc_fields(cls)})

    def since(self, earlier: "Counters") -> "Counters":
        """What happened between earlier and these counters: each
        cumulative figure less earlier's (device_bytes and tasks_pending
        are kept, being levels). The flush figures of async mode (flushes,
        tasks_fused, listgens_removed, dead_stores_removed,
        activations_demoted, fuse_refused, fuse_fallbacks, plans_reused, optimizer_s)
        then describe the flushes in between."""
        return Counters(**{f.name: getattr(self, f.name) if f.name in _LEVEL_COUNTERS
                           else getattr(self, f.name) - getattr(earlier, f.name)
                           for f in dc_fields(Counters)})


@dataclass
class LaunchFailure:
    """One failed launch: its sequence number (1-based, 0 when the failure
    is not about one launch), kernel name, FB_E* code and message."""
    seq: int
    kernel: str
    code: int
    message: str


@dataclass
class SyncResult:
    """What a sync returns: launches completed so far, the return values of
    kernels that return one as (seq, kernel, value), and the counters."""
    seq: int
    returns: List[Tuple[int, str, Any]]
    counters: Counters


@dataclass
class Param:
    """A kernel parameter: a ``field`` parameter, or a scalar of a type."""
    name: str
    is_field: bool
    type: str  # "f32", ...; "field" for field parameters

    def __str__(self) -> str:
        return f"{self.name}: {self.type}"


class FieldInfo:
    """A field of a program: name, index shape, element shape and dtype."""

    def __init__(self, m: Any):
        self.name: str = m.name
        self.dtype: np.dtype = _TYPES[m.type][1]
        self.index_shape: Tuple[int, ...] = tuple(int(x) for x in m.shape)
        self.element_shape: Tuple[int, ...] = (
            () if not m.rows else (m.rows,) if not m.cols else (m.rows, m.cols))
        #: the NumPy shape of the whole field: index shape then element shape
        self.shape: Tuple[int, ...] = self.index_shape + self.element_shape
        self.places: List[int] = list(m.places)
        #: kind of the SNode holding its cells ("dense", "bitmasked",
        #: "pointer", "dynamic", "root"); "" from a server that predates it
        self.container: str = getattr(m, "container", "")

    def __repr__(self) -> str:
        return f"FieldInfo({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class SNodeInfo:
    """A named SNode of a program (``as NAME``): kind, cell-space shape and
    the fields placed below it."""

    def __init__(self, m: Any):
        self.name: str = m.name
        self.kind: str = m.kind
        self.shape: Tuple[int, ...] = tuple(int(x) for x in m.shape)
        self.fields: List[str] = list(m.fields)

    def __repr__(self) -> str:
        return f"SNodeInfo({self.name!r}, {self.kind}, shape={self.shape})"


class KernelInfo:
    """A kernel of a program: its parameters and return type."""

    def __init__(self, m: Any):
        self.name: str = m.name
        self.params: List[Param] = [
            Param(p.name, p.is_field, "field" if p.is_field else type_name(p.type))
            for p in m.params]
        self._types = [p.type for p in m.params]
        self.ret: Optional[str] = None if m.ret == 0 else type_name(m.ret)
        self._ret_type = m.ret
        #: ``kernel k(...) grad k_adj``: the kernel that is its custom adjoint
        #: (docs/autodiff.md "Custom gradients"), else None
        self.grad: Optional[str] = getattr(m, "grad", "") or None

    @property
    def signature(self) -> str:
        """"step(A: field, B: field, k: f32)" and " -> T" when it returns."""
        s = f"{self.name}({', '.join(str(p) for p in self.params)})"
        return s + (f" -> {self.ret}" if self.ret else "")

    def __repr__(self) -> str:
        return f"KernelInfo({self.signature})"


class Program:
    """Fields and kernels of a ``.fbk`` program, as the server parsed it."""

    def __init__(self, m: Any):
        self.fields: Dict[str, FieldInfo] = {f.name: FieldInfo(f) for f in m.fields}
        self.kernels: Dict[str, KernelInfo] = {k.name: KernelInfo(k) for k in m.kernels}
        self.snodes: Dict[str, SNodeInfo] = {n.name: SNodeInfo(n)
                                             for n in getattr(m, "snodes", ())}
        #: the front end's warnings ("file:line:col: warning: ..."), advice only
        self.warnings: List[str] = list(getattr(m, "warnings", ()))

    def _warn(self, stacklevel: int) -> None:
        """Each warning as a :class:`fusebox.LayoutWarning`."""
        for w in self.warnings:
            warnings.warn(w, LayoutWarning, stacklevel=stacklevel + 1)


# ------------------------------------------------------------------ values

def _value(k: KernelInfo, i: int, x: Any) -> Any:
    """The wire Value of argument i of kernel k, checked against its type."""
    t = k._types[i]
    p = k.params[i]
    where = f"{k.name}(): argument '{p.name}' ({p.type})"
    if isinstance(x, np.generic):
        x = x.item()
    if t == 1:
        if not isinstance(x, (bool, int)):
            raise TypeError(f"{where} must be a bool, not {type(x).__name__}")
        return pb.Value(type=t, i=int(bool(x)))
    if t in _INT_RANGE:
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"{where} must be an int, not {type(x).__name__}")
        lo, hi = _INT_RANGE[t]
        if not lo <= x <= hi:
            raise ValueError(f"{where}: {x} is out of range [{lo}, {hi}]")
        return pb.Value(type=t, i=x) if t in (2, 3) else pb.Value(type=t, u=x)
    if t in (6, 7):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{where} must be a number, not {type(x).__name__}")
        v = float(x)
        if t == 6:
            v = float(np.float32(v)) if math.isfinite(v) and abs(v) <= 3.4028234663852886e38 \
                else v
        return pb.Value(type=t, f_bits=struct.unpack("<Q", struct.pack("<d", v))[0])
    raise TypeError(f"{where}: parameter type {t} is not supported")


_DTYPE_TO_TYPE = {d: t for t, (_, d) in _TYPES.items()}


def _np_value(t: int, x: Any) -> Any:
    """The wire Value of type t holding x, already of the field's dtype."""
    x = x.item() if isinstance(x, np.generic) else x
    if t in (2, 3):
        return pb.Value(type=t, i=int(x))
    if t in (4, 5):
        return pb.Value(type=t, u=int(x))
    if t in (6, 7):
        return pb.Value(type=t, f_bits=struct.unpack("<Q", struct.pack("<d", float(x)))[0])
    return pb.Value(type=t, i=int(bool(x)))


def _from_value(v: Any) -> Any:
    t = v.type
    if t == 1:
        return bool(v.i)
    if t in (2, 3):
        return int(v.i)
    if t in (4, 5):
        return int(v.u)
    if t in (6, 7):
        return struct.unpack("<d", struct.pack("<Q", v.f_bits))[0]
    return None


# ------------------------------------------------------------------ kernels

class Kernel:
    """A kernel of the session, callable: ``s.kernels.step(T, U, k=0.2)``.

    Arguments are bound as in a Python call (positional, then by name) and
    checked against the kernel's signature; ``field`` parameters take a
    :class:`Field` or a field's name. A kernel that returns a value syncs
    and returns it; others return None at once (async mode runs them later).
    """

    def __init__(self, session: "Session", info: KernelInfo):
        self._s = session
        self.info = info
        self.__doc__ = f"Launch {info.signature}."

    @property
    def name(self) -> str:
        """The kernel's name."""
        return self.info.name

    def _bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> List[Any]:
        ps = self.info.params
        if len(args) > len(ps):
            raise TypeError(f"{self.info.signature} takes {len(ps)} argument"
                            f"{'s' if len(ps) != 1 else ''} but {len(args)} were given")
        bound: List[Any] = list(args) + [_MISSING] * (len(ps) - len(args))
        names = [p.name for p in ps]
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"{self.info.signature} has no parameter '{k}'")
            i = names.index(k)
            if bound[i] is not _MISSING:
                raise TypeError(f"{self.info.signature} got two values for '{k}'")
            bound[i] = v
        missing = [ps[i].name for i, v in enumerate(bound) if v is _MISSING]
        if missing:
            raise TypeError(f"{self.info.signature} is missing argument"
                            f"{'s' if len(missing) > 1 else ''} "
                            + ", ".join(f"'{m}'" for m in missing))
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._s._launch(self, self._bind(args, kwargs))

    @property
    def grad(self) -> "_ad.GradKernel":
        """The kernel's adjoint, callable with its arguments (docs/autodiff.md)."""
        return _ad.GradKernel(self)

    @property
    def dual(self) -> "_ad.DualKernel":
        """The kernel's tangent (forward mode), callable with its arguments
        (docs/autodiff.md "Forward mode")."""
        return _ad.DualKernel(self)

    def __repr__(self) -> str:
        return f"<fusebox kernel {self.info.signature}>"


class _Missing:
    pass


_MISSING = _Missing()


class _Namespace:
    """Attribute and item access to a session's kernels or fields."""

    def __init__(self, what: str, items: Dict[str, Any]):
        object.__setattr__(self, "_what", what)
        object.__setattr__(self, "_items", items)

    def __getattr__(self, name: str) -> Any:
        items = object.__getattribute__(self, "_items")
        if name in items:
            return items[name]
        if name.startswith("__"):
            raise AttributeError(name)
        what = object.__getattribute__(self, "_what")
        raise NotFoundError(f"no {what} '{name}' in the program (it has: "
                            f"{', '.join(sorted(items)) or 'none'})")

    __getitem__ = __getattr__

    def __setattr__(self, name: str, value: Any) -> None:
        f = self.__getattr__(name)
        if not isinstance(f, Field):
            raise AttributeError(f"cannot assign to {self._what} '{name}'")
        f.from_numpy(value)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __dir__(self) -> List[str]:
        return sorted(self._items)

    def __repr__(self) -> str:
        return f"<{self._what}s: {', '.join(self._items)}>"


# ------------------------------------------------------------------ fields

class Field:
    """A field of the session as a NumPy array on the server.

    ``f.to_numpy()`` reads it; ``f.from_numpy(a)`` or ``f[:] = a`` writes
    it (a scalar fills it); ``f[i, j]`` reads and indexes. Shapes must
    match exactly; dtypes must convert with NumPy's "same_kind" casting
    (float64 into an f32 field is fine, a float into an i32 field is not).
    Transfers go in chunks of :data:`CHUNK_BYTES`. For sparse fields,
    :meth:`active` gives the active cells' indices and values.
    """

    def __init__(self, session: "Session", info: FieldInfo):
        self._s = session
        self.info = info

    name = property(lambda self: self.info.name)
    shape = property(lambda self: self.info.shape, doc="NumPy shape of the whole field")
    dtype = property(lambda self: self.info.dtype, doc="NumPy dtype of an element")
    ndim = property(lambda self: len(self.info.shape))

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def grad(self) -> "Field":
        """The field holding this field's gradient ("x.grad"; docs/autodiff.md)."""
        return _ad.grad_field(self)

    @property
    def dual(self) -> "Field":
        """The field holding this field's dual ("x.dual", forward mode; docs/autodiff.md)."""
        return _ad.dual_field(self)

    def to_numpy(self, out: Optional[np.ndarray] = None, *, progress: Optional[bool] = None,
                 timeout: Optional[float] = None) -> np.ndarray:
        """The field's contents as an array of :attr:`shape` and :attr:`dtype`.

        Args:
            out: a C-contiguous, writeable array of exactly that shape and
                dtype to fill instead of a new one (it is returned).
            progress: show a tqdm bar (when tqdm is installed); None shows
                one for transfers of :data:`PROGRESS_BYTES` or more.
            timeout: seconds the read may take (default: the client's).

        Inactive cells of a sparse field read 0 (see :meth:`active`).
        """
        info = self.info
        if out is not None:
            self._check_out(out)
        else:
            out = np.empty(info.shape, dtype=info.dtype)
        if not info.element_shape:
            self._s._read(info.places[0], out, progress, timeout)
            return out
        flat = out.reshape(info.index_shape + (len(info.places),))
        comp = np.empty(info.index_shape, dtype=info.dtype)
        for c, p in enumerate(info.places):  # one transfer per component
            self._s._read(p, comp, progress, timeout)
            flat[..., c] = comp
        return out

    def _check_out(self, out: Any) -> None:
        info = self.info
        if not isinstance(out, np.ndarray):
            raise TypeError(f"field '{info.name}': out must be a numpy.ndarray, not "
                            f"{type(out).__name__}")
        if out.shape != info.shape or out.dtype != info.dtype:
            raise ValueError(f"field '{info.name}' is {info.shape} of {info.dtype}; out is "
                             f"{out.shape} of {out.dtype}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"field '{info.name}': out must be C-contiguous and writeable")

    def from_numpy(self, a: Any, *, progress: Optional[bool] = None,
                   timeout: Optional[float] = None) -> None:
        """Write the whole field from an array of :attr:`shape` (or a scalar,
        which fills it). Raises TypeError for a dtype that does not convert
        and ValueError for a wrong shape, naming the field. A C-contiguous
        array of the field's dtype is sent from its own memory. Every cell
        of a sparse field becomes active."""
        info = self.info
        if np.isscalar(a) or (isinstance(a, np.ndarray) and a.ndim == 0):
            arr = np.asarray(a)
            self._check_dtype(arr)
            arr = np.full(info.shape, arr, dtype=info.dtype)
        else:
            arr = np.asarray(a)
            self._check_dtype(arr)
            if arr.shape != info.shape:
                raise ValueError(f"field '{info.name}' has shape {info.shape}; the array's "
                                 f"shape is {arr.shape}")
            arr = np.ascontiguousarray(arr, dtype=info.dtype)  # no copy when it already is
        if not info.element_shape:
            self._s._write(info.places[0], arr, progress, timeout)
            return
        flat = arr.reshape(info.index_shape + (len(info.places),))
        for c, p in enumerate(info.places):
            self._s._write(p, np.ascontiguousarray(flat[..., c]), progress, timeout)

    def _check_dtype(self, arr: np.ndarray) -> None:
        dt = self.info.dtype
        if arr.dtype == dt:
            return
        if arr.dtype.kind in "OUSVmMc" or not np.can_cast(arr.dtype, dt, "same_kind"):
            raise TypeError(f"field '{self.info.name}' holds {type_name_of(dt)} ({dt}); an "
                            f"array of {arr.dtype} does not convert to it (same_kind casting)")

    def fill(self, value: Any) -> None:
        """Set every element to value."""
        self.from_numpy(value)

    def active_mask(self, *, timeout: Optional[float] = None) -> np.ndarray:
        """A bool array of the field's index shape: True where the cell is
        active. A field under no sparse container is all True. Reading it
        activates nothing (ReadField with ``active``)."""
        info = self.info
        m = np.empty(info.index_shape, dtype=np.uint8)
        self._s._read(info.places[0], m, False, timeout, active=True)
        return m.view(np.bool_)

    def active(self, *, timeout: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The active cells of a sparse field: ``(indices, values)``.

        indices is an int64 array of shape ``(n, index ndim)``, in row-major
        order; values has shape ``(n,) + element shape`` and the field's
        dtype, ``values[k]`` being the element at ``indices[k]``. A dense
        field gives every cell. ``f.to_numpy()[tuple(indices.T)]`` is
        values."""
        mask = self.active_mask(timeout=timeout)
        values = self.to_numpy(timeout=timeout)[mask]
        return np.argwhere(mask).astype(np.int64, copy=False), values

    def activate(self, indices: Any) -> None:
        """Make cells active without changing them (``activate`` of the
        language): indices is one cell's index tuple or an int array of
        shape (n, index ndim), as :meth:`active` gives. Runs in order with
        the launches (it is a launch of a kernel the package adds)."""
        self._s._cells("activate", self.info, self._indices(indices), None)

    def deactivate(self, indices: Any) -> None:
        """Make cells inactive (``deactivate`` of the language): their
        values are gone and read 0. indices as for :meth:`activate`. The
        field must sit directly in a sparse container (bitmasked, pointer
        or dynamic): otherwise the server refuses (ServerError
        INVALID_ARGUMENT, naming the SNode)."""
        self._s._cells("deactivate", self.info, self._indices(indices), None)

    def deactivate_all(self) -> None:
        """Deactivate every active cell (Taichi's ``deactivate_all``)."""
        self.deactivate(np.argwhere(self.active_mask()))

    def _indices(self, indices: Any) -> np.ndarray:
        info = self.info
        nd = len(info.index_shape)
        if nd == 0:
            raise ValueError(f"field '{info.name}' is 0-D: it has no cells to (de)activate")
        a = np.asarray(indices)
        if a.dtype.kind not in "iu" and a.size:
            raise TypeError(f"field '{info.name}': cell indices must be integers, not {a.dtype}")
        if a.ndim == 1 and a.shape[0] == nd:
            a = a[None, :]
        if a.ndim != 2 or a.shape[1] != nd:
            raise ValueError(f"field '{info.name}' has {nd} indices: give one cell's {nd} "
                             f"indices or an array of shape (n, {nd}), not {a.shape}")
        a = a.astype(np.int64, copy=False)
        bad = np.nonzero(((a < 0) | (a >= np.array(info.index_shape))).any(axis=1))[0]
        if len(bad):
            raise IndexError(f"field '{info.name}': index {tuple(a[bad[0]].tolist())} is out of "
                             f"bounds of shape {info.index_shape}")
        return a

    def __getitem__(self, key: Any) -> Any:
        return self.to_numpy()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        """``f[:] = a`` writes the whole field; ``f[key] = v`` writes the
        cells key selects (NumPy indexing on the index dimensions) and
        activates only those; see :data:`CELL_WRITES`."""
        info = self.info
        if isinstance(key, slice) and key == slice(None) or key is Ellipsis:
            self.from_numpy(value)
            return
        arr = np.asarray(value)
        self._check_dtype(arr)
        nd = len(info.index_shape)
        k = key if isinstance(key, tuple) else (key,)
        if len(k) == nd and all(isinstance(x, (int, np.integer)) for x in k):
            idx = np.array([[int(x) + (info.index_shape[d] if x < 0 else 0)
                             for d, x in enumerate(k)]], dtype=np.int64)
            self._s._cells("set", info, self._indices(idx) if nd else idx,
                           self._values(arr, (1,)))
            return
        try:  # which cells key selects (an IndexError: it reaches into elements)
            sel = np.asarray(np.arange(int(np.prod(info.index_shape)),
                                       dtype=np.int64).reshape(info.index_shape)[key])
        except IndexError:
            sel = None
        if sel is not None and (sel.size <= CELL_WRITES or not self.active_mask().all()):
            lin = sel.reshape(-1)
            idx = (np.stack(np.unravel_index(lin, info.index_shape), axis=-1) if nd
                   else np.zeros((len(lin), 0), dtype=np.int64))
            self._s._cells("set", info, idx, self._values(arr, sel.shape))
            return
        a = self.to_numpy()  # read, change, write back: every cell is active already
        a[key] = value
        self.from_numpy(a)

    def _values(self, arr: np.ndarray, sel_shape: Tuple[int, ...]) -> np.ndarray:
        """arr broadcast to the selected cells, as (n, components)."""
        info = self.info
        want = tuple(sel_shape) + info.element_shape
        try:
            v = np.broadcast_to(arr.astype(info.dtype), want)
        except ValueError:
            raise ValueError(f"field '{info.name}': a value of shape {arr.shape} does not fit "
                             f"the {int(np.prod(sel_shape))} selected cells of shape {want}"
                             ) from None
        return v.reshape(int(np.prod(sel_shape)), len(info.places))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"<fusebox field {self.name}: shape {self.shape}, {self.dtype}>"


def _user_terms(why: str) -> str:
    """A server's reason for refusing a kernel the package added, without
    that kernel's name or IR values (%3) it may quote."""
    why = re.sub(r"kernel '__fbpy_[^']*'( failed verification)?:?\s*", "", why)
    why = re.sub(r"%[0-9]+\s*", "", why)
    return why.strip() or "the server refused it"


def _launch_message(msg: str) -> str:
    """A launch failure's message without the name of a kernel the
    package added ("kernel '__fbpy_set_x' (launch 63): out of memory ..."
    becomes "out of memory ..."): the failure's kernel already says what
    it was (``set of field 'x'``)."""
    return re.sub(r"kernel '__fbpy_[^']*'( \(launch [0-9]+\))?:?\s*", "", msg)


# bits of the activity mask one launch of the mask helper returns
_MASK_BITS = 62


class SNode:
    """A named SNode of the session's layout (``as NAME`` in the source),
    reached from the host as Taichi's ``block.deactivate_all()`` and
    ``ti.is_active(block, I)`` are: ``s.snodes.blocks``.

    Its cells are those of its own cell space (:attr:`shape`: its own and
    its ancestors' sizes, docs/language.md). Each operation is a launch of
    a kernel the package adds to the program (``is_active`` / ``activate``
    / ``deactivate`` of the SNode, registered from the session's source as
    any kernel is), so it runs in order with the session's launches.
    """

    def __init__(self, session: "Session", info: SNodeInfo):
        self._s = session
        self.info = info

    name = property(lambda self: self.info.name)
    kind = property(lambda self: self.info.kind,
                    doc='"dense", "bitmasked", "pointer" or "dynamic"')
    shape = property(lambda self: self.info.shape, doc="the extent of each of its indices")
    ndim = property(lambda self: len(self.info.shape))
    fields = property(lambda self: list(self.info.fields), doc="the fields placed below it")

    def activate(self, indices: Any) -> None:
        """Make cells active (``activate`` of the language): indices is one
        cell's index tuple or an int array of shape (n, ndim)."""
        self._s._snode_cells("activate", self.info, self._indices(indices))

    def deactivate(self, indices: Any) -> None:
        """Make cells inactive (``deactivate``): the values below them are
        gone and read 0. Only a bitmasked, pointer or dynamic SNode has
        cells to deactivate (ValueError otherwise)."""
        self._deactivatable()
        self._s._snode_cells("deactivate", self.info, self._indices(indices))

    def deactivate_all(self) -> None:
        """Deactivate every cell (Taichi's ``snode.deactivate_all()``): one
        launch that visits the active cells and deactivates each."""
        self._deactivatable()
        self._s._snode_launch(self._s._snode_helper("deactivate_all", self.info), [])

    def active_mask(self, *, timeout: Optional[float] = None) -> np.ndarray:
        """A bool array of :attr:`shape`: True where the cell is active (a
        dense SNode under no sparse one is all True). Activates nothing;
        syncs. One launch reads the activity of 62 cells."""
        info = self.info
        n = int(np.prod(info.shape)) if info.shape else 1
        kid = self._s._snode_helper("mask", info)
        s = self._s
        s._before_io(timeout)  # then the next sync returns the words alone, in order
        for base in range(0, n, _MASK_BITS):
            s._snode_launch(kid, [pb.Value(type=3, i=base)])
        words = [v for _, _, v in s.sync(timeout).returns]
        if len(words) != (n + _MASK_BITS - 1) // _MASK_BITS:
            raise Error(f"SNode '{info.name}': the server sent {len(words)} of "
                        f"{(n + _MASK_BITS - 1) // _MASK_BITS} activity words")
        w = np.array(words, dtype=np.int64).view(np.uint64)
        bits = (w[:, None] >> np.arange(_MASK_BITS, dtype=np.uint64)) & np.uint64(1)
        return bits.reshape(-1)[:n].astype(np.bool_).reshape(info.shape)

    def active(self, *, timeout: Optional[float] = None) -> np.ndarray:
        """The active cells' indices: an int64 array of shape (n, ndim),
        row-major."""
        return np.argwhere(self.active_mask(timeout=timeout)).astype(np.int64, copy=False)

    def is_active(self, *indices: Any, timeout: Optional[float] = None) -> bool:
        """Whether one cell is active (``ti.is_active(snode, I)``): one
        launch of the language's ``is_active``, and a sync."""
        idx = indices[0] if len(indices) == 1 and not np.isscalar(indices[0]) else indices
        a = self._indices(idx)
        if len(a) != 1:
            raise ValueError(f"SNode '{self.name}': is_active takes one cell's indices")
        s = self._s
        kid = s._snode_helper("is_active", self.info)
        s._before_io(timeout)
        s._snode_launch(kid, [pb.Value(type=2, i=int(x)) for x in a[0]])
        got = [v for _, _, v in s.sync(timeout).returns]
        if len(got) != 1:
            raise Error(f"SNode '{self.name}': the server sent {len(got)} answers to is_active")
        return bool(got[0])

    def _deactivatable(self) -> None:
        if self.kind not in ("bitmasked", "pointer", "dynamic"):
            raise ValueError(
                f"SNode '{self.name}' is {self.kind}: its cells are always active, so they "
                "cannot be deactivated (make it a bitmasked or pointer SNode)")

    def _indices(self, indices: Any) -> np.ndarray:
        shape, nd, what = self.info.shape, len(self.info.shape), f"SNode '{self.name}'"
        a = np.asarray(indices)
        if a.dtype.kind not in "iu" and a.size:
            raise TypeError(f"{what}: cell indices must be integers, not {a.dtype}")
        if a.ndim == 1 and a.shape[0] == nd:
            a = a[None, :]
        if a.ndim != 2 or a.shape[1] != nd:
            raise ValueError(f"{what} has {nd} indices: give one cell's {nd} "
                             f"indices or an array of shape (n, {nd}), not {a.shape}")
        a = a.astype(np.int64, copy=False)
        bad = np.nonzero(((a < 0) | (a >= np.array(shape))).any(axis=1))[0]
        if len(bad):
            raise IndexError(f"{what}: index {tuple(a[bad[0]].tolist())} is out of bounds "
                             f"of shape {shape}")
        return a

    def __repr__(self) -> str:
        return f"<fusebox SNode {self.name}: {self.kind}, shape {self.shape}>"


def type_name_of(dt: np.dtype) -> str:
    """The .fbk name of a NumPy dtype ("f32" for float32, ...)."""
    for name, d in _TYPES.values():
        if d == dt:
            return name
    return str(dt)


# ------------------------------------------------------------------ the session

def _write_chunks(stream: Any, path: str) -> str:
    """CheckpointChunks into path: a temporary name in its directory,
    fsync, rename (a failed transfer leaves any earlier file whole)."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".fbck-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            off = 0
            for m in stream:
                if m.offset != off:
                    raise Error(f"Checkpoint: a chunk at {m.offset}, expected {off}")
                f.write(m.data)
                off += len(m.data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _amend(err: Any, more: str) -> None:
    """Add more to a ServerError's message (and its str)."""
    err.message += more
    err.args = (err.args[0] + more,) if err.args else (more,)


def _renamed(req: Any, sid: str) -> Any:
    """A copy of a request of a session, for its session sid."""
    out = type(req)()
    out.CopyFrom(req)
    if hasattr(out, "session_id"):
        out.session_id = sid
    return out


class Session:
    """A session on fuseboxd; make it with :meth:`fusebox.Client.session`.

    Attributes:
        id: the server's session id.
        backend: the backend it runs on ("cpu" or "cuda").
        memory_bytes: field storage the server holds for it.
        program: its :class:`Program` (fields and kernels with signatures).
        kernels: the kernels, as attributes: ``s.kernels.step(...)``.
        fields: the fields, as attributes: ``s.fields.T.to_numpy()``.
    """

    def __init__(self, client: Any, source: str, *, params: Optional[Mapping[str, Any]],
                 filename: str, mode: str, backend: str,
                 passes: Union[None, Mapping[str, bool], Sequence[str]], flush_every: int,
                 max_fuse_per_task: int, compile_threads: int, seed: int, memory_limit: int,
                 batch: int, timeout: Optional[float] = None):
        self._c = client
        #: default seconds of :meth:`sync` (None: no limit)
        self.timeout = timeout
        self._resp: "queue.Queue[Any]" = queue.Queue()
        self._lost: Optional[BaseException] = None
        self._carry: List[Any] = []  # SyncResults of syncs that timed out
        self._src = _source_pb(source, params, filename)
        self._batch = max(1, int(batch))
        self._pending: List[Any] = []
        self._unsynced = False
        self._sync_id = 0
        self._stream: Any = None
        self._q: "queue.Queue[Any]" = queue.Queue()
        self.closed = False
        self._seq = 0
        self._sent = 0  # launches handed to the stream (Cancel's through_launch)
        self._names: Dict[int, str] = {}
        self._adjoints: Dict[int, int] = {}  # kernel id -> its adjoint's (autodiff.py)
        self._tangents: Dict[int, int] = {}  # kernel id -> its tangent's (autodiff.py)
        self._marks: List[Any] = []  # tape marks of the next message
        self._tape: Any = None  # the tape recording, if any
        self._ids: Dict[Tuple[str, Tuple[str, ...]], int] = {}
        self._moving_init(memory_limit)
        self.program = Program(self._c._call("DescribeSource", self._src))
        self.program._warn(3)  # once per session, at the caller of Client.session
        opts = pb.SessionOptions(backend=backend, mode=mode, flush_every=flush_every,
                                 max_fuse_per_task=max_fuse_per_task,
                                 compile_threads=compile_threads, seed=seed,
                                 memory_limit=memory_limit)
        for k, v in _passes(passes).items():
            opts.passes[k] = v
        r = self._create(pb.CreateSessionRequest(options=opts, source=self._src))
        self.id: str = r.session_id
        self.backend: str = r.backend
        self.memory_bytes: int = r.memory_bytes
        self.mode = mode or "sync"
        try:
            self._open_stream()
            plain = [k for k in self.program.kernels.values()
                     if not any(p.is_field for p in k.params)]
            if plain:
                self._register([(k.name, ()) for k in plain])
        except BaseException:
            self.close()
            raise
        self.kernels = _Namespace("kernel", {n: Kernel(self, k)
                                             for n, k in self.program.kernels.items()})
        self.fields = _Namespace("field", {n: Field(self, f)
                                           for n, f in self.program.fields.items()})
        self.snodes = _Namespace("SNode", {n: SNode(self, sn)
                                           for n, sn in self.program.snodes.items()})

    # -- plumbing
    def _create(self, req: Any) -> Any:
        """CreateSession with a routing key of this session's own, sent on
        each of its calls (``fusebox-route``) so that a proxy hashing on it
        keeps them on one replica; a replica that is draining refuses, and
        a new key is another replica behind such a proxy (CREATE_TRIES)."""
        if self._c.closed:
            raise Error("the client is closed")
        addrs = [self._c.address] + self._c._others(self._c.address)
        for i in range(CREATE_TRIES):
            # with several addresses, the next one each time; behind a proxy
            # a new routing key
            self._addr = addrs[i % len(addrs)]
            self._route = secrets.token_hex(16)
            self._md = tuple(self._c._metadata or ()) + (("fusebox-route", self._route),)
            try:
                r, call = self._stub().CreateSession.with_call(
                    req, timeout=self._c.timeout, metadata=self._md)
            except grpc.RpcError as e:
                err = from_rpc("CreateSession", e)
                if i + 1 < CREATE_TRIES and (
                        "is draining; retry on another replica" in err.message or
                        len(addrs) > 1 and replica_gone(e) and i + 1 < len(addrs)):
                    continue
                raise err from None
            #: the replica holding the session (its fusebox-replica header)
            self.replica: str = dict(call.initial_metadata() or ()).get("fusebox-replica", "")
            return r
        raise AssertionError("unreachable")

    def _rpc_error(self, method: str, e: grpc.RpcError) -> ServerError:
        """The exception for a failed call of this live session."""
        if replica_gone(e):
            return SessionLostError(method, e.code(), self.id, self.replica)
        err = from_rpc(method, e)
        md = dict(e.trailing_metadata() or ()) if hasattr(e, "trailing_metadata") else {}
        if "fusebox-ended" in md and err.status != grpc.StatusCode.UNAVAILABLE:
            # the drain's reason, whose status a proxy turned into a reset
            err = ConnectionLostError(method, grpc.StatusCode.UNAVAILABLE,
                                      md["fusebox-ended"], err.fb_code)
        if isinstance(err, ConnectionLostError):
            m = _DRAIN_CKPT.search(err.message)
            #: a drained session's checkpoint on its replica's --checkpoint-dir
            err.checkpoint = m.group(1) if m else None  # type: ignore[attr-defined]
        return err

    def _stub(self) -> Any:
        """The stub of the address this session lives at."""
        return self._c._stub_of(self._addr)

    def _saw(self, call: Any) -> None:
        """Note a draining replica from a call's initial metadata."""
        try:
            md = call.initial_metadata() or ()
        except Exception:  # noqa: BLE001 - a call that never got an answer
            return
        for k, v in md:
            if k == "fusebox-draining":
                self._draining = v or "?"

    def _call(self, method: str, req: Any, timeout: Optional[float] = None) -> Any:
        if self._c.closed:
            raise Error("the client is closed")
        for again in (True, False):
            try:
                r, call = getattr(self._stub(), method).with_call(
                    req, timeout=self._c.timeout if timeout is None else timeout,
                    metadata=self._md)
                self._saw(call)
                return r
            except grpc.RpcError as e:
                err = self._rpc_error(method, e)
                # ended by a drain after its grace: resumed elsewhere, once
                if not (again and method != "CloseSession" and self._resume_ended(err)):
                    raise err from None
                req = _renamed(req, self.id)
        raise AssertionError("unreachable")

    def _open_stream(self) -> None:
        q = self._q

        def requests() -> Iterator[Any]:
            while True:
                m = q.get()
                if m is None:
                    return
                yield m

        self._stream = self._stub().Session(requests(), metadata=self._md)
        self._q.put(pb.SessionRequest(session_id=self.id))
        threading.Thread(target=self._pump, args=(self._stream, self._resp, self), daemon=True,
                         name=f"fusebox-session-{self.id[:8]}").start()

    @staticmethod
    def _pump(stream: Any, out: "queue.Queue[Any]", s: "Session") -> None:
        # the stream's answers, read on a thread of their own so that a sync
        # can wait for them with a timeout; a draining replica's notice
        # (SessionResponse.draining) is noted for the next call, not queued
        try:
            for m in stream:
                if m.draining and not m.HasField("sync"):
                    if out is s._resp:  # still this session's stream
                        s._draining = m.draining
                    continue
                out.put(m)
            out.put(StopIteration())
        except grpc.RpcError as e:
            out.put(e)

    def _register(self, insts: List[Tuple[str, Tuple[str, ...]]]) -> List[int]:
        req = pb.RegisterKernelsRequest(session_id=self.id, source=self._src)
        pending = list(insts)
        _ad.add_custom_adjoints(self, pending, req)  # `grad k_adj` kernels: theirs too
        for name, fields in pending:
            req.instances.add(kernel=name, fields=list(fields))
        ids = list(self._call("RegisterKernels", req).kernel_ids)
        for (name, fields), i in zip(pending, ids):
            self._ids[(name, fields)] = i
            self._names[i] = name + (f"[{','.join(fields)}]" if fields else "")
        return ids[:len(insts)]

    def _kernel_id(self, k: KernelInfo, fields: Tuple[str, ...]) -> int:
        key = (k.name, fields)
        if key not in self._ids:
            self._register([key])
        return self._ids[key]

    def _helper(self, kind: str, f: FieldInfo) -> int:
        """The id of a kernel the package adds to the program to set,
        activate or deactivate one cell of f (registered once, from the
        session's source with the kernel appended: the layout is the same)."""
        key = ("\0" + kind, (f.name,))
        if key in self._ids:
            return self._ids[key]
        nd = len(f.index_shape)
        params = [f"i{d}: i32" for d in range(nd)]
        at = f"{f.name}[{', '.join(f'i{d}' for d in range(nd))}]"
        if kind == "set":
            t = type_name_of(f.dtype)
            vs = [f"v{c}" for c in range(len(f.places))]
            params += [f"{v}: {t}" for v in vs]
            val = (vs[0] if not f.element_shape else
                   t + "".join(f"[{e}]" for e in f.element_shape) + f"({', '.join(vs)})")
            body = f"{at} = {val}"
        else:
            body = f"{kind}({f.name}, {', '.join(f'i{d}' for d in range(nd))})"
        name = f"__fbpy_{kind}_{f.name.replace('.', '_')}"  # x.grad: __fbpy_set_x_grad
        src = pb.Source(text=self._src.text + f"\nkernel {name}({', '.join(params)}) {{ {body} }}\n",
                        filename=self._src.filename, params=self._src.params)
        req = pb.RegisterKernelsRequest(session_id=self.id, source=src,
                                        instances=[pb.KernelInstance(kernel=name)])
        try:
            kid = self._call("RegisterKernels", req).kernel_ids[0]
        except ServerError as e:
            if e.status != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            # the kernel is the package's own: say what the user asked for
            # and why, not its name or its source line
            why = next((ln.split(" error: ", 1)[1] for ln in e.message.splitlines()
                        if " error: " in ln), _user_terms(e.message))
            what = {"set": "setting cells of", "activate": "activate on",
                    "deactivate": "deactivate on"}[kind]
            raise ServerError("RegisterKernels", e.status, f"{what} field '{f.name}': {why}",
                              e.fb_code) from None
        self._ids[key] = kid
        self._names[kid] = f"{kind} of field '{f.name}'"
        return kid

    def _cells(self, kind: str, f: FieldInfo, idx: np.ndarray,
               values: Optional[np.ndarray]) -> None:
        """One launch of the helper per cell, queued like any launch."""
        self._check_open()
        kid = self._helper(kind, f)
        t = _DTYPE_TO_TYPE[f.dtype]
        for r in range(len(idx)):
            args = [pb.Value(type=2, i=int(x)) for x in idx[r]]
            if values is not None:
                args += [_np_value(t, x) for x in values[r]]
            self._pending.append(pb.Launch(kernel=kid, args=args))
            if len(self._pending) >= self._batch:
                self._send()
        self._unsynced = True

    # -- named SNodes (SNode): kernels the package adds, as for fields
    def _snode_helper(self, kind: str, sn: SNodeInfo) -> int:
        """The id of the package's kernel that does kind to SNode sn:
        activate / deactivate one cell, is_active of one cell (an i32),
        deactivate_all, or mask (the
        activity of _MASK_BITS cells from a row-major cell number, as bits
        of an i64). Registered once, from the session's source with the
        kernel appended; a refusal names the SNode, not the kernel."""
        key = ("\0snode " + kind, (sn.name,))
        if key in self._ids:
            return self._ids[key]
        nd = len(sn.shape)
        ix = [f"fbpy_i{d}" for d in range(nd)]  # names no program uses
        if kind in ("activate", "deactivate"):
            params = [f"{i}: i32" for i in ix]
            body = f"{kind}({sn.name}, {', '.join(ix)})"
        elif kind == "is_active":
            params = [f"{i}: i32" for i in ix]
            body = f"return i32(is_active({sn.name}, {', '.join(ix)}))"
        elif kind == "deactivate_all":
            params = []
            body = f"for {', '.join(ix)} in {sn.name} {{ deactivate({sn.name}, {', '.join(ix)}) }}"
        else:  # mask: the cells base .. base + _MASK_BITS - 1, row-major
            params = ["fbpy_base: i64"]
            n = int(np.prod(sn.shape)) if sn.shape else 1
            split = []
            for d in range(nd - 1, -1, -1):
                split.append(f"let fbpy_i{d} = i32(fbpy_r % {sn.shape[d]})" if d
                             else "let fbpy_i0 = i32(fbpy_r)")
                if d:
                    split.append(f"fbpy_r = fbpy_r // {sn.shape[d]}")
            body = ("var fbpy_m: i64\n  if fbpy_base >= 0 {\n"
                    f"    for fbpy_k in 0 .. {_MASK_BITS} {{\n"
                    f"      var fbpy_r: i64 = fbpy_base + fbpy_k\n      if fbpy_r < {n} {{\n"
                    + "".join(f"        {x}\n" for x in split)
                    + f"        if is_active({sn.name}, {', '.join(ix)}) {{\n"
                    "          fbpy_m |= i64(1) << fbpy_k\n        }\n"
                    "      }\n    }\n  }\n  return fbpy_m")
        ret = {"mask": " -> i64", "is_active": " -> i32"}.get(kind, "")
        name = f"__fbpy_snode_{kind}_{sn.name}"
        src = pb.Source(text=self._src.text + f"\nkernel {name}({', '.join(params)}){ret} {{\n"
                        f"  {body}\n}}\n", filename=self._src.filename, params=self._src.params)
        req = pb.RegisterKernelsRequest(session_id=self.id, source=src,
                                        instances=[pb.KernelInstance(kernel=name)])
        what = {"activate": "activate on", "deactivate": "deactivate on",
                "deactivate_all": "deactivate_all on", "mask": "activity of",
                "is_active": "is_active of"}[kind]
        try:
            kid = self._call("RegisterKernels", req).kernel_ids[0]
        except ServerError as e:
            if e.status != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            why = next((ln.split(" error: ", 1)[1] for ln in e.message.splitlines()
                        if " error: " in ln), e.message)
            raise ServerError("RegisterKernels", e.status,
                              f"{what} SNode '{sn.name}': {_user_terms(why)}", e.fb_code) from None
        self._ids[key] = kid
        self._names[kid] = f"{what} SNode '{sn.name}'"
        return kid

    def _snode_launch(self, kid: int, args: List[Any]) -> None:
        self._check_open()
        self._pending.append(pb.Launch(kernel=kid, args=args))
        self._unsynced = True
        if len(self._pending) >= self._batch:
            self._send()

    def _snode_cells(self, kind: str, sn: SNodeInfo, idx: np.ndarray) -> None:
        kid = self._snode_helper(kind, sn)
        for r in range(len(idx)):
            self._snode_launch(kid, [pb.Value(type=2, i=int(x)) for x in idx[r]])

    def _check_open(self) -> None:
        if self.closed:
            raise Error(f"session {self.id[:8] if hasattr(self, 'id') else ''} is closed")

    def _bind_values(self, k: Kernel, args: List[Any]) -> Tuple[List[str], List[Any]]:
        fields, values = [], []
        info = k.info
        for i, (p, a) in enumerate(zip(info.params, args)):
            if p.is_field:
                name = a.name if isinstance(a, Field) else a
                if not isinstance(name, str):
                    raise TypeError(f"{info.name}(): argument '{p.name}' (field) must be a "
                                    f"field or a field's name, not {type(a).__name__}")
                fields.append(name)
            else:
                values.append(_value(info, i, a))
        return fields, values

    def _mark(self, m: Any) -> None:
        """A tape mark, sent among the launches (autodiff.py)."""
        m.at = len(self._pending)
        self._marks.append(m)
        self._unsynced = True

    def tape(self, loss: Any) -> "_ad.Tape":
        """``with s.tape(s.fields.loss): ...``: record the launches inside, then
        launch the gradients' clears, ``loss.grad = 1`` and the adjoints
        (docs/autodiff.md). The loss is a 0-D field with a gradient."""
        return _ad.tape(self, loss)

    def _launch(self, k: Kernel, args: List[Any]) -> Any:
        self._check_open()
        self._maybe_move()
        info = k.info
        fields: List[str] = []
        values = []
        for i, (p, a) in enumerate(zip(info.params, args)):
            if p.is_field:
                name = a.name if isinstance(a, Field) else a
                if not isinstance(name, str):
                    raise TypeError(f"{info.name}(): argument '{p.name}' (field) must be a "
                                    f"field or a field's name, not {type(a).__name__}")
                if isinstance(a, Field) and a._s is not self:
                    raise ValueError(f"{info.name}(): argument '{p.name}' is a field of "
                                     "another session")
                fields.append(name)
            else:
                values.append(_value(info, i, a))
        kid = self._kernel_id(info, tuple(fields))
        self._pending.append(pb.Launch(kernel=kid, args=values))
        self._unsynced = True
        if info.ret is not None:
            res = self.sync()
            for seq, _, v in reversed(res.returns):
                return v
            raise Error(f"{info.name}(): the server sent no return value")
        if len(self._pending) >= self._batch:
            self._send()
        return None

    def _send(self, flush: bool = False, sync: int = 0) -> None:
        if not self._pending and not self._marks and not flush and not sync:
            return
        m = pb.SessionRequest(flush=flush, sync=sync)
        m.launches.extend(self._pending)
        m.tape.extend(self._marks)
        self._marks = []
        self._sent += len(self._pending)
        self._pending = []
        if self._inflight is not None:  # until a sync answers it (_resume_ended replays it)
            self._inflight.append(m)
            if len(self._inflight) > INFLIGHT_KEPT:
                self._inflight = None  # too many to keep: no replay until the next sync
        self._q.put(m)

    def _next(self, left: Optional[float], timeout: Optional[float]) -> Any:
        if self._lost is not None:
            raise self._lost
        try:
            m = self._resp.get(timeout=left)
        except queue.Empty:
            raise DeadlineExceededError(
                "Session", grpc.StatusCode.DEADLINE_EXCEEDED,
                f"sync {self._sync_id} not answered within {timeout:g} s; the launches go on "
                "running (Session.cancel() stops them)") from None
        if isinstance(m, grpc.RpcError):
            self.closed = True
            self._lost = self._rpc_error("Session", m)
            raise self._lost
        if m.HasField("sync"):
            r = m.sync
            # sequence numbers count from the session's first launch, over
            # the streams of every replica it lived on
            self._raw_seq = r.seq
            r.seq += self._seq_base
            for x in list(r.returns) + list(r.errors):
                if x.seq:
                    x.seq += self._seq_base
            if r.sync_id == self._sync_id:  # everything sent so far is answered
                self._inflight = []
                self._launches_at_sync = r.counters.launches
        if isinstance(m, StopIteration):
            self.closed = True
            self._lost = Error("the server ended the session's stream")
            raise self._lost
        return m

    # -- public
    def launch(self, kernel: str, *args: Any, **kwargs: Any) -> Any:
        """Launch a kernel by name: ``s.launch("step", T, U, 0.2)``."""
        k = self.kernels[kernel]
        return k(*args, **kwargs)

    def flush(self) -> None:
        """Send pending launches and ask an async session to flush its window."""
        self._check_open()
        self._send(flush=True)

    def sync(self, timeout: Optional[float] = None) -> SyncResult:
        """Wait for every launch so far.

        Returns the return values since the previous sync and the counters;
        raises :class:`LaunchError` when a launch failed (the session goes
        on). timeout: seconds to wait (default: the session's ``timeout``,
        None for no limit); past it :class:`fusebox.DeadlineExceededError`
        (DEADLINE_EXCEEDED) is raised while the work goes on: a later sync
        still reports it, and :meth:`cancel` stops it."""
        self._check_open()
        self._maybe_move()
        if timeout is None:
            timeout = self.timeout
        end = None if timeout is None else time.monotonic() + timeout
        self._sync_id += 1
        self._send(sync=self._sync_id)
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                r = self._next(left, timeout).sync
            except ConnectionLostError as e:
                if not self._resume_ended(e):  # replays what was in flight
                    raise
                continue
            self._carry.append(r)  # the answers of syncs that timed out count too
            if r.sync_id == self._sync_id:
                break
        got, self._carry = self._carry, []
        self._unsynced = False
        errors = [e for x in got for e in x.errors]
        dropped = sum(x.errors_dropped for x in got)
        if errors or dropped:
            raise LaunchError([LaunchFailure(e.seq, self._names.get(e.kernel, str(e.kernel)),
                                             e.code, _launch_message(e.message))
                               for e in errors], dropped)
        return SyncResult(r.seq, [(x.seq, self._names.get(x.kernel, str(x.kernel)),
                                   _from_value(x.value)) for y in got for x in y.returns],
                          self._continued(r.counters))

    def cancel(self, timeout: Optional[float] = None) -> int:
        """Stop the launches sent so far, at their next
        task boundary (Cancel). Each launch it skips is reported by the next
        :meth:`sync` as a :class:`LaunchFailure` with code -14
        (FB_ECANCELLED) in a :class:`LaunchError`; writes, reads and later
        launches run as usual. Returns the requests the server had pending.
        """
        self._check_open()
        self._send()  # what is queued here goes first
        # naming the last launch sent: this call may overtake them on the way
        r = self._call("Cancel", pb.CancelRequest(session_id=self.id,
                                                     through_launch=self._sent), timeout)
        return int(r.requests_pending)

    def counters(self, timeout: Optional[float] = None) -> Counters:
        """The session's counters (after a sync)."""
        return self.sync(timeout).counters

    def _before_io(self, timeout: Optional[float]) -> None:
        # field transfers are other calls than the stream: sync so that the
        # server has every launch before the transfer is posted
        self._check_open()
        self._maybe_move()
        if self._unsynced or self._pending:
            self.sync(self.timeout if timeout is None else timeout)

    def _read(self, place: int, out: np.ndarray, progress: Optional[bool],
              timeout: Optional[float], active: bool = False) -> None:
        """Fill out (C-contiguous) with field place's bytes, or its activity."""
        self._before_io(timeout)
        buf = memoryview(out.reshape(-1)).cast("B")
        total = buf.nbytes
        bar = _bar(progress, total, f"read {self._names.get(place, place)}")
        got = 0
        what = "ReadField"
        try:
            for again in (True, False):
                call = self._stub().ReadField(
                    pb.ReadFieldRequest(session_id=self.id, field=place,
                                        chunk_bytes=CHUNK_BYTES, active=active),
                    timeout=self._c.timeout if timeout is None else timeout,
                    metadata=self._md)
                try:
                    for raw in call:
                        off, tot, data = _wire.decode_chunk(raw)
                        if tot != total or off + data.nbytes > total:
                            raise Error(f"ReadField: the server sent {tot} bytes at offset "
                                        f"{off}; {total} were expected")
                        buf[off:off + data.nbytes] = data  # the one copy, into the array
                        got += data.nbytes
                        if bar:
                            bar.update(data.nbytes)
                    self._saw(call)
                    break
                except grpc.RpcError as e:
                    err = self._rpc_error(what, e)
                    # ended by a drain after its grace before any byte came:
                    # resumed elsewhere, the read made there
                    if not (again and not got and self._resume_ended(err)):
                        raise err from None
        finally:
            if bar:
                bar.close()
        if got != total:
            raise Error(f"ReadField: {got} of {total} bytes arrived")

    def _write(self, place: int, arr: np.ndarray, progress: Optional[bool],
               timeout: Optional[float]) -> None:
        self._before_io(timeout)
        data = memoryview(arr.reshape(-1)).cast("B")
        total = data.nbytes
        bar = _bar(progress, total, "write")
        sid = self.id

        def chunks() -> Iterator[bytes]:
            off = 0
            while True:
                n = min(CHUNK_BYTES, total - off)
                # a slice of the array's memory: copied once, into the message
                yield (_wire.encode_chunk(data[off:off + n], off, sid, place, total)
                       if off == 0 else _wire.encode_chunk(data[off:off + n], off))
                if bar:
                    bar.update(n)
                off += n
                if off >= total:
                    return

        try:
            for again in (True, False):
                sid = self.id
                try:
                    r, call = self._stub().WriteField.with_call(
                        chunks(), timeout=self._c.timeout if timeout is None else timeout,
                        metadata=self._md)
                    self._saw(call)
                    break
                except grpc.RpcError as e:
                    err = self._rpc_error("WriteField", e)
                    # ended by a drain after its grace: nothing was written
                    # (the session had ended); resumed elsewhere, written there
                    if not (again and self._resume_ended(err)):
                        raise err from None
        finally:
            if bar:
                bar.close()
        if r.bytes != total:
            raise Error(f"WriteField: the server took {r.bytes} of {total} bytes")

    # -- checkpoints (docs/python.md "Checkpoints")
    def _client_state(self) -> bytes:
        """What the client needs to bind a restored session: its program
        and the ids of the kernels it registered (kept, sealed, in the
        checkpoint by the server)."""
        st = {"v": 1, "text": self._src.text, "filename": self._src.filename,
              "params": dict(self._src.params), "mode": self.mode, "batch": self._batch,
              "timeout": self.timeout,
              "ids": [[k[0], list(k[1]), i] for k, i in self._ids.items()],
              "names": {str(i): n for i, n in self._names.items()},
              "adjoints": {str(k): v for k, v in self._adjoints.items()},
              "tangents": {str(k): v for k, v in self._tangents.items()}}
        return json.dumps(st).encode()

    def checkpoint(self, path: Optional[str] = None, *, on_server: bool = False,
                   timeout: Optional[float] = None) -> str:
        """Save the session's whole state, after every launch so far ran.

        path: a file on the client's side the sealed checkpoint streams into
        (written to a temporary name, then renamed). on_server: instead,
        the server keeps it under its ``--checkpoint-dir``. Returns path,
        or the name the server gave. Restore it with
        :meth:`fusebox.Client.restore`; the session goes on either way."""
        self._check_open()
        self._maybe_move()
        if (path is None) == (not on_server):
            raise TypeError("checkpoint(): give a path, or on_server=True")
        self.sync(timeout)
        req = pb.CheckpointRequest(session_id=self.id, to_server=on_server,
                                   client_state=self._client_state(), chunk_bytes=(4 << 20) - 4096)
        try:
            stream = self._stub().Checkpoint(req, timeout=timeout, metadata=self._md)
            if on_server:
                for m in stream:
                    if m.name:
                        return m.name
                raise Error("Checkpoint: the server named no checkpoint")
            return _write_chunks(stream, path)
        except grpc.RpcError as e:
            raise from_rpc("Checkpoint", e) from None

    @classmethod
    def _restored(cls, client: Any, r: Any, route: str, md: Any, replica: str) -> "Session":
        try:
            st = json.loads(bytes(r.client_state).decode())
        except ValueError:
            st = None
        if not isinstance(st, dict) or st.get("v") != 1:
            raise Error("Restore: the checkpoint holds no state of the Python client "
                        "(it was not written by Session.checkpoint)")
        s = cls.__new__(cls)
        s._c = client
        s._route, s._md, s.replica = route, md, replica
        s.timeout = st.get("timeout")
        s._resp = queue.Queue()
        s._lost = None
        s._carry = []
        s._src = _source_pb(st["text"], st.get("params") or None, st.get("filename", ""))
        s._batch = int(st.get("batch", 1024))
        s._pending, s._unsynced, s._sync_id, s._stream = [], False, 0, None
        s._q = queue.Queue()
        s.closed = False
        s._seq = 0
        s._sent = 0
        s._names = {int(k): v for k, v in st.get("names", {}).items()}
        s._adjoints = {int(k): v for k, v in st.get("adjoints", {}).items()}
        s._tangents = {int(k): v for k, v in st.get("tangents", {}).items()}
        s._marks, s._tape = [], None
        s._ids = {(n, tuple(f)): i for n, f, i in st.get("ids", [])}
        s._moving_init(0)
        s._addr = client.address
        s.program = Program(client._call("DescribeSource", s._src))
        s.id = r.session_id
        s.backend = r.backend
        s.memory_bytes = r.memory_bytes
        s.mode = st.get("mode") or r.mode or "sync"
        s._open_stream()
        s.kernels = _Namespace("kernel", {n: Kernel(s, k) for n, k in s.program.kernels.items()})
        s.fields = _Namespace("field", {n: Field(s, f) for n, f in s.program.fields.items()})
        s.snodes = _Namespace("SNode", {n: SNode(s, sn) for n, sn in s.program.snodes.items()})
        return s

    # -- moving off a draining replica (docs/python.md "Several replicas")
    def _moving_init(self, memory_limit: int) -> None:
        self._memory_limit = memory_limit
        self._draining: Optional[str] = None  # the replica that told us it drains
        self._move_failed: Optional[str] = None  # the replica a move off failed
        # messages sent since the last answered sync (None: more than INFLIGHT_KEPT)
        self._inflight: Optional[List[Any]] = []
        self._launches_at_sync = 0  # the engine's launch count at that sync
        self._seq_base = 0  # launches answered on the streams before this one
        self._raw_seq = 0  # the last seq this stream answered
        self._in_move = False
        # counters over moves: the replicas left behind counted these (the
        # last counters seen there), this one counts on from zero
        self._cbase = Counters()
        self._seen = Counters()
        #: how many times the session moved to another replica by itself
        self.moves = 0

    def _continued(self, m: Any) -> Counters:
        """The counters of a SyncResult (this replica's) as the session's:
        after a move each cumulative one is the sum over the replicas the
        session lived on (the earlier ones as last seen there), the levels
        (device_bytes, tasks_pending) this replica's, and launches the
        server's own, which the checkpoint carries on."""
        raw = Counters._from_pb(m)
        self._seen = Counters(**{f.name: getattr(raw, f.name)
                                 if f.name in _LEVEL_COUNTERS or f.name == "launches"
                                 else getattr(self._cbase, f.name) + getattr(raw, f.name)
                                 for f in dc_fields(Counters)})
        return self._seen

    def _maybe_move(self) -> None:
        """At a call of the session, once its replica said it drains: move
        the session while the replica still holds it (a checkpoint streamed
        here, restored on another replica). A tape being recorded waits for
        its end; a move that cannot be made leaves the session where it is,
        for the rest of the grace."""
        if (self._draining is None or self._in_move or self.closed or self._tape is not None
                or self._marks):
            return
        why, self._draining = self._draining, None
        if why == self._move_failed:  # tried already: it stays there
            return
        self._in_move = True
        try:
            self._move(why)
        finally:
            self._in_move = False

    def _move(self, replica: str) -> None:
        pending, self._pending = self._pending, []  # not sent yet: they go to the new one
        try:
            # everything sent runs there first; its answers wait for the next sync
            self._sync_id += 1
            self._send(sync=self._sync_id)
            while True:
                r = self._next(self.timeout, self.timeout).sync
                self._carry.append(r)
                if r.sync_id == self._sync_id:
                    break
            self._continued(r.counters)  # the last seen here
            req = pb.CheckpointRequest(session_id=self.id, client_state=self._client_state(),
                                       chunk_bytes=(4 << 20) - 4096)
            spool = tempfile.TemporaryFile(prefix="fusebox-move-")
            try:
                try:
                    off = 0
                    for m in self._stub().Checkpoint(req, timeout=self._c.timeout,
                                                     metadata=self._md):
                        if m.offset != off:
                            raise Error(f"Checkpoint: a chunk at {m.offset}, expected {off}")
                        spool.write(m.data)
                        off += len(m.data)
                except grpc.RpcError as e:
                    raise self._rpc_error("Checkpoint", e) from None

                def chunks() -> Iterator[Any]:
                    spool.seek(0)
                    o = 0
                    opts = pb.SessionOptions(memory_limit=self._memory_limit)
                    while True:
                        b = spool.read(1 << 20)
                        if not b and o:
                            return
                        yield pb.CheckpointChunk(offset=o, data=b, options=opts if not o else None)
                        if not b:
                            return
                        o += len(b)

                try:
                    got = self._restore_elsewhere(chunks, replica)
                except ServerError as e:
                    # no replica takes it: the session stays for the rest
                    # of the grace, and the drain ends it
                    self._moved_not(replica, e)
                else:
                    self._adopt(got, "draining")
            finally:
                spool.close()
        except ConnectionLostError as e:
            # the grace ended meanwhile: its checkpoint, if the server took one
            self._pending = pending + self._pending
            if getattr(e, "checkpoint", None) is None and not self.closed:
                self._moved_not(replica, e)  # (the checkpoint call failed)
                return
            if self._resume_ended(e):
                return
            raise
        except ServerError as e:
            self._moved_not(replica, e)  # no checkpoint (no --checkpoint-key there)
        self._pending = pending + self._pending

    def _moved_not(self, replica: str, e: ServerError) -> None:
        self._move_failed = replica
        log.info("session %s: replica %s drains, and moving the session failed: %s",
                 self.id[:8], replica, e.message)

    def _restore_elsewhere(self, chunks: Any, replica: str) -> Tuple[Any, str, str, Any, str]:
        """Restore on another replica: the next addresses of the client's
        list, or behind one address (a proxy) new routing keys; returns
        (RestoreResponse, address, route, metadata, replica)."""
        addrs = self._c._others(self._addr) or [self._addr]
        tries = len(addrs) if len(self._c.addresses) > 1 else CREATE_TRIES
        last: Optional[ServerError] = None
        for i in range(tries):
            addr = addrs[i % len(addrs)]
            route = secrets.token_hex(16)
            md = tuple(self._c._metadata or ()) + (("fusebox-route", route),)
            try:
                r, call = self._c._stub_of(addr).Restore.with_call(
                    chunks(), timeout=self._c.timeout, metadata=md)
            except grpc.RpcError as e:
                last = from_rpc("Restore", e)
                if ("is draining; retry on another replica" in last.message or replica_gone(e)
                        or last.status == grpc.StatusCode.NOT_FOUND):
                    continue  # that one drains too, is gone, or has no such checkpoint
                raise last from None
            got = dict(call.initial_metadata() or ()).get("fusebox-replica", "")
            if got and got == replica:  # (a draining replica refuses; never here)
                continue
            return r, addr, route, md, got
        assert last is not None
        raise last

    def _adopt(self, got: Tuple[Any, str, str, Any, str], why: str) -> None:
        """Make the restored session this one: same kernels (the restore
        kept their ids), fields and handles; a new id, replica, stream."""
        r, addr, route, md, replica = got
        old_id, old_md, old_stub, old_replica = self.id, self._md, self._stub(), self.replica
        old_q, old_stream = self._q, self._stream
        self.id, self._addr, self._route, self._md, self.replica = (
            r.session_id, addr, route, md, replica)
        self.backend = r.backend or self.backend
        self.memory_bytes = r.memory_bytes
        self._seq_base += self._raw_seq
        self._raw_seq = 0
        self._cbase = self._seen
        self._sent = 0
        self._q, self._resp = queue.Queue(), queue.Queue()
        self._lost, self.closed = None, False
        old_q.put(None)
        if old_stream is not None:
            old_stream.cancel()
        try:  # the old session: closed there, so that the drain ends sooner
            old_stub.CloseSession(pb.CloseSessionRequest(session_id=old_id), timeout=10,
                                  metadata=old_md)
        except grpc.RpcError:
            pass
        self._open_stream()
        self.moves += 1
        log.info("session %s moved from replica %s to replica %s (%s) as session %s",
                 old_id[:8], old_replica or "?", replica or "?", why, self.id[:8])

    def _resume_ended(self, err: BaseException) -> bool:
        """The session was ended by its replica's drain after the grace and
        checkpointed there (err names the checkpoint): restore it by that
        name on another replica (replicas sharing --checkpoint-dir and the
        key) and replay what the old one had not answered. False, leaving
        err to be raised, when that cannot be done exactly."""
        name = getattr(err, "checkpoint", None)
        if not name:
            return False
        if self._inflight is None:
            _amend(err, f"; not resumed on another replica by itself: more than {INFLIGHT_KEPT} "
                   "messages of launches were unanswered")
            return False
        if self._tape is not None or any(len(m.tape) for m in self._inflight):
            _amend(err, "; not resumed on another replica by itself: a tape was being recorded")
            return False
        chunks = lambda: iter([pb.CheckpointChunk(  # noqa: E731
            name=name, options=pb.SessionOptions(memory_limit=self._memory_limit))])
        try:
            got = self._restore_elsewhere(chunks, self.replica)
        except ServerError as e:
            _amend(err, f"; resuming it from that checkpoint on another replica failed: "
                   f"{e.message}")
            return False
        replay, self._inflight = self._inflight, []
        self._adopt(got, "its replica drained; from checkpoint " + name)
        # the checkpoint holds what the old replica ran; it must be exactly
        # what it had answered, so that replaying the rest runs it once
        probe = 1 << 62
        self._q.put(pb.SessionRequest(sync=probe))
        while True:
            r = self._next(self.timeout, self.timeout).sync
            if r.sync_id == probe:
                break
        ran = r.counters.launches
        if ran != self._launches_at_sync:
            n = sum(len(m.launches) for m in replay)
            self.close()
            raise ConnectionLostError(
                "Session", grpc.StatusCode.UNAVAILABLE,
                f"session {self.id[:8]}: its replica drained and checkpointed it as {name}, "
                f"which holds {ran - self._launches_at_sync} of the {n} launches sent after the "
                "last sync: it cannot continue exactly (restore that checkpoint with "
                "Client.restore(name=...) and repeat the launches yourself)")
        self._inflight = list(replay)
        for m in replay:
            self._q.put(m)
        return True

    def close(self) -> None:
        """End the session (its stream and CloseSession); idempotent."""
        if getattr(self, "_closing", False):
            return
        self._closing = True
        inside = _ad.closing_inside(self)
        try:
            if self._stream is not None and not self.closed and (self._pending or self._marks):
                self._send()
            if hasattr(self, "id") and not self.closed:
                try:
                    self._call("CloseSession", pb.CloseSessionRequest(session_id=self.id))
                except ServerError:
                    pass  # the stream's end frees it as well
        finally:
            self.closed = True
            self._q.put(None)
            if self._stream is not None:
                self._stream.cancel()
            if self in getattr(self._c, "_sessions", []):
                self._c._sessions.remove(self)
        if inside is not None:
            self._tape = None
            raise Error(f"the session was closed while a tape over '{inside}' was recording; "
                        "its gradients were not computed (end the tape first)")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<fusebox session {getattr(self, 'id', '?')[:8]} ({getattr(self, 'mode', '?')}, "
                f"{getattr(self, 'backend', '?')})>")


def _passes(p: Union[None, Mapping[str, bool], Sequence[str]]) -> Dict[str, bool]:
    allp = ("listgen", "demote", "fusion", "dse")
    if p is None:
        return {}
    if isinstance(p, Mapping):
        out = dict(p)
    elif isinstance(p, str):
        raise TypeError("passes: give a dict {'fusion': False} or a list of pass names")
    else:
        on = list(p)
        out = {k: k in on for k in allp}
        bad = [k for k in on if k not in allp]
        if bad:
            raise ValueError(f"passes: unknown pass '{bad[0]}' (known: {', '.join(allp)})")
    for k in out:
        if k not in allp:
            raise ValueError(f"passes: unknown pass '{k}' (known: {', '.join(allp)})")
    return {k: bool(v) for k, v in out.items()}


def _bar(progress: Optional[bool], total: int, desc: str) -> Any:
    """A tqdm bar for a transfer, or None: progress True, or None and a
    transfer of PROGRESS_BYTES or more; None too without tqdm."""
    if not (progress or progress is None and total >= PROGRESS_BYTES):
        return None
    try:
        from tqdm import tqdm  # type: ignore
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc)
