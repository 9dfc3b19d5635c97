"""Client-certificate identity (issue 38, attack 4): the tenant of an mTLS
client is its verified certificate's subject, parsed by OpenSSL and compared
attribute by attribute with the tenants file's "subjects" (server/subject.c,
docs/security.md "Tenants and TLS").

Every certificate below is signed by the one CA fuseboxd trusts
(--tls-client-ca), as a CA that signs what it is asked would sign them: a CN
that spells a whole subject ("team-a,O=Example"), a CN with "+O=Example", a
CN with a backslash before its comma, a multi-valued RDN, two CNs, the right
attributes in the other order or with one more, a NUL inside the CN (made
with the openssl command line: a placeholder CN, its bytes replaced in the
DER, the certificate signed again). A UTF8String that is not UTF-8 cannot be
made that way: OpenSSL refuses to decode such a name at all (so does the
TLS handshake); the tenants file's side of it is tested below. None of them
may read team-a's field; team-a's own certificate does, the server stays
SERVING and a bystander tenant's session is untouched. Loopback only."""
import json
import os
import shutil
import signal
import subprocess
import tempfile

import grpc
import pytest

from conftest import Client, dense_layout, expect_error
from test_tls_tenants import PATTERN, daemons, serving  # noqa: F401 (daemons: a fixture)

UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
OTHER = bytes((i * 7 + 3) % 256 for i in range(4 * 64))

# name -> (openssl -subj, or the placeholder's bytes and what replaces them)
ATTACKERS = {
    # one CN whose value spells team-a's whole subject
    "comma": "/CN=team-a,O=Example",
    # one CN holding "+O=Example" ('+' escaped for openssl: not a second attribute)
    "plus": "/CN=team-a\\+O=Example",
    # one CN holding a backslash and a comma: team-a\,O=Example
    "backslash": "/CN=team-a\\\\,O=Example",
    # one RDN of two attributes (CN=team-a + O=Example): team-a's two RDNs grouped as one
    "multi": "/CN=team-a+O=Example",
    # team-a's two RDNs in the other order (RFC 4514: O=Example,CN=team-a)
    "reversed": "/CN=team-a/O=Example",
    # team-a's subject and one more attribute
    "extra": "/C=US/O=Example/CN=team-a",
    # two CNs: the same one twice, and team-a after another
    "twice": "/CN=team-a/CN=team-a",
    "second": "/CN=mallory/CN=team-a",
    # no case folding
    "case": "/CN=Team-A",
    # a NUL inside the CN, after a value that is a subject of team-a's
    "nul": ("/CN=team-aQmallory", b"team-aQmallory", b"team-a\x00mallory"),
}

# how the refusal shows some of them
SHOWN = {"backslash": "CN=team-a\\\\\\,O\\=Example", "plus": "CN=team-a\\+O\\=Example",
         "reversed": "O=Example,CN=team-a", "twice": "CN=team-a,CN=team-a",
         "extra": "CN=team-a,O=Example,C=US"}

TENANTS = [
    # team-a: the victim. Its certificate is /O=Example/CN=team-a; "CN=team-a"
    # is a subject of exactly one attribute
    {"name": "team-a", "subjects": ["CN=team-a,O=Example", "CN=team-a"]},
    # a tenant whose one CN holds a comma: the "comma" certificate is this one, not team-a
    {"name": "literal", "subjects": ["CN=team-a\\,O\\=Example"]},
    {"name": "bystander", "subjects": ["CN=bystander"]},
]


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key_and_csr(d, name, subj):
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", name + ".key", "-out", name + ".csr", "-subj", subj, cwd=d)


def _sign(d, name, ext, inp):
    args = []
    if ext:
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        args = ["-extfile", name + ".ext"]
    _openssl("x509", *inp, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
             *args, "-out", name + ".pem", cwd=d)


def _issue(d, name, subj, ext="extendedKeyUsage=clientAuth\n"):
    _key_and_csr(d, name, subj)
    _sign(d, name, ext, ["-req", "-in", name + ".csr"])


