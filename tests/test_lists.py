"""The Python client's copies of C's lists, checked against C's own (ctest
entry test_lists; issue 41, item 4):

* the error codes: include/fusebox/errors.h (the FB_ERR X-macro that makes
  the FB_E* enum) against FB_CODES of python/fusebox/errors.py;
* the counters: the FB_COUNTERS list of include/fusebox/counters.h (which
  generates struct fb_counters) against the Counters message of
  proto/fusebox.proto and the Counters dataclass of
  python/fusebox/session.py (names, order and type: uint64_t is an int,
  double a float; and which are levels rather than cumulative, against
  session.py's _LEVEL_COUNTERS);
* the limits the Python client shares with C: FB_CLIENT_MAX_MESSAGE_BYTES
  and FB_CHUNK_BYTES_DEFAULT of include/fusebox/limits.h against
  MAX_MESSAGE_BYTES (python/fusebox/client.py) and CHUNK_BYTES
  (python/fusebox/session.py).

Each list is read from its source text (the C header, the .proto, the
Python module's syntax tree), so the check needs no build and imports
nothing of the package. A name or value present on one side only fails,
in either direction. The last tests feed the readers altered text to show
that a drift is caught.
"""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _strip_c_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


# ------------------------------------------------------------------ readers

def c_error_codes(text):
    """{value: "FB_NAME"} of every FB_ERR(NAME, value, ...) but FB_OK."""
    codes = {}
    for name, value in re.findall(r"^\s*FB_ERR\(\s*(\w+)\s*,\s*(-?\d+)\s*,",
                                  _strip_c_comments(text), flags=re.M):
        if name == "OK":
            continue
        assert int(value) not in codes, f"errors.h: value {value} twice"
        codes[int(value)] = "FB_" + name
    assert codes, "errors.h: no FB_ERR(...) entries found (has its form changed?)"
    return codes


def c_counters(text):
    """[(name, 'int'|'float')] of the FB_COUNTERS list, in order."""
    return [(n, t) for n, t, _ in c_counter_entries(text)]


def c_counter_entries(text):
    """[(name, 'int'|'float', 'SUM'|'LEVEL')] of FB_COUNTERS(X), in order."""
    m = re.search(r"^#define\s+FB_COUNTERS\(X\)((?:[^\n]*\\\n)*[^\n]*)",
                  _strip_c_comments(text), flags=re.M)
    assert m, "counters.h: no '#define FB_COUNTERS(X)'"
    body = m.group(1).replace("\\\n", " ")
    entries = re.findall(r"\bX\(\s*(\w+)\s*,\s*(uint64_t|double)\s*,\s*(SUM|LEVEL)\s*,", body)
    assert len(entries) == len(re.findall(r"\bX\(", body)), \
        "counters.h: an FB_COUNTERS entry this test cannot read"
    assert entries, "counters.h: FB_COUNTERS has no entries"
    return [(n, "float" if t == "double" else "int", k) for n, t, k in entries]


def proto_counters(text):
    """[(name, 'int'|'float')] of message Counters, in field-number order."""
    m = re.search(r"message\s+Counters\s*\{(.*?)\}", re.sub(r"//[^\n]*", " ", text), flags=re.S)
    assert m, "fusebox.proto: no 'message Counters'"
    fields = re.findall(r"(uint64|double)\s+(\w+)\s*=\s*(\d+)\s*;", m.group(1))
    fields.sort(key=lambda f: int(f[2]))
    return [(n, "float" if t == "double" else "int") for t, n, _ in fields]


def py_error_codes(text):
    """FB_CODES of errors.py, a dict literal of int: str."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "FB_CODES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("python/fusebox/errors.py: no FB_CODES = {...}")


def py_level_counters(text):
    """The names in _LEVEL_COUNTERS of session.py (what since() keeps)."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_LEVEL_COUNTERS" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("python/fusebox/session.py: no _LEVEL_COUNTERS = (...)")


def py_counters(text):
    """[(name, 'int'|'float')] of the Counters dataclass's annotated fields."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == "Counters":
            out = []
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    out.append((st.target.id, ast.unparse(st.annotation)))
            return out
    raise AssertionError("python/fusebox/session.py: no class Counters")


def _int_expr(node, what):
    """The value of an integer expression of literals, <<, +, - and (u)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp):
        a, b = _int_expr(node.left, what), _int_expr(node.right, what)
        ops = {ast.LShift: lambda: a << b, ast.Add: lambda: a + b, ast.Sub: lambda: a - b,
               ast.Mult: lambda: a * b}
        if type(node.op) in ops:
            return ops[type(node.op)]()
    raise AssertionError(f"{what}: not an integer expression this test can read")


