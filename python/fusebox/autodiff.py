"""Reverse-mode automatic differentiation on a session (docs/autodiff.md).

The gradient of field ``x`` is the field ``x.grad`` of the program (declared
``place x: f32 grad``); ``s.fields.x.grad`` is that :class:`Field`.
``s.kernels.k.grad(args)`` launches the adjoint of ``k`` (made on the server
from ``k``'s IR, once per kernel). ``with s.tape(s.fields.loss): ...``
records the launches inside; at its end the server clears the gradients
they touch, sets ``loss.grad = 1`` and launches their adjoints newest first,
as ordinary launches (in async mode the optimizer then removes a forward
pass whose results nobody reads). Errors (a loss without a gradient, a
kernel whose adjoint is refused, which names that launch) come back from
the next :meth:`Session.sync` as a :class:`fusebox.LaunchError`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from fusebox._proto import pb
from fusebox.errors import Error

if TYPE_CHECKING:  # pragma: no cover
    from fusebox.session import Field, Kernel, Session


def grad_field(f: "Field") -> "Field":
    """The Field holding f's gradient, or a clear error when it has none."""
    from fusebox.session import Field
    s = f._s
    name = f.info.name + ".grad"
    info = s.program.fields.get(name)
    if info is None:
        raise Error(f"field '{f.info.name}' has no gradient: declare it with one "
                    f"('place {f.info.name}: {f.dtype.name.replace('float', 'f')} grad' "
                    "in the program)")
    return Field(s, info)


def add_custom_adjoints(s: "Session", pending: List[Tuple[str, Tuple[str, ...]]], req: Any) -> None:
    """Kernels declared ``kernel k(...) grad k_adj`` (a custom gradient):
    add k_adj's instance for the same fields to the instances about to be
    registered (pending, extended in place) unless it is registered already,
    and bind each pair in the same request (req.custom_adjoints; -1 - i
    names the request's i-th kernel), so the server's adjoint of k, and so
    ``k.grad`` and the tape, is k_adj."""
    n = len(pending)
    for i in range(n):
        name, fields = pending[i]
        info = s.program.kernels.get(name)
        g = info.grad if info is not None else None
        if not g:
            continue
        key = (g, fields)
        if key in s._ids:
            adj = s._ids[key]
        else:
            if key not in pending:
                pending.append(key)
            adj = -1 - pending.index(key)
        req.custom_adjoints.add(kernel=-1 - i, adjoint=adj)


class GradKernel:
    """``k.grad``: launches the adjoint of kernel k with k's arguments."""

    def __init__(self, k: "Kernel"):
        self._k = k
        self.name = k.info.name + ".grad"
        self.__doc__ = f"Launch the adjoint of {k.info.signature}."

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        k = self._k
        s = k._s
        s._check_open()
        fields, values = s._bind_values(k, k._bind(args, kwargs))
        kid = s._kernel_id(k.info, tuple(fields))
        adj = s._adjoints.get(kid)
        if adj is None:
            req = pb.RegisterKernelsRequest(session_id=s.id, adjoints=[kid])
            adj = int(s._c._call("RegisterKernels", req).kernel_ids[0])
            s._adjoints[kid] = adj
            s._names[adj] = s._names.get(kid, k.info.name) + ".grad"
        s._pending.append(pb.Launch(kernel=adj, args=values))
        s._unsynced = True
        if len(s._pending) >= s._batch:
            s._send()

    def __repr__(self) -> str:
        return f"<fusebox adjoint of {self._k.info.signature}>"


def dual_field(f: "Field") -> "Field":
    """The Field holding f's dual (forward mode), or a clear error when it has none."""
    from fusebox.session import Field
    s = f._s
    info = s.program.fields.get(f.info.name + ".dual")
    if info is None:
        raise Error(f"field '{f.info.name}' has no dual: declare it with one "
                    f"('place {f.info.name}: {f.dtype.name.replace('float', 'f')} dual' "
                    "in the program)")
    return Field(s, info)


class DualKernel:
    """``k.dual``: launches the tangent of kernel k (forward mode) with k's
    arguments: it does what k does and, in the duals of the fields k writes,
    leaves J times the duals of the fields k reads. Returns what k returns."""

    def __init__(self, k: "Kernel"):
        self._k = k
        self.name = k.info.name + ".dual"
        self.__doc__ = f"Launch the tangent of {k.info.signature}."

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        k = self._k
        s = k._s
        s._check_open()
        fields, values = s._bind_values(k, k._bind(args, kwargs))
        kid = s._kernel_id(k.info, tuple(fields))
        tan = s._tangents.get(kid)
        if tan is None:
            req = pb.RegisterKernelsRequest(session_id=s.id, tangents=[kid])
            tan = int(s._c._call("RegisterKernels", req).kernel_ids[0])
            s._tangents[kid] = tan
            s._names[tan] = s._names.get(kid, k.info.name) + ".dual"
        s._pending.append(pb.Launch(kernel=tan, args=values))
        s._unsynced = True
        if k.info.ret is not None:
            res = s.sync()
            for _seq, _, v in reversed(res.returns):
                return v
            raise Error(f"{self.name}(): the server sent no return value")
        if len(s._pending) >= s._batch:
            s._send()
        return None

    def __repr__(self) -> str:
        return f"<fusebox tangent of {self._k.info.signature}>"


class Tape:
    """``with s.tape(loss):`` (see the module's docstring)."""

    def __init__(self, s: "Session", loss: Any):
        from fusebox.session import Field
        name = loss.info.name if isinstance(loss, Field) else loss
        if isinstance(loss, Field) and loss._s is not s:
            raise ValueError("tape: the loss is a field of another session")
        if not isinstance(name, str):
            raise TypeError(f"tape: the loss must be a field or a field's name, not "
                            f"{type(loss).__name__}")
        info = s.program.fields.get(name)
        if info is None:
            raise Error(f"tape: no field named '{name}' in the program")
        if len(info.places) != 1 or info.index_shape:
            raise Error(f"tape: the loss '{name}' has shape {info.shape}; a loss is a 0-D "
                        "scalar field")
        if name + ".grad" not in s.program.fields:
            raise Error(f"tape: the loss '{name}' has no gradient: declare it with one "
                        f"('place {name}: ... grad' in the program)")
        self._s = s
        self.loss = name
        self._place = info.places[0]

    def __enter__(self) -> "Tape":
        s = self._s
        s._check_open()
        if s._tape is not None:
            raise Error(f"a tape over '{s._tape.loss}' is already recording: end it before "
                        "beginning another (tapes do not nest)")
        s._mark(pb.TapeMark(end=False, loss=self._place))
        s._tape = self
        return self

    def __exit__(self, *exc: Any) -> None:
        s = self._s
        s._tape = None
        if not s.closed:
            s._mark(pb.TapeMark(end=True))


def tape(s: "Session", loss: Any) -> Tape:
    return Tape(s, loss)


def closing_inside(s: "Session") -> Optional[str]:
    """The loss of the tape recording when s closes, else None."""
    t = getattr(s, "_tape", None)
    return t.loss if t is not None else None