def _issue_patched(d, name, subj, old, new):
    """A CA-signed certificate whose subject bytes the CLI cannot write: a
    certificate with the placeholder, old replaced by new in its DER (same
    length), made valid again by self-signing it (no extensions yet: an
    authority key id would say it is not self-signed), then signed by the CA."""
    _issue(d, name + ".0", subj, ext=None)
    _openssl("x509", "-in", name + ".0.pem", "-outform", "DER", "-out", name + ".0.der", cwd=d)
    with open(os.path.join(d, name + ".0.der"), "rb") as f:
        der = f.read()
    assert len(old) == len(new) and der.count(old) == 1, name
    with open(os.path.join(d, name + ".1.der"), "wb") as f:
        f.write(der.replace(old, new))
    _openssl("x509", "-inform", "DER", "-in", name + ".1.der", "-signkey", name + ".0.key",
             "-days", "2", "-out", name + ".1.pem", cwd=d)
    _sign(d, name, "extendedKeyUsage=clientAuth\n", ["-in", name + ".1.pem"])
    shutil.copy(os.path.join(d, name + ".0.key"), os.path.join(d, name + ".key"))


@pytest.fixture(scope="module")
def certs():
    assert shutil.which("openssl"), "the openssl command line is needed (scripts/deps.sh)"
    tmp = tempfile.TemporaryDirectory(prefix="fbsubj-")
    d = tmp.name
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Fusebox test ca",
             cwd=d)
    _issue(d, "server", "/CN=localhost",
           "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _issue(d, "team-a", "/O=Example/CN=team-a")
    _issue(d, "team-a-cn", "/CN=team-a")
    _issue(d, "bystander", "/CN=bystander")
    for name, how in ATTACKERS.items():
        if isinstance(how, str):
            _issue(d, name, how)
        else:
            _issue_patched(d, name, *how)
    yield d
    tmp.cleanup()


def _subject(d, name):
    return subprocess.run(["openssl", "x509", "-in", os.path.join(d, name + ".pem"), "-noout",
                           "-subject", "-nameopt", "RFC2253"], check=True, capture_output=True,
                          timeout=60).stdout.decode()


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _client(d, certs, who):
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(os.path.join(certs, "ca.pem")),
        private_key=_read(os.path.join(certs, who + ".key")),
        certificate_chain=_read(os.path.join(certs, who + ".pem")))
    opts = [("grpc.ssl_target_name_override", "localhost")]
    return Client(d.address, grpc.secure_channel(d.address, creds, opts))


def _mtls(daemons, certs, tenants=TENANTS):
    return daemons("127.0.0.1:0", ["--tls-cert", os.path.join(certs, "server.pem"),
                                   "--tls-key", os.path.join(certs, "server.key"),
                                   "--tls-client-ca", os.path.join(certs, "ca.pem")],
                   tenants=tenants)


def test_certificates_made_as_meant(certs):
    """The certificates hold what the attacks need (else the test below
    proves nothing)."""
    assert _subject(certs, "team-a").strip() == "subject=CN=team-a,O=Example"
    assert _subject(certs, "comma").strip() == "subject=CN=team-a\\,O=Example"
    assert _subject(certs, "plus").strip() == "subject=CN=team-a\\+O=Example"
    assert _subject(certs, "backslash").strip() == "subject=CN=team-a\\\\\\,O=Example"
    assert _subject(certs, "multi").strip() in ("subject=CN=team-a+O=Example",
                                                "subject=O=Example+CN=team-a")
    assert _subject(certs, "twice").strip() == "subject=CN=team-a,CN=team-a"
    assert _subject(certs, "nul").strip() == "subject=CN=team-a\\00mallory"
    for name in ATTACKERS:
        r = subprocess.run(["openssl", "verify", "-CAfile", os.path.join(certs, "ca.pem"),
                            os.path.join(certs, name + ".pem")], capture_output=True, timeout=60)
        assert r.returncode == 0, (name, r.stdout, r.stderr)