def c_limits(text):
    """{NAME: value} of limits.h's #define FB_NAME <integer expression>."""
    out = {}
    for name, expr in re.findall(r"^#define\s+(FB_\w+)\s+(.+?)\s*$", _strip_c_comments(text),
                                 flags=re.M):
        expr = re.sub(r"\b(\d+)u\b", r"\1", expr)
        expr = re.sub(r"\bFB_\w+\b", lambda m: str(out[m.group(0)]), expr)
        out[name] = _int_expr(ast.parse(expr, mode="eval").body, f"limits.h {name}")
    assert out, "limits.h: no #define FB_... found"
    return out


def py_constant(text, name, where):
    """The integer a module-level NAME = <expression> assigns."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return _int_expr(node.value, f"{where} {name}")
    raise AssertionError(f"{where}: no {name} = ...")


# the Python constants that are copies of limits.h's, and where they are
PY_LIMITS = (("FB_CLIENT_MAX_MESSAGE_BYTES", "MAX_MESSAGE_BYTES", "python/fusebox/client.py"),
             ("FB_CHUNK_BYTES_DEFAULT", "CHUNK_BYTES", "python/fusebox/session.py"))


def limit_drift(limits_h, py_texts):
    c = c_limits(limits_h)
    out = []
    for cname, pyname, where in PY_LIMITS:
        v = py_constant(py_texts[where], pyname, where)
        if c[cname] != v:
            out.append(f"limits: {cname} is {c[cname]} in C, {pyname} is {v} in {where}")
    return out


# ------------------------------------------------------------------ compare

def drift(what, c_side, other_side, other_name):
    """Lines describing every difference between two lists or dicts."""
    out = []
    if isinstance(c_side, dict):
        for k in sorted(set(c_side) | set(other_side), reverse=True):
            if k not in other_side:
                out.append(f"{what}: {c_side[k]} = {k} is in C, not in {other_name}")
            elif k not in c_side:
                out.append(f"{what}: {other_side[k]} = {k} is in {other_name}, not in C")
            elif c_side[k] != other_side[k]:
                out.append(f"{what}: {k} is {c_side[k]} in C, {other_side[k]} in {other_name}")
        return out
    cn, on = [n for n, _ in c_side], [n for n, _ in other_side]
    out += [f"{what}: '{n}' is in C, not in {other_name}" for n in cn if n not in on]
    out += [f"{what}: '{n}' is in {other_name}, not in C" for n in on if n not in cn]
    ck, ok = dict(c_side), dict(other_side)
    out += [f"{what}: '{n}' is {ck[n]} in C, {ok[n]} in {other_name}"
            for n in cn if n in ok and ck[n] != ok[n]]
    if not out and cn != on:
        out.append(f"{what}: order differs: C {cn}, {other_name} {on}")
    return out


def check_all(errors_h, counters_h, proto, errors_py, session_py):
    c_codes = c_error_codes(errors_h)
    c_ctrs = c_counters(counters_h)
    c_levels = {n for n, _, k in c_counter_entries(counters_h) if k == "LEVEL"}
    py_levels = py_level_counters(session_py)
    return (drift("error codes", c_codes, py_error_codes(errors_py), "python/fusebox/errors.py")
            + drift("counters", c_ctrs, proto_counters(proto), "proto/fusebox.proto")
            + drift("counters", c_ctrs, py_counters(session_py), "python/fusebox/session.py")
            + [f"counters: '{n}' is a LEVEL in C, cumulative in python/fusebox/session.py"
               for n in sorted(c_levels - py_levels)]
            + [f"counters: '{n}' is a LEVEL in python/fusebox/session.py, cumulative in C"
               for n in sorted(py_levels - c_levels)])


SOURCES = ("include/fusebox/errors.h", "include/fusebox/counters.h", "proto/fusebox.proto",
           "python/fusebox/errors.py", "python/fusebox/session.py")


# ------------------------------------------------------------------ tests

def _py_texts():
    return {where: _read(where) for _, _, where in PY_LIMITS}


def test_python_limits_match_c():
    limits_h = _read("include/fusebox/limits.h")
    problems = limit_drift(limits_h, _py_texts())
    assert not problems, "the Python client and C disagree:\n" + "\n".join(problems)
    c = c_limits(limits_h)
    assert c["FB_CLIENT_MAX_MESSAGE_BYTES"] == 4 << 20 and c["FB_MAX_BLOCK_DEPTH"] == 256
    assert c["FB_CHUNK_BYTES_MAX"] == (4 << 20) - 4096  # names resolve to their values
    # a drift on either side is caught
    p = limit_drift(limits_h.replace("(1u << 20)", "(2u << 20)", 1), _py_texts())
    assert p == ["limits: FB_CHUNK_BYTES_DEFAULT is 2097152 in C, CHUNK_BYTES is 1048576 in "
                 "python/fusebox/session.py"], p
    t = _py_texts()
    t["python/fusebox/client.py"] = t["python/fusebox/client.py"].replace(
        "MAX_MESSAGE_BYTES = 4 << 20", "MAX_MESSAGE_BYTES = 8 << 20")
    p = limit_drift(limits_h, t)
    assert p and "MAX_MESSAGE_BYTES is 8388608" in p[0], p


def test_python_lists_match_c():
    problems = check_all(*(_read(p) for p in SOURCES))
    assert not problems, "the Python client and C disagree:\n" + "\n".join(problems)


def test_readers_see_every_entry():
    # the readers find what the headers hold, not an empty list that agrees with anything
    assert len(c_error_codes(_read(SOURCES[0]))) >= 15
    assert len(c_counters(_read(SOURCES[1]))) >= 18
    assert c_counters(_read(SOURCES[1]))[0] == ("launches", "int")


def test_drift_is_caught_in_each_direction():
    texts = [_read(p) for p in SOURCES]

    def altered(i, old, new):
        assert old in texts[i], f"{SOURCES[i]} no longer holds {old!r}: update this test"
        t = list(texts)
        t[i] = t[i].replace(old, new, 1)
        return check_all(*t)

    # a code C has and Python lacks, and one Python has and C lacks
    p = altered(3, '-15: "FB_ETIMEOUT",', "")
    assert any("FB_ETIMEOUT = -15 is in C, not in" in s for s in p), p
    p = altered(3, '-15: "FB_ETIMEOUT",', '-15: "FB_ETIMEOUT", -16: "FB_ENEW",')
    assert any("FB_ENEW = -16 is in python" in s for s in p), p
    # a renumbered code
    p = altered(3, '-15: "FB_ETIMEOUT"', '-15: "FB_ETIMEDOUT"')
    assert any("-15 is FB_ETIMEOUT in C, FB_ETIMEDOUT in" in s for s in p), p
    # a counter added in C only, and one left in Python after C dropped it
    p = altered(1, "  X(flushes, ", "  X(new_counter, uint64_t, SUM, \"count\", \"new\") \\\n"
                "  X(flushes, ")
    assert sum("'new_counter' is in C, not in" in s for s in p) == 2, p
    p = altered(1, 'X(flushes, uint64_t, SUM, "count", "async: flushes that handed tasks out")', "")
    assert any("'flushes' is in python/fusebox/session.py, not in C" in s for s in p), p
    # a counter whose kind (cumulative or level) differs
    p = altered(1, "X(tasks_pending, uint64_t, LEVEL,", "X(tasks_pending, uint64_t, SUM,")
    assert any("'tasks_pending' is a LEVEL in python" in s for s in p), p
    p = altered(4, '_LEVEL_COUNTERS = ("device_bytes", "tasks_pending")',
                '_LEVEL_COUNTERS = ("device_bytes",)')
    assert any("'tasks_pending' is a LEVEL in C, cumulative" in s for s in p), p
    # an entry the reader cannot parse is an error, not a silently shorter list
    try:
        c_counter_entries(texts[1].replace("X(flushes, uint64_t,", "X(flushes, uint32_t,"))
    except AssertionError as e:
        assert "cannot read" in str(e)
    else:
        raise AssertionError("an unreadable FB_COUNTERS entry went unnoticed")
    # a counter whose kind changed
    p = altered(4, "    flushes: int = 0", "    flushes: float = 0.0")
    assert any("'flushes' is int in C, float in" in s for s in p), p
