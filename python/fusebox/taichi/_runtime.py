"""The runtime of fusebox.taichi: the connection to fuseboxd, the session
(made when the layout is materialized), kernels translated, registered and
launched, and the mapping of server errors back to the user's lines."""
from __future__ import annotations

import atexit
import inspect
import linecache
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import grpc
import numpy as np

from fusebox.taichi import _customgrad, _types
from fusebox.taichi._errors import (TaichiCompilationError, TaichiRuntimeError,
                                    TaichiSyntaxError, TaichiTypeError)
from fusebox.taichi._fields import (Axes, Field, SNode, layout_lines, name_fields, shape_tuple)
from fusebox.taichi._translate import Program, translate_kernel

FILENAME = "taichi_program.fbk"

# what each arch asks the server for
_CPU_ARCHS = {"cpu", "x64", "arm64"}


class Arch:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"ti.{self.name}"


cpu, gpu, cuda, vulkan, metal, opengl, dx11, dx12, gles, x64, arm64, amdgpu = (
    Arch(n) for n in ("cpu", "gpu", "cuda", "vulkan", "metal", "opengl", "dx11", "dx12", "gles",
                      "x64", "arm64", "amdgpu"))


class Runtime:
    def __init__(self, arch: Any = None, async_mode: bool = False, random_seed: int = 0,
                 server: Any = None, **kw: Any):
        self.arch = arch
        self.mode = "async" if async_mode else "sync"
        self.seed = int(random_seed or 0)
        self.server = server
        self.client: Any = None
        self.own_client = False
        self.session: Any = None
        self.root = SNode(self, "root", None, (), ())
        self.fields: List[Field] = []
        self.field_names: set = set()
        self.prog = Program(self)
        self.layout: List[Tuple[str, Tuple[str, int]]] = []
        self.where_materialized = ""
        self.helpers: Dict[Any, int] = {}
        self.closed = False
        self.tape: Any = None  # the ti.ad.Tape recording, if any

    # ---------------------------------------------------------------- layout
    def _check_open_layout(self, what: str) -> None:
        if self.session is not None:
            raise TaichiRuntimeError(
                f"{what}: the layout was already sent to fuseboxd ({self.where_materialized}); "
                "on Fusebox every field must be declared before the first kernel launch or "
                "field access: move this declaration above it")

    def make_field(self, dtype: Any, elem: Tuple[int, ...], shape: Any, name: str,
                   needs_grad: bool, kw: Dict[str, Any]) -> Field:
        if kw.get("offset") is not None:
            raise TaichiSyntaxError("ti.field(..., offset=...) is not supported by "
                                    "fusebox.taichi: subtract the offset in the index instead")
        self._check_open_layout("declaring a field")
        f = Field(self, _types.resolve(dtype), elem, name)
        if needs_grad:
            if not f.dtype.fbk.startswith("f"):
                raise TaichiTypeError(f"needs_grad=True on a field of {f.dtype.fbk}: only "
                                      "float fields (f32, f64) have gradients")
            f.needs_grad = True
        self.fields.append(f)
        if shape is not None:
            sh = shape_tuple(shape)
            if not sh:
                self.root.place(f)
            else:
                if len(sh) > 4:
                    raise ValueError("fields have at most 4 dimensions on Fusebox")
                self.root.dense(Axes(*range(len(sh))), sh).place(f)
        return f

    def _materialize(self) -> None:
        if self.session is not None:
            return
        if self.closed:
            raise TaichiRuntimeError("this program's runtime was ended by ti.init() or "
                                     "ti.reset(): declare fields and kernels again")
        import sys
        fr: Any = sys._getframe(1)
        while fr is not None and fr.f_globals.get("__name__", "").startswith("fusebox.taichi"):
            fr = fr.f_back
        self.where_materialized = (f"at {fr.f_code.co_filename}:{fr.f_lineno}"
                                   if fr is not None else "")
        for f in self.fields:
            if f.snode is None:
                raise TaichiRuntimeError(
                    f"{f.where[0]}:{f.where[1]}: a field declared without shape= was never "
                    "placed: give it shape=... or place it with ti.root.dense(...).place(x)")
        snodes: List[SNode] = []

        def walk(n: SNode) -> None:
            for c in n.children:
                if isinstance(c, SNode):
                    snodes.append(c)
                    walk(c)
        walk(self.root)
        placed = [c for c in self._placed()]
        name_fields(placed, snodes)
        self.field_names = {f.name for f in placed} | {s.name for s in snodes if s.name}
        self.layout = layout_lines(self.root)
        # 0-D fields for kernel-scope accumulators of parallel loops (_translate._reductions)
        from fusebox.taichi._translate import REDUCE_SLOTS, reduce_slot
        slots = [reduce_slot(t, k) for t in ("f32", "f64", "i32", "i64")
                 for k in range(REDUCE_SLOTS)]
        self.layout[-1:-1] = [(f"  place {nm}: {nm.split('_')[2]}", ("", 0)) for nm in slots]
        self.field_names |= set(slots)
        self._connect()
        text = "\n".join(t for t, _ in self.layout) + "\n"
        try:
            self.session = self.client.session(source=text, filename=FILENAME, mode=self.mode,
                                               backend=self._backend(), seed=self.seed)
        except Exception as e:
            raise self._mapped(e, self.layout) from None

    def _placed(self) -> List[Field]:
        out: List[Field] = []

        def walk(n: SNode) -> None:
            for c in n.children:
                if isinstance(c, Field):
                    out.append(c)
                else:
                    walk(c)
        walk(self.root)
        return out

    def _backend(self) -> str:
        a = self.arch
        name = a.name if isinstance(a, Arch) else (a or "")
        if name in _CPU_ARCHS:
            return "cpu"
        return "auto"

    def _connect(self) -> None:
        if self.client is not None:
            return
        import fusebox
        srv = self.server
        if srv is not None and not isinstance(srv, str):
            self.client = srv
            return
        addr = srv or os.environ.get("FUSEBOX_SERVER") or None
        self.client = fusebox.connect(addr)
        self.own_client = True

    def register(self, lines: List[Tuple[str, Tuple[str, int]]], name: str, label: str) -> int:
        """Register kernel name of the program lines (the layout first) on
        the session; a refusal is raised at the user's lines."""
        from fusebox._proto import pb
        from fusebox.errors import ServerError
        text = "\n".join(t for t, _ in lines) + "\n"
        if os.environ.get("FUSEBOX_TAICHI_SHOW"):  # the generated program, for debugging
            import sys
            sys.stderr.write(f"--- {FILENAME} for {label}\n{text}")
        s = self.session
        req = pb.RegisterKernelsRequest(session_id=s.id,
                                        source=pb.Source(text=text, filename=FILENAME),
                                        instances=[pb.KernelInstance(kernel=name)])
        try:
            kid = s._c._call("RegisterKernels", req).kernel_ids[0]
        except ServerError as e:
            raise self._mapped(e, lines) from None
        s._names[kid] = label
        return kid

    def launch(self, kid: int, values: List[Any]) -> None:
        from fusebox._proto import pb
        s = self.session
        s._pending.append(pb.Launch(kernel=kid, args=values))
        s._unsynced = True
        if len(s._pending) >= s._batch:
            s._send()

    def launch_helper(self, key: Any, name: str, body: List[str], label: str,
                      values: Optional[List[Any]] = None) -> None:
        """A kernel of the package's own (deactivate_all, ...), once per key."""
        self._materialize()
        kid = self.helpers.get(key)
        if kid is None:
            kid = self.helpers[key] = self.register(
                self.layout + [(ln, ("", 0)) for ln in body], name, label)
        self.launch(kid, values or [])

    # ---------------------------------------------------------------- errors
    def _mapped(self, e: Exception, lines: List[Tuple[str, Tuple[str, int]]]) -> Exception:
        from fusebox.errors import ServerError
        if not isinstance(e, ServerError) or e.status != grpc.StatusCode.INVALID_ARGUMENT:
            return e
        return TaichiCompilationError(map_diagnostics(e.message, lines))

    def close(self) -> None:
        self.closed = True
        if self.session is not None:
            try:
                self.session.close()
            except Exception:
                pass
            self.session = None
        if self.client is not None and self.own_client:
            try:
                self.client.close()
            except Exception:
                pass
        self.client = None


