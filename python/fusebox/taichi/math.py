"""ti.math (``import taichi.math as tm`` once fusebox.taichi stands in for
taichi): GLSL-style helpers and vector types, usable in kernels."""
import math as _m

from fusebox.taichi import _types
from fusebox.taichi._ops import (abs, acos, asin, atan, atan2, ceil, clamp, cmul, cos, cross,
                                 determinant, distance, dot, exp, floor, fract, inverse, length,
                                 log, log2, max, min, mix, normalize, pow, reflect, rotation2d,
                                 round, sign, sin, smoothstep, sqrt, step, tan, tanh, transpose)

pi = _m.pi
e = _m.e
inf = float("inf")
nan = float("nan")
vec2 = _types.VectorType(2, None)
vec3 = _types.VectorType(3, None)
vec4 = _types.VectorType(4, None)
ivec2 = _types.VectorType(2, int)
ivec3 = _types.VectorType(3, int)
ivec4 = _types.VectorType(4, int)
mat2 = _types.MatrixType(2, 2, None)
mat3 = _types.MatrixType(3, 3, None)
mat4 = _types.MatrixType(4, 4, None)

__all__ = ["abs", "acos", "asin", "atan", "atan2", "ceil", "clamp", "cmul", "cos", "cross",
           "determinant", "distance", "dot", "exp", "floor", "fract", "inverse", "length", "log",
           "log2", "max", "min", "mix", "normalize", "pow", "reflect", "rotation2d", "round",
           "sign", "sin", "smoothstep", "sqrt", "step", "tan", "tanh", "transpose", "pi", "e",
           "inf", "nan",
           "vec2", "vec3", "vec4", "ivec2", "ivec3", "ivec4", "mat2", "mat3", "mat4"]