def test_subject_confusion_does_not_reach_another_tenant(certs, daemons):
    d = _mtls(daemons, certs)
    team_a, bystander = _client(d, certs, "team-a"), _client(d, certs, "bystander")
    sid = team_a.new_session(dense_layout(64))
    assert team_a.write_field(sid, 2, PATTERN) == len(PATTERN)
    other = bystander.new_session(dense_layout(64))
    assert bystander.write_field(other, 2, OTHER) == len(OTHER)

    for name in ATTACKERS:
        c = _client(d, certs, name)
        if name == "comma":
            # its one CN is the escaped value "literal" names: that tenant, not team-a
            expect_error(lambda: c.read_field(sid, 2), DENIED, "another tenant")
            assert c.new_session(dense_layout(8))
        elif name == "nul":
            expect_error(lambda: c.read_field(sid, 2), UNAUTH, "client certificate refused",
                         "NUL byte")
            expect_error(lambda: c.new_session(dense_layout(8)), UNAUTH)
        else:
            why = expect_error(lambda: c.read_field(sid, 2), UNAUTH, "is no tenant's subject")
            if name in SHOWN:  # the subject as "subjects" would spell it
                assert f"client certificate subject '{SHOWN[name]}' is no tenant's" in why, why
            expect_error(lambda: c.write_field(sid, 2, bytes(len(PATTERN))), UNAUTH)
            expect_error(lambda: c.new_session(dense_layout(8)), UNAUTH)
        assert serving(c)  # the health check needs no identity
        c.close()

    # team-a's certificates work: both of its subjects
    assert team_a.read_field(sid, 2) == PATTERN
    cn_only = _client(d, certs, "team-a-cn")
    assert cn_only.read_field(sid, 2) == PATTERN
    cn_only.close()
    # the bystander is unharmed, the server serving
    assert bystander.read_field(other, 2) == OTHER
    expect_error(lambda: bystander.read_field(sid, 2), DENIED)
    assert serving(team_a)
    assert d.proc.poll() is None
    team_a.close()
    bystander.close()


BAD_SUBJECTS = [
    ("CN=team-a,O=Example,", "ends with ','"),
    ("CN=a, O=b", "expected TYPE=VALUE at character 6"),
    ("CN=a=b", "unescaped '=' at character 5 in the value of CN"),
    ("CN=a\\00b", "holds a NUL byte"),
    ("CN=a\\q", "bad escape at character 5"),
    ("CN=\\ff", "not UTF-8"),
    ("CN=", "the value of CN is empty"),
    ("CN=a ", "ends with a space"),
    ("cn=a", "unknown attribute type 'cn'"),
    ("CN=a+", "ends with '+'"),
    ("team-a", "expected TYPE=VALUE at character 1"),
]


def test_malformed_subjects_stop_start(daemons):
    for subj, words in BAD_SUBJECTS:
        d = daemons("unix", tenants=[{"name": "ok", "subjects": ["CN=fine"]},
                                     {"name": "x", "subjects": ["O=y", subj]}],
                    expect_start=False)
        assert d.proc.wait(timeout=60) == 1
        want = f"tenant 'x'.subjects[1] '{subj}': "
        assert want in d.logtext() and words in d.logtext(), (subj, d.logtext())
    # one subject written two ways is still one subject: the same attributes
    # of an RDN in another order, an escape for a plain byte, an OID for a name
    for a, b in [("CN=x+O=y", "O=y+CN=x"), ("CN=a,O=b", "2.5.4.3=\\61,O=b"),
                 ("CN=a\\,b", "commonName=a\\2cb")]:
        d = daemons("unix", tenants=[{"name": "p", "subjects": [a]},
                                     {"name": "q", "subjects": [b]}], expect_start=False)
        assert d.proc.wait(timeout=60) == 1
        assert f"tenants 'p' and 'q' share the subject '{a}' (written '{b}'" in d.logtext(), \
            d.logtext()


def test_malformed_subject_on_sighup_keeps_the_running_tenants(certs, daemons):
    d = _mtls(daemons, certs)
    team_a = _client(d, certs, "team-a")
    sid = team_a.new_session(dense_layout(64))
    assert team_a.write_field(sid, 2, PATTERN) == len(PATTERN)
    with open(d.tenants_path, "w") as f:
        json.dump({"tenants": TENANTS + [{"name": "z", "subjects": ["CN=z,O=a+"]}]}, f)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"tenants file not reloaded, keeping the running tenants: .*tenant 'z'"
               r"\.subjects\[0\] 'CN=z,O=a\+': ends with '\+'", "refused reload")
    assert team_a.read_field(sid, 2) == PATTERN
    # a good file: team-a is now only /CN=team-a; its other certificate stops working
    with open(d.tenants_path, "w") as f:
        json.dump({"tenants": [{"name": "team-a", "subjects": ["CN=team-a"]}]}, f)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"SIGHUP: reloaded 1 tenants", "tenants reload")
    fresh = _client(d, certs, "team-a")  # (the open connection's calls are checked afresh too)
    expect_error(lambda: fresh.read_field(sid, 2), UNAUTH,
                 "client certificate subject 'CN=team-a,O=Example' is no tenant's")
    cn_only = _client(d, certs, "team-a-cn")
    assert cn_only.read_field(sid, 2) == PATTERN
    assert serving(cn_only)
    for c in (team_a, fresh, cn_only):
        c.close()
