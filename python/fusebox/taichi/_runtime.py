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
        self.fwd: Any = None  # the ti.ad.FwdMode entered, if any
        self.generation = 0  # sessions replaced by _reopen_layout so far
        self.nd_fields: Dict[Any, Field] = {}  # the fields of ndarray arguments (ndarray_field)
        self.saved: Dict[str, np.ndarray] = {}  # values to restore into the next session
        self.cell_reads = 0  # Python-scope x[i, j] read as one cell (Field._cell)

    # ---------------------------------------------------------------- layout
    def _check_open_layout(self, what: str) -> None:
        if self.session is not None and self._reopen_layout(what):
            return
        if self.session is not None:
            raise TaichiRuntimeError(
                f"{what}: the layout was already sent to fuseboxd ({self.where_materialized}); "
                "on Fusebox every field must be declared before the first kernel launch or "
                "field access: move this declaration above it")

    def _reopen_layout(self, what: str) -> bool:
        """A field (or SNode) declared after the layout was sent: Taichi
        starts a new SNode tree; here the session is replaced by one whose
        layout has the new declarations too. Every field's values (and
        gradients) are read now and written into the new session when it
        starts (_materialize); kernels are translated and registered again
        on first use. Only for all-dense layouts (reading a sparse field
        back would lose which cells are active) and not while a tape
        records. False where it cannot (the caller raises)."""
        if self.tape is not None or self.fwd is not None or self._sparse_below(self.root):
            return False
        saved: Dict[str, np.ndarray] = {}
        for f in self._placed():
            saved[f.name] = f.to_numpy()
            if f.needs_grad:
                saved[f.name + ".grad"] = f.grad.to_numpy()
            if f.needs_dual:
                saved[f.name + ".dual"] = f.dual.to_numpy()
        try:
            self.session.close()
        except Exception:
            pass
        self.session = None
        self.saved = saved
        self.generation += 1
        self.prog = Program(self)
        self.helpers = {}
        return True

    @staticmethod
    def _sparse_below(n: SNode) -> bool:
        return any(isinstance(c, SNode) and (c.kind != "dense" or Runtime._sparse_below(c))
                   for c in n.children)

    def _restore_saved(self) -> None:
        """The values read by _reopen_layout, into the new session."""
        saved, self.saved = self.saved, {}
        for nm, a in saved.items():
            self.session.fields[nm].from_numpy(a)

    def make_field(self, dtype: Any, elem: Tuple[int, ...], shape: Any, name: str,
                   needs_grad: bool, kw: Dict[str, Any], needs_dual: bool = False) -> Field:
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
        if needs_dual:
            if not f.dtype.fbk.startswith("f"):
                raise TaichiTypeError(f"needs_dual=True on a field of {f.dtype.fbk}: only "
                                      "float fields (f32, f64) have duals")
            f.needs_dual = True
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
                                               backend=self._backend(),
                                               seed=self.seed + self.generation)
        except Exception as e:
            raise self._mapped(e, self.layout) from None
        if self.saved:
            self._restore_saved()

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
        msg = map_diagnostics(e.message, lines)
        # forward mode's fix in Taichi's terms: a field declared with a dual
        msg = re.sub(r"\(place [\w.]+: [\w\[\]]+ dual\)", "(needs_dual=True)", msg)
        return TaichiCompilationError(msg)

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
        self._gen = 0  # the runtime's generation the cache belongs to
        self._written: Optional[set] = None  # parameters the body writes (_written_params)
        self._nd_back: List[Any] = []  # (field, array) to copy back after this launch

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
        try:
            ba = self.sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TaichiTypeError(f"kernel {self.fn.__name__}(): {e}") from None
        ba.apply_defaults()
        nds = self._ndarray_fields(r, ba)  # may add fields to the layout: before it is sent
        if self._rt is not r or self._gen != r.generation:
            self._cache, self._rt, self._gen = {}, r, r.generation
        r._materialize()
        key: List[Any] = []
        statics: Dict[str, Any] = {}
        params: List[Tuple[str, str]] = []
        values: List[Any] = []
        for pname, val in ba.arguments.items():
            ann = self.sig.parameters[pname].annotation
            where = f"kernel {self.fn.__name__}(): argument '{pname}'"
            if pname in nds:
                f = nds[pname][0]
                key.append(("nd", id(f)))
                statics[pname] = f
                f.from_numpy(nds[pname][1])  # in, before the launch
                continue
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

    def _ndarray_fields(self, r: Runtime, ba: Any) -> Dict[str, Tuple[Field, Any]]:
        """The ti.types.ndarray() arguments: name -> (the field that stands
        for it, the array). Each (kernel, parameter, element type, shape)
        gets a field of its own in the layout (declared on first use); the
        kernel reads and writes that field like a ti.template() one; the
        array is copied into it before each launch and, when the kernel
        writes the parameter, back into the array after it (a Taichi
        ndarray argument is passed by reference)."""
        out: Dict[str, Tuple[Field, Any]] = {}
        for pname, val in ba.arguments.items():
            ann = self.sig.parameters[pname].annotation
            if not (isinstance(ann, _types.NdarrayType) or ann is _types.NdarrayType):
                continue
            where = f"kernel {self.fn.__name__}(): argument '{pname}'"
            out[pname] = ndarray_field(r, self.fn, pname, ann, val, where)
        if out and self._written is None:
            self._written = _written_params(self.fn)
        self._nd_back = [(f, a) for pname, (f, a) in out.items() if pname in self._written]
        return out

    def _copy_back(self) -> None:
        for f, a in self._nd_back:
            np.copyto(a, f.to_numpy().astype(a.dtype, copy=False))
        self._nd_back = []

    def _adjoint(self, r: Runtime, inst: List[Any]) -> int:
        """The id of the adjoint of an instance: ``"k.grad"`` registered from
        the kernel's program, so a refusal (the kernel cannot be
        differentiated) is reported at the user's Python line."""
        if inst[5] is None:
            name, lines = inst[3], inst[4]
            inst[5] = r.register(lines, name + ".grad", self.fn.__name__ + ".grad")
        return inst[5]

    def _tangent(self, r: Runtime, inst: List[Any]) -> int:
        """The id of the tangent of an instance (forward mode): ``"k.dual"``
        registered from the kernel's program, as the adjoint above."""
        if inst[6] is None:
            name, lines = inst[3], inst[4]
            inst[6] = r.register(lines, name + ".dual", self.fn.__name__ + ".dual")
        return inst[6]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        r, inst, values = self._prepare(args, kwargs)
        if r.tape is not None and r.tape._front is not None:  # grad_replaced exist
            r.tape._front.on_launch(self, r, inst, values)
        elif r.tape is not None:
            self._adjoint(r, inst)  # refused before it is recorded
        # inside ti.ad.FwdMode the kernel's tangent runs in its place
        r.launch(inst[0] if r.fwd is None else self._tangent(r, inst), values)
        self._copy_back()
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
        # kid, parameter types, return type, .fbk name, program lines, adjoint id, tangent id
        return [kid, [p for _, p in params], ret, name, lines, None, None]