_DIAG = re.compile(r"^(?:kernel '[^']*': )?" + re.escape(FILENAME) + r":(\d+):(\d+): (error|warning|note): (.*)$")


def map_diagnostics(msg: str, lines: List[Tuple[str, Tuple[str, int]]]) -> str:
    """The server's diagnostics for the generated program, at the user's
    Python lines (the generated line and caret are left out)."""
    out: List[str] = []
    skip = 0
    for ln in msg.splitlines():
        m = _DIAG.match(ln)
        if m:
            gl = int(m.group(1))
            file, pyl = lines[gl - 1][1] if 0 < gl <= len(lines) else ("", 0)
            if not file:
                out.append(f"{m.group(3)}: {m.group(4)}")
            else:
                src = linecache.getline(file, pyl).strip()
                out.append(f"{file}:{pyl}: {m.group(3)}: {m.group(4)}" +
                           (f"\n    {src}" if src else ""))
            skip = 2  # the .fbk source line and its caret
            continue
        if skip:
            skip -= 1
            continue
        if ln.strip():
            out.append(ln)
    return "\n".join(out)


_RT: Optional[Runtime] = None


def rt() -> Runtime:
    global _RT
    if _RT is None:
        _RT = Runtime()
    return _RT


def init(arch: Any = None, async_mode: bool = False, default_fp: Any = None,
         default_ip: Any = None, random_seed: int = 0, server: Any = None, **kw: Any) -> None:
    """ti.init: start over (a new layout; the previous session ends) and
    say how to connect: ``server`` (a fusebox.Client or an address), else
    $FUSEBOX_SERVER, else a private fuseboxd started on first use."""
    global _RT
    if _RT is not None:
        _RT.close()
    _types.defaults.fp = _types.resolve(default_fp) if default_fp is not None else _types.f32
    _types.defaults.ip = _types.resolve(default_ip) if default_ip is not None else _types.i32
    _RT = Runtime(arch, async_mode, random_seed, server)


