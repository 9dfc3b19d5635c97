"""The front end's layout warnings (several fields interleaved in one dense
block) reach Python: DescribeSource's SourceInfo.warnings, bounded by the
server; Session and Client.describe emit them as fusebox.LayoutWarning,
once per session; `field` lines and fusebox.taichi's shape= fields (a block
each) give none."""
import warnings

import numpy as np

import fusebox
import fusebox.taichi as ti
from fusebox._proto import pb

AOS = ("layout {\n  dense(ij: 8, 8) { place u: f32, v: f32 }\n}\n"
       "kernel init() { for i, j in u { u[i, j] = 1.0\n v[i, j] = 2.0 } }\n")
SOA = ("layout {\n  field u: f32 (ij: 8, 8)\n  field v: f32 (ij: 8, 8)\n}\n"
       "kernel init() { for i, j in u { u[i, j] = 1.0\n v[i, j] = 2.0 } }\n")


def layout_warnings(rec):
    return [w for w in rec if issubclass(w.category, fusebox.LayoutWarning)]


def test_session_of_interleaved_program_warns_once(fb):
    assert issubclass(fusebox.LayoutWarning, UserWarning)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s = fb.session(AOS, filename="aos.fbk")
        s.kernels.init()
        assert s.fields.v.to_numpy().sum() == 128.0
        s.sync()
        s.close()
    got = layout_warnings(rec)
    assert len(got) == 1, [str(w.message) for w in got]
    msg = str(got[0].message)
    assert msg.startswith("aos.fbk:2:3: warning: 2 fields ('u', 'v') are interleaved"), msg
    assert "'field u: f32 (ij: 8, 8)'" in msg
    assert got[0].filename == __file__  # at the caller's line


def test_field_shorthand_does_not_warn(fb):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s = fb.session(SOA)
        s.kernels.init()
        assert s.fields.v.to_numpy().sum() == 128.0
        s.close()
        p = fb.describe(SOA)
    assert not layout_warnings(rec) and p.warnings == []


def test_describe_warns_and_lists(fb):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        p = fb.describe(AOS, filename="aos.fbk")
    assert len(layout_warnings(rec)) == 1 and len(p.warnings) == 1
    assert "interleaved" in p.warnings[0]


def test_many_interleaved_blocks_give_a_capped_list(fb):
    n = 300
    src = "".join(f"layout {{ dense(i: 4) {{ place a{k}: f32, b{k}: f32 }} }}\n"
                  for k in range(n))
    info = fb._call("DescribeSource", pb.Source(text=src, filename="many.fbk"))
    ws = list(info.warnings)
    assert len(ws) == 17, len(ws)
    assert all(len(w.encode()) < 1024 for w in ws)
    assert ws[0].startswith("many.fbk:1:10: warning: 2 fields ('a0', 'b0')"), ws[0]
    assert ws[15].startswith("many.fbk:16:10: warning:") and "'a15'" in ws[15]
    assert ws[16] == f"many.fbk: ... and {n - 16} more warnings"
    # hostile names: each warning is cut at 1 KiB
    long = "x" * 5000
    info = fb._call("DescribeSource", pb.Source(
        text=f"layout {{ dense(i: 4) {{ place {long}: f32, y: f32 }} }}\n"))
    assert len(info.warnings) == 1 and len(info.warnings[0].encode()) == 1023
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fb.describe(src)
    assert len(layout_warnings(rec)) == 17


def test_taichi_shape_fields_do_not_warn(fb):
    ti.init(server=fb)
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            x = ti.field(ti.f32, shape=(8, 8))
            y = ti.field(ti.f32, shape=(8, 8))
            v = ti.Vector.field(2, ti.f32, shape=(8, 8))

            @ti.kernel
            def fill():
                for i, j in x:
                    x[i, j] = 1.0
                    y[i, j] = 2.0
                    v[i, j] = ti.Vector([x[i, j], y[i, j]])

            fill()
            assert np.all(v.to_numpy()[..., 1] == 2.0)
        assert not layout_warnings(rec), [str(w.message) for w in layout_warnings(rec)]
    finally:
        ti.reset()
