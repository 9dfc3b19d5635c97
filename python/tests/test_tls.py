"""TLS, mTLS and tokens from Python against a fuseboxd started by the test
with certificates made by `openssl` (as tests/security/test_tls_tenants.py
makes them) and a tenants file holding the tokens' SHA-256."""
import hashlib
import json
import os
import secrets
import shutil
import subprocess

import grpc
import numpy as np
import pytest

import fusebox

SRC = "layout { dense(i: 4) { place x: i32 } }\nkernel inc() { for i in x { x[i] += 1 } }\n"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(d, name, subject, ext):
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", name + ".key", "-out", name + ".csr", "-subj", subject, cwd=d)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write(ext)
    _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", name + ".pem", "-extfile", name + ".ext",
             cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("the openssl command line is not installed")
    d = str(tmp_path_factory.mktemp("fbpytls"))
    for ca in ("ca", "rogue"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2",
                 "-subj", "/CN=Fusebox python test " + ca, cwd=d)
    _issue(d, "server", "/CN=localhost",
           "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _issue(d, "alice", "/CN=alice", "extendedKeyUsage=clientAuth\n")
    return {k: os.path.join(d, k) for k in ("ca", "rogue", "server", "alice")}


def _tenants(tmp_path, spec):
    p = tmp_path / "tenants.json"
    p.write_text(json.dumps({"tenants": spec}))
    return str(p)


def _sha(tok):
    return hashlib.sha256(tok.encode()).hexdigest()


def _work(c):
    with c.session(SRC) as s:
        s.kernels.inc()
        s.kernels.inc()
        return s.fields.x.to_numpy()


def test_tls_and_token(make_server, certs, tmp_path):
    tok = secrets.token_urlsafe(24)
    d = make_server("--tls-cert", certs["server"] + ".pem", "--tls-key", certs["server"] + ".key",
                    "--tenants", _tenants(tmp_path, [{"name": "py", "token_sha256": [_sha(tok)]}]),
                    listen="127.0.0.1:0")
    assert d.address.startswith("127.0.0.1:")
    with fusebox.connect(d.address, token=tok, tls=certs["ca"] + ".pem") as c:
        assert np.array_equal(_work(c), [2, 2, 2, 2])
    with open(certs["ca"] + ".pem", "rb") as f:
        ca = f.read()
    with fusebox.connect(d.address, token=tok, tls={"ca": ca}) as c:  # PEM bytes
        assert c.info().version
    # a wrong token, and none: UNAUTHENTICATED, named in the exception
    for bad in (secrets.token_urlsafe(24), None):
        with pytest.raises(fusebox.ServerError) as e:
            fusebox.connect(d.address, token=bad, tls=ca)
        assert e.value.status == grpc.StatusCode.UNAUTHENTICATED
        assert "UNAUTHENTICATED" in str(e.value)
    # plaintext to a TLS server, and TLS that does not trust the server
    with pytest.raises(fusebox.ConnectionLostError):
        fusebox.connect(d.address, token=tok, timeout=10)
    with pytest.raises(fusebox.ConnectionLostError):
        fusebox.connect(d.address, token=tok, tls=certs["rogue"] + ".pem", timeout=10)


def test_mtls_client_certificate(make_server, certs, tmp_path):
    d = make_server("--tls-cert", certs["server"] + ".pem", "--tls-key", certs["server"] + ".key",
                    "--tls-client-ca", certs["ca"] + ".pem",
                    "--tenants", _tenants(tmp_path, [{"name": "alice",
                                                      "subjects": ["CN=alice"]}]),
                    listen="127.0.0.1:0")
    tls = {"ca": certs["ca"] + ".pem", "cert": certs["alice"] + ".pem",
           "key": certs["alice"] + ".key"}
    with fusebox.connect(d.address, tls=tls) as c:
        assert np.array_equal(_work(c), [2, 2, 2, 2])
    # without a client certificate the handshake itself fails
    with pytest.raises(fusebox.ConnectionLostError):
        fusebox.connect(d.address, tls=certs["ca"] + ".pem", timeout=10)
    with pytest.raises(TypeError, match="both cert and key"):
        fusebox.connect(d.address, tls={"ca": certs["ca"] + ".pem", "cert": tls["cert"]})
    with pytest.raises(TypeError, match="unknown key 'crt'"):
        fusebox.connect(d.address, tls={"crt": tls["cert"]})