def reset() -> None:
    global _RT
    if _RT is not None:
        _RT.close()
    _RT = None


def sync() -> None:
    r = rt()
    if r.session is not None:
        r.session.sync()


@atexit.register
def _at_exit() -> None:
    if _RT is not None:
        _RT.close()


# ------------------------------------------------------------------ kernels
_TYPE_NUM = {"i32": 2, "i64": 3, "u32": 4, "u64": 5, "f32": 6, "f64": 7}


def _wire_value(t: str, x: Any, where: str) -> Any:
    import struct
    from fusebox._proto import pb
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, (np.ndarray, list, tuple)) or not isinstance(x, (int, float, bool)):
        raise TaichiTypeError(f"{where} takes a number, not {type(x).__name__}")
    n = _TYPE_NUM[t]
    if t.startswith("f"):
        v = float(x)
        if t == "f32":
            v = float(np.float32(v))
        return pb.Value(type=n, f_bits=struct.unpack("<Q", struct.pack("<d", v))[0])
    v = int(x)  # Taichi truncates a float given to an integer parameter
    if t.startswith("u"):
        return pb.Value(type=n, u=v % (1 << (32 if t == "u32" else 64)))
    return pb.Value(type=n, i=v)


class Kernel:
    """A @ti.kernel: translated per set of compile-time arguments
    (templates), registered on the session, launched with the scalars."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.sig = inspect.signature(fn)
        self._cache: Dict[Any, List[Any]] = {}
        self._rt: Optional[Runtime] = None

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        """A kernel that is a method (@ti.data_oriented): self is a
        compile-time argument, its attributes (fields, numbers) constants."""
        if obj is None:
            return self
        return BoundKernel(self, obj)

    @property
    def grad(self) -> "KernelGrad":
        """kernel.grad(args): launch the adjoint of the kernel (made on the
        server from the kernel's IR; docs/autodiff.md)."""
        return KernelGrad(self)

    def _prepare(self, args: Any, kwargs: Any) -> Tuple[Runtime, List[Any], List[Any]]:
        """The instance for these arguments (translated and registered on
        first use) and the values to launch it with."""
        r = rt()
        if self._rt is not r:
            self._cache, self._rt = {}, r
        r._materialize()
        try:
            ba = self.sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TaichiTypeError(f"kernel {self.fn.__name__}(): {e}") from None
        ba.apply_defaults()
        key: List[Any] = []
        statics: Dict[str, Any] = {}
        params: List[Tuple[str, str]] = []
        values: List[Any] = []
        for pname, val in ba.arguments.items():
            ann = self.sig.parameters[pname].annotation
            where = f"kernel {self.fn.__name__}(): argument '{pname}'"
            if isinstance(ann, _types.NdarrayType) or ann is _types.NdarrayType:
                raise TaichiTypeError(
                    f"{where}: ti.types.ndarray() arguments are not supported by "
                    "fusebox.taichi; declare a ti.field of the array's shape, fill it with "
                    "from_numpy() and pass the field as a ti.template() argument")
            if isinstance(ann, (_types.VectorType, _types.MatrixType)):
                raise TaichiTypeError(f"{where}: vector and matrix arguments are not supported; "
                                      "pass the components as scalars or put it in a field")
            if ann is inspect.Parameter.empty or isinstance(ann, _types.Template) or \
                    ann is _types.Template:
                if isinstance(val, (bool, int, float, np.number)):
                    key.append(("n", type(val).__name__, val))
                else:  # a field, an SNode, a @ti.data_oriented object ...: by identity
                    key.append(("o", id(val)))
                statics[pname] = val
                continue
            try:
                t = _types.resolve(ann, where).fbk
            except TypeError as e:
                raise TaichiTypeError(str(e)) from None
            params.append((pname, t))
            values.append(_wire_value(t, val, where))
        k = tuple(key)
        inst = self._cache.get(k)
        if inst is None:
            inst = self._cache[k] = self._compile(r, statics, params)
        return r, inst, values

    def _adjoint(self, r: Runtime, inst: List[Any]) -> int:
        """The id of the adjoint of an instance: ``"k.grad"`` registered from
        the kernel's program, so a refusal (the kernel cannot be
        differentiated) is reported at the user's Python line."""
        if inst[5] is None:
            name, lines = inst[3], inst[4]
            inst[5] = r.register(lines, name + ".grad", self.fn.__name__ + ".grad")
        return inst[5]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        r, inst, values = self._prepare(args, kwargs)
        if r.tape is not None and r.tape._front is not None:  # grad_replaced exist
            r.tape._front.on_launch(self, r, inst, values)
        elif r.tape is not None:
            self._adjoint(r, inst)  # refused before it is recorded
        r.launch(inst[0], values)
        if inst[2] is not None:
            res = r.session.sync()
            return res.returns[-1][2] if res.returns else None
        return None

    def _compile(self, r: Runtime, statics: Dict[str, Any],
                 params: List[Tuple[str, str]]) -> List[Any]:
        prog = r.prog
        ret = None
        ra = self.sig.return_annotation
        if ra is not inspect.Signature.empty and ra is not None:
            if isinstance(ra, (_types.VectorType, _types.MatrixType)) or isinstance(ra, tuple):
                raise TaichiTypeError(f"kernel {self.fn.__name__}(): only scalar return types "
                                      "are supported; write the result into a field")
            ret = _types.resolve(ra, f"kernel {self.fn.__name__}() return type").fbk
        name = prog.fresh(self.fn.__name__)
        prog.new_funcs = []
        n_func_lines = len(prog.func_lines)
        try:
            klines = translate_kernel(prog, self.fn, name, statics, params, ret)
            lines = r.layout + prog.func_lines + klines
            kid = r.register(lines, name, self.fn.__name__)
        except BaseException:
            for fk in prog.new_funcs:  # the funcs of a refused kernel go with it
                prog.funcs.pop(fk, None)
            del prog.func_lines[n_func_lines:]
            raise
        # kid, parameter types, return type, .fbk name, program lines, adjoint id
        return [kid, [p for _, p in params], ret, name, lines, None]


class BoundKernel:
    """A kernel that is a method, bound to its object (self is the first,
    compile-time argument); ``.grad`` is its adjoint."""

    def __init__(self, k: Kernel, obj: Any):
        self._k, self._obj = k, obj
        self.__name__ = k.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._k(self._obj, *args, **kwargs)

    @property
    def grad(self) -> Any:
        g = KernelGrad(self._k)
        return lambda *a, **kw: g(self._obj, *a, **kw)


class KernelGrad:
    """``kernel.grad``: called with the kernel's arguments, launches its
    adjoint (the same instance's, so template arguments select it too)."""

    def __init__(self, k: Kernel):
        self._k = k
        self.__name__ = k.__name__ + ".grad"

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        r, inst, values = self._k._prepare(args, kwargs)
        r.launch(self._k._adjoint(r, inst), values)


def grad_fields() -> List[Field]:
    r = rt()
    return [f.grad for f in r.fields if f.needs_grad]


def clear_all_gradients() -> None:
    """Set every gradient field to 0 (a fill per gradient field)."""
    for g in grad_fields():
        g.fill(0)


class Tape:
    """``with ti.ad.Tape(loss):`` maps onto the session's tape: the launches
    inside are recorded; at the end the server clears the gradients they
    touch, sets ``loss.grad[None] = 1`` and launches their adjoints newest
    first. As in Taichi, entering sets the loss and every gradient to 0
    (``clear_gradients=False`` keeps the gradients)."""

    def __init__(self, loss: Any = None, clear_gradients: bool = True, validation: bool = False,
                 grad_check: Any = None):
        if not isinstance(loss, Field):
            raise TaichiTypeError("ti.ad.Tape(loss): the loss must be a 0-D field "
                                  f"(ti.field(ti.f32, shape=(), needs_grad=True)), not "
                                  f"{type(loss).__name__}")
        if loss.elem:
            raise TaichiTypeError("ti.ad.Tape(loss): the loss must be a scalar field, not a "
                                  "vector or matrix field")
        self.loss = loss
        self.clear = clear_gradients
        self._inner: Any = None
        self._front: Any = None  # _customgrad.FrontTape while grad_replaced functions exist

    def __enter__(self) -> "Tape":
        r = rt()
        r._materialize()
        if r.tape is not None:
            raise TaichiRuntimeError("ti.ad.Tape: a tape is already recording (tapes do not "
                                     "nest)")
        if self.loss._rt is not r:
            raise TaichiRuntimeError("ti.ad.Tape: the loss belongs to an earlier ti.init()")
        if self.loss.shape != ():
            raise TaichiTypeError(f"ti.ad.Tape(loss): the loss '{self.loss.name}' has shape "
                                  f"{self.loss.shape}; a loss is a 0-D field (shape=())")
        self.loss.grad  # the clear error when the loss has no gradient
        if self.clear:
            clear_all_gradients()
        self.loss.fill(0)  # as Taichi: the loss starts from 0
        if len(_customgrad.defined):  # their backward is Python: the front end records
            self._front = _customgrad.FrontTape()
            r.tape = self
            return self
        self._inner = r.session.tape(r.session.fields[self.loss.name])
        self._inner.__enter__()
        r.tape = self
        return self

    def __exit__(self, *exc: Any) -> None:
        r = rt()
        r.tape = None
        if self._front is not None:
            front, self._front = self._front, None
            if exc[0] is None and r.session is not None:
                front.backward(r, self.loss)
            return
        if self._inner is not None and r.session is not None:
            self._inner.__exit__(*exc)
            self._inner = None