def ndarray_field(r: Runtime, fn: Any, pname: str, ann: Any, val: Any,
                  where: str) -> Tuple[Field, Any]:
    """The field that stands for a ti.types.ndarray() argument (see
    Kernel._ndarray_fields), and the argument as a NumPy array."""
    if hasattr(val, "to_numpy") and not isinstance(val, np.ndarray):
        raise TaichiTypeError(f"{where}: ti.types.ndarray() takes a NumPy array; a field goes "
                              "to a ti.template() parameter")
    a = val if isinstance(val, np.ndarray) else np.asarray(val)
    if a.dtype == object or a.dtype.kind not in "biuf":
        raise TaichiTypeError(f"{where}: a ti.types.ndarray() argument must be an array of "
                              f"numbers, not {a.dtype}")
    dt = getattr(ann, "dtype", None)
    elem: Tuple[int, ...] = ()
    if isinstance(dt, (_types.VectorType, _types.MatrixType)):
        elem = (dt.n,) if isinstance(dt, _types.VectorType) else (dt.n, dt.m)
        base = dt.dtype
    else:
        base = dt
    if elem and a.shape[len(a.shape) - len(elem):] != elem:
        raise TaichiTypeError(f"{where}: an array of shape {a.shape} does not end in the "
                              f"element shape {elem} the parameter declares")
    shape = a.shape[:len(a.shape) - len(elem)]
    ndim = getattr(ann, "ndim", None)
    if ndim is not None and len(shape) != int(ndim):
        raise TaichiTypeError(f"{where}: the parameter declares ndim={ndim}; the array has "
                              f"{len(shape)} dimension(s) (shape {a.shape})")
    if not 1 <= len(shape) <= 4 or 0 in shape:
        raise TaichiTypeError(f"{where}: an array of shape {a.shape}: Fusebox takes ndarray "
                              "arguments of 1 to 4 dimensions, none of them empty")
    try:
        t = _types.resolve(base if base is not None else
                           (a.dtype if a.dtype.kind != "b" else np.int32), where)
    except TypeError as e:
        raise TaichiTypeError(str(e)) from None
    key = (fn, pname, t.fbk, shape, elem)
    nd = r.nd_fields.get(key)
    if nd is None:
        nd = r.nd_fields[key] = r.make_field(t, elem, shape, f"ndarray_{fn.__name__}_{pname}",
                                             False, {})
    return nd, a


