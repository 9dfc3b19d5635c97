"""Source over the wire at the protocol level (server/session/source.c), as any
gRPC client would use it: the message classes of the package, calls by
hand. The IR path is unchanged and tested by the C suites."""
import grpc
import pytest

import fusebox
from fusebox._proto import pb

SRC = "layout { dense(i: 8) { place x: i32 } }\n" \
      "kernel inc() { for i in x { x[i] += 1 } }\n" \
      "kernel put(F: field, v: i32) { for i in F { F[i] = v } }\n"
OTHER = "layout { dense(i: 9) { place x: i32 } }\nkernel inc() { for i in x { x[i] += 1 } }\n"


def call(c, method, req):
    with pytest.raises(fusebox.ServerError) as e:
        c._call(method, req)
    return e.value


def new_session(c, src=SRC):
    r = c._call("CreateSession", pb.CreateSessionRequest(source=pb.Source(text=src)))
    return r.session_id


def test_create_register_describe(fb):
    sid = new_session(fb)
    r = fb._call("RegisterKernels", pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=SRC)))
    assert len(r.kernel_ids) == 1  # inc: put has a field parameter
    r = fb._call("RegisterKernels", pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=SRC),
        instances=[pb.KernelInstance(kernel="put", fields=["x"]),
                   pb.KernelInstance(kernel="inc")]))
    assert len(r.kernel_ids) == 2 and len(set(r.kernel_ids)) == 2
    info = fb._call("DescribeSource", pb.Source(text=SRC))
    assert [f.name for f in info.fields] == ["x"] and list(info.fields[0].shape) == [8]
    assert [(p.name, p.is_field) for p in info.kernels[1].params] == [("F", True), ("v", False)]
    fb._call("CloseSession", pb.CloseSessionRequest(session_id=sid))


def test_refusals(fb):
    e = call(fb, "CreateSession", pb.CreateSessionRequest(
        source=pb.Source(text=SRC),
        layout=pb.Layout(nodes=[pb.SNode(kind=pb.SN_ROOT, parent=-1)])))
    assert e.status == grpc.StatusCode.INVALID_ARGUMENT and "not both" in e.message
    sid = new_session(fb)
    e = call(fb, "RegisterKernels", pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=OTHER, filename="other.fbk")))
    assert e.status == grpc.StatusCode.INVALID_ARGUMENT
    assert "layout of other.fbk is not the session's" in e.message
    e = call(fb, "RegisterKernels", pb.RegisterKernelsRequest(
        session_id=sid, instances=[pb.KernelInstance(kernel="inc")]))
    assert "need the source" in e.message
    e = call(fb, "RegisterKernels", pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=SRC),
        instances=[pb.KernelInstance(kernel="put")]))
    assert e.status == grpc.StatusCode.INVALID_ARGUMENT and "kernel 'put'" in e.message
    e = call(fb, "RegisterKernels", pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=SRC),
        instances=[pb.KernelInstance(kernel="nope")]))
    assert e.status == grpc.StatusCode.NOT_FOUND and "nope" in e.message
    e = call(fb, "RegisterKernels", pb.RegisterKernelsRequest(
        session_id="0" * 32, source=pb.Source(text=SRC)))
    assert e.status == grpc.StatusCode.NOT_FOUND
    fb._call("CloseSession", pb.CloseSessionRequest(session_id=sid))


def test_source_limits(fb):
    big = SRC + "#" * (1 << 20) + "\n"
    e = call(fb, "DescribeSource", pb.Source(text=big))
    assert e.status == grpc.StatusCode.INVALID_ARGUMENT and "at most 1048576" in e.message
    # substitution may not grow the text past the cap either
    e = call(fb, "CreateSession", pb.CreateSessionRequest(source=pb.Source(
        text=SRC + "#${A}${A}\n", params={"A": "y" * 600000})))
    assert "after substitution is over 1048576" in e.message
    e = call(fb, "DescribeSource", pb.Source(text="${nope}"))
    assert "${nope} is not a parameter" in e.message
    # a layout over the limits of ir/layout.c, and one over the memory limit
    e = call(fb, "DescribeSource", pb.Source(
        text="layout { dense(i: 100000) { dense(i: 100000) { place x: f64 } } }"))
    assert e.status == grpc.StatusCode.INVALID_ARGUMENT and "exceeds 2^31-1" in e.message
    e = call(fb, "CreateSession", pb.CreateSessionRequest(source=pb.Source(
        text="layout { dense(ijk: 100000, 100000, 100000) { place x: f64 } }")))
    assert e.status == grpc.StatusCode.RESOURCE_EXHAUSTED
    # deep nesting is refused, not a stack overflow
    e = call(fb, "DescribeSource", pb.Source(
        text="layout { place x: i32 }\nkernel k() { x[] = " + "(" * 5000 + "1" + ")" * 5000
             + " }"))
    assert e.status == grpc.StatusCode.INVALID_ARGUMENT
    # an error on every statement of a one-line megabyte: the message stays
    # bounded (no source line quoted when it is long) and says how many more
    line = "x[] = y; " * 110000
    e = call(fb, "DescribeSource", pb.Source(
        text="layout { place x: i32 }\nkernel k() { " + line + "}\n", filename="long.fbk"))
    assert e.status == grpc.StatusCode.INVALID_ARGUMENT
    assert e.message.startswith("long.fbk:2:20: error: undefined variable 'y'\n")
    assert len(e.message) <= 4096 and "more errors)" in e.message and line not in e.message
    # many kernels: parsed in linear time; registered by name only past 4096
    many = "layout { place x: i32 }\n" + "".join(f"kernel k{i}() {{ x[] = {i} }}\n"
                                                  for i in range(4097))
    assert len(fb._call("DescribeSource", pb.Source(text=many)).kernels) == 4097
    sid = new_session(fb, many)
    e = call(fb, "RegisterKernels", pb.RegisterKernelsRequest(session_id=sid,
                                                             source=pb.Source(text=many)))
    assert e.status == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 4096" in e.message
    r = fb._call("RegisterKernels", pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=many),
        instances=[pb.KernelInstance(kernel="k4096")]))
    assert len(r.kernel_ids) == 1
    fb._call("CloseSession", pb.CloseSessionRequest(session_id=sid))
    assert fb.info().version  # and the server goes on


def test_describe_malformed(fb):
    ch = fb._channel.unary_unary("/fusebox.v1.Fusebox/DescribeSource")
    with pytest.raises(grpc.RpcError) as e:
        ch(b"\xff\xff\xff", timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid fusebox.v1.Source" in e.value.details()
