"""Data types of fusebox.taichi: scalar types (ti.f32, ...), vector and
matrix types (ti.types.vector(3, ti.f32), ti.math.vec3), and the markers
used in kernel annotations (ti.template(), ti.types.ndarray())."""
from __future__ import annotations

import warnings
from typing import Any, Optional

import numpy as np


class DataType:
    """A scalar type: its .fbk name and NumPy dtype. Calling it in a
    kernel is a cast (``ti.f32(x)``); in Python scope it converts."""

    def __init__(self, name: str, np_dtype: Any, fbk: Optional[str] = None):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.fbk = fbk or name

    @property
    def is_float(self) -> bool:
        return self.np.kind == "f"

    def __call__(self, x: Any) -> Any:
        return self.np.type(x).item()

    def __repr__(self) -> str:
        return f"ti.{self.name}"


f32 = DataType("f32", np.float32)
f64 = DataType("f64", np.float64)
i32 = DataType("i32", np.int32)
i64 = DataType("i64", np.int64)
u32 = DataType("u32", np.uint32)
u64 = DataType("u64", np.uint64)
# Narrow integers: fields hold i32 on Fusebox (see _narrow()).
i8 = DataType("i8", np.int32, "i32")
i16 = DataType("i16", np.int32, "i32")
u8 = DataType("u8", np.int32, "i32")
u16 = DataType("u16", np.int32, "i32")
u1 = DataType("u1", np.int32, "i32")
float32, float64, int32, int64, uint32, uint64 = f32, f64, i32, i64, u32, u64
int8, int16, uint8, uint16 = i8, i16, u8, u16

_NARROW = (i8, i16, u8, u16, u1)
_warned: set = set()


class _Defaults:
    fp: DataType = f32
    ip: DataType = i32


defaults = _Defaults()


def resolve(dt: Any, what: str = "dtype") -> "DataType":
    """A scalar DataType from what a program wrote (ti.f32, float, int,
    numpy dtypes), with the narrow integer note."""
    if dt is None or dt is float:
        return defaults.fp
    if dt is int:
        return defaults.ip
    if dt is bool:
        return defaults.ip
    if isinstance(dt, DataType):
        if dt in _NARROW and dt.name not in _warned:
            _warned.add(dt.name)
            warnings.warn(f"fusebox.taichi: ti.{dt.name} is stored as i32 on Fusebox (fields "
                          "hold 32- and 64-bit numbers only); values keep their range but "
                          "take 4 bytes and do not wrap at the narrow width", stacklevel=4)
        return dt
    try:
        d = np.dtype(dt)
    except TypeError:
        d = None
    if d is not None:
        for t in (f32, f64, i32, i64, u32, u64):
            if t.np == d:
                return t
        if d.kind in "iu" and d.itemsize < 4:
            return resolve({1: i8, 2: i16}[d.itemsize] if d.kind == "i" else
                           {1: u8, 2: u16}[d.itemsize], what)
    raise TypeError(f"{what}: {dt!r} is not a type Fusebox fields can hold "
                    "(use ti.f32, ti.f64, ti.i32, ti.i64, ti.u32 or ti.u64)")


class VectorType:
    """ti.types.vector(n, dtype): a vector type; calling it in a kernel
    builds a vector (``vec3(1.0)``, ``vec3(x, y, z)``)."""

    def __init__(self, n: int, dtype: Any = None):
        self.n = int(n)
        self._dtype = dtype
        self.shape = (self.n,)

    @property
    def dtype(self) -> DataType:
        return resolve(self._dtype)

    def fbk(self) -> str:
        return f"{self.dtype.fbk}[{self.n}]"

    def __call__(self, *args: Any) -> Any:
        vals = list(args[0]) if len(args) == 1 and hasattr(args[0], "__len__") else list(args)
        if len(vals) == 1:
            vals = vals * self.n
        return np.array(vals, dtype=self.dtype.np)

    def __repr__(self) -> str:
        return f"ti.types.vector({self.n}, {self.dtype!r})"


class MatrixType:
    """ti.types.matrix(n, m, dtype)."""

    def __init__(self, n: int, m: int, dtype: Any = None):
        self.n, self.m = int(n), int(m)
        self._dtype = dtype
        self.shape = (self.n, self.m)

    @property
    def dtype(self) -> DataType:
        return resolve(self._dtype)

    def fbk(self) -> str:
        return f"{self.dtype.fbk}[{self.n}][{self.m}]"

    def __call__(self, *args: Any) -> Any:
        a = np.array(args[0] if len(args) == 1 else args, dtype=self.dtype.np)
        return a.reshape(self.n, self.m) if a.size > 1 else np.full((self.n, self.m), a)

    def __repr__(self) -> str:
        return f"ti.types.matrix({self.n}, {self.m}, {self.dtype!r})"


class Template:
    """ti.template(): the argument is known when the kernel is compiled (a
    field, or a Python number that gives the kernel a version of its own)."""

    def __repr__(self) -> str:
        return "ti.template()"


def template() -> Template:
    return Template()


class NdarrayType:
    """ti.types.ndarray(dtype=None, ndim=None): a NumPy array argument
    (element type: a scalar type, ti.types.vector/matrix, or None for the
    array's own); see _runtime.ndarray_field."""

    def __init__(self, dtype: Any = None, ndim: Any = None, *args: Any, **kwargs: Any):
        self.dtype = dtype
        self.ndim = ndim


class _TypesModule:
    """ti.types."""
    vector = VectorType
    matrix = MatrixType
    ndarray = NdarrayType
    template = Template
    f32, f64, i32, i64, u32, u64 = f32, f64, i32, i64, u32, u64

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"ti.types.{name} is not supported by fusebox.taichi "
                             "(see docs/from-taichi.md)")

    @staticmethod
    def struct(**kw: Any) -> Any:
        raise NotImplementedError("ti.types.struct is not supported by fusebox.taichi: use one "
                                  "field per member")


types = _TypesModule()