def _written_params(fn: Any) -> set:
    """The parameters a kernel writes through (p[...] = v, p[...] += v,
    ti.atomic_*(p[...], v)): for ndarray arguments, copied back."""
    import ast
    import textwrap
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return set(inspect.signature(fn).parameters)  # unknown: copy every one back
    out = set()

    def base(e: Any) -> Any:
        while isinstance(e, (ast.Subscript, ast.Attribute)):
            e = e.value
        return e.id if isinstance(e, ast.Name) else None

    for n in ast.walk(tree):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for tg in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if isinstance(tg, (ast.Subscript, ast.Attribute)):
                    out.add(base(tg))
        elif isinstance(n, ast.Call) and n.args and "atomic" in ast.unparse(n.func):
            out.add(base(n.args[0]))
    return out


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


def clear_all_duals() -> None:
    """Set every dual field to 0 (forward mode)."""
    r = rt()
    for f in r.fields:
        if f.needs_dual:
            f.dual.fill(0)


class FwdMode:
    """``with ti.ad.FwdMode(loss=, param=, seed=):`` forward mode. Entering
    sets every dual to 0 (``clear_gradients=False`` keeps them) and
    param.dual to the seed; the kernels launched inside run their tangent
    ("k.dual", made on the server) in their place, so on leaving each
    loss's dual holds J · seed, the derivative along the seed. Leaving sets
    param.dual back to 0."""

    def __init__(self, loss: Any, param: Any, seed: Any = None, clear_gradients: bool = True):
        losses = loss if isinstance(loss, (list, tuple)) else [loss]
        for ls in losses:
            if not isinstance(ls, Field) or ls.elem:
                what = "a vector or matrix field" if isinstance(ls, Field) else type(ls).__name__
                raise TaichiTypeError("ti.ad.FwdMode(loss=...): the loss must be a scalar field "
                                      f"(or a list of them) with needs_dual=True, not {what}")
        if not isinstance(param, Field) or param.elem:
            raise TaichiTypeError("ti.ad.FwdMode(param=...): the parameter must be a scalar "
                                  "field with needs_dual=True (vector and matrix fields are not "
                                  "supported, as in Taichi)")
        self.losses = list(losses)
        self.param = param
        self.seed = None if seed is None else [float(x) for x in seed]
        self.clear = clear_gradients

    def __enter__(self) -> "FwdMode":
        r = rt()
        r._materialize()
        if r.fwd is not None:
            raise TaichiRuntimeError("ti.ad.FwdMode: forward mode is already entered (it does "
                                     "not nest)")
        if r.tape is not None:
            raise TaichiRuntimeError("ti.ad.FwdMode: a ti.ad.Tape is recording; end it first")
        for f in [self.param] + self.losses:
            if f._rt is not r:
                raise TaichiRuntimeError("ti.ad.FwdMode: the field belongs to an earlier "
                                         "ti.init()")
            f.dual  # the clear error when it has no dual
        n = int(np.prod(self.param.shape)) if self.param.shape else 1
        if self.seed is None:
            if n != 1:
                raise TaichiRuntimeError(
                    f"ti.ad.FwdMode: seed= is needed for the parameter '{self.param.name}' of "
                    f"{n} elements: a list of {n} numbers, the direction of the derivative "
                    "(e.g. [0, ..., 1, ..., 0] for the derivative with respect to one element)")
            self.seed = [1.0]
        if len(self.seed) != n:
            raise TaichiRuntimeError(
                f"ti.ad.FwdMode: the seed has {len(self.seed)} numbers; the parameter "
                f"'{self.param.name}' has {n} elements: give one number per element")
        if self.clear:
            clear_all_duals()
        dual = self.param.dual
        if self.param.shape:
            dual.from_numpy(np.array(self.seed, dtype=self.param.dtype.np)
                            .reshape(self.param.shape))
        else:
            dual[None] = self.seed[0]
        r.fwd = self
        return self

    def __exit__(self, *exc: Any) -> None:
        r = rt()
        r.fwd = None
        if r.session is not None and not r.closed:
            self.param.dual.fill(0)  # the seed is taken back, as in Taichi


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
        if r.fwd is not None:
            raise TaichiRuntimeError("ti.ad.Tape: forward mode (ti.ad.FwdMode) is entered; "
                                     "leave it first")
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
