"""deploy/ as far as it can be checked without a cluster: every manifest
and the Helm chart's templates (rendered here for its default values and
with every switch on) are YAML that parses into the kinds expected, with a
GPU request, the TLS and tenants Secrets, a drain on preStop and a
termination grace longer than the drain's; and every fuseboxd flag that
deploy/ uses (manifests, chart, the config file's keys, the unit's ExecStart) is one that `fuseboxd --help` lists."""
import glob
import os
import re
import subprocess

import pytest

from conftest import FUSEBOXD, ROOT

yaml = pytest.importorskip("yaml") if os.environ.get("CI") != "true" else __import__("yaml")
DEPLOY = os.path.join(ROOT, "deploy")
CHART = os.path.join(DEPLOY, "helm", "fusebox")


def lookup(ctx, path):
    v = ctx
    for part in path.split("."):
        assert isinstance(v, dict) and part in v, f"no value {path}"
        v = v[part]
    return v


def render(text, values, release="test"):
    """The subset of Helm's templates the chart uses: {{ .Values.a.b }},
    {{ .Release.Name }}, {{- if .Values.x }} ... {{- end }} (not nested)."""
    ctx = {"Values": values, "Release": {"Name": release}}

    def cond(m):
        return m.group(2) if lookup(ctx, m.group(1)) else ""
    text = re.sub(r"\{\{-? if \.(\S+) \}\}\n?(.*?)\{\{-? end \}\}\n?", cond, text, flags=re.S)
    text = re.sub(r"\{\{ \.(\S+) \}\}", lambda m: str(lookup(ctx, m.group(1))), text)
    assert "{{" not in text, text
    return text


def chart_docs(values):
    docs = []
    for t in sorted(glob.glob(os.path.join(CHART, "templates", "*.yaml"))):
        with open(t) as f:
            docs += [d for d in yaml.safe_load_all(render(f.read(), values)) if d]
    return docs


def default_values():
    with open(os.path.join(CHART, "values.yaml")) as f:
        return yaml.safe_load(f)


def flags_of(args):
    return {a for a in args if isinstance(a, str) and a.startswith("--")}


def check_pod(spec, drain_flag_index=True):
    c = spec["template"]["spec"]["containers"][0]
    args = [str(a) for a in c["args"]]
    grace = float(args[args.index("--drain-grace-s") + 1])
    shut = float(args[args.index("--shutdown-grace-s") + 1])
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] > grace + shut
    assert "kill -TERM 1" in " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    vols = spec["template"]["spec"]["volumes"]
    secrets = {v["secret"]["secretName"] for v in vols if "secret" in v}
    # TLS and tenants, and the checkpoint key when checkpoints are on
    assert len(secrets) == (3 if "--checkpoint-key" in args else 2)
    assert args[args.index("--replica-name") + 1] == "$(POD_NAME)"
    return flags_of(args)


def test_manifests_parse_and_drain():
    kinds = {}
    for p in glob.glob(os.path.join(DEPLOY, "k8s", "*.yaml")):
        with open(p) as f:
            for d in yaml.safe_load_all(f):
                kinds.setdefault(d["kind"], []).append(d)
    (sts,) = kinds["StatefulSet"]
    check_pod(sts["spec"])
    assert any(s["spec"].get("clusterIP") == "None" for s in kinds["Service"])
    assert kinds["PodDisruptionBudget"]


def test_chart_renders():
    v = default_values()
    docs = chart_docs(v)
    kinds = {d["kind"] for d in docs}
    assert kinds == {"StatefulSet", "Service", "PodDisruptionBudget"}, kinds
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == v["replicas"]
    assert sts["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    check_pod(sts["spec"])
    v["metrics"] = {"annotations": False, "serviceMonitor": True}
    docs = chart_docs(v)
    assert "ServiceMonitor" in {d["kind"] for d in docs}
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert "annotations" not in sts["spec"]["template"]["metadata"]
    # a drain grace the termination grace does not outlast is caught
    v["drainGraceS"] = v["terminationGracePeriodSeconds"]
    sts = next(d for d in chart_docs(v) if d["kind"] == "StatefulSet")
    with pytest.raises(AssertionError):
        check_pod(sts["spec"])


def test_every_flag_exists():
    help_text = subprocess.run([FUSEBOXD, "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    known = set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text, flags=re.M))
    assert "--drain-grace-s" in known and "--replica-name" in known
    used = set()
    for p in glob.glob(os.path.join(DEPLOY, "k8s", "*.yaml")):
        with open(p) as f:
            for d in yaml.safe_load_all(f):
                for c in (d.get("spec", {}).get("template", {}).get("spec", {})
                          .get("containers", [])):
                    used |= flags_of(c.get("args", []))
    sts = next(d for d in chart_docs(default_values()) if d["kind"] == "StatefulSet")
    used |= flags_of(sts["spec"]["template"]["spec"]["containers"][0]["args"])
    import json
    with open(os.path.join(DEPLOY, "fuseboxd.json")) as f:  # keys are flags with '_'
        used |= {"--" + k.replace("_", "-") for k in json.load(f)}
    with open(os.path.join(DEPLOY, "fuseboxd.service")) as f:
        for line in f:
            if line.startswith("ExecStart=") and "fuseboxd" in line:
                used |= set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", line))
    unknown = sorted(f for f in used if f not in known)
    assert not unknown, f"flags deploy/ uses that fuseboxd --help does not list: {unknown}"


def mount_of(container, path, volumes):
    """The volume (its spec) that container mounts over path."""
    for m in container["volumeMounts"]:
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
            return next(v for v in volumes if v["name"] == m["name"]), m
    raise AssertionError(f"nothing is mounted over {path}")


def test_chart_checkpoints():
    """Every pod mounts the one checkpoint-key Secret (copied by an init
    container to a file fuseboxd's user owns, mode 0600, outside the
    checkpoint directory) and the one shared volume as --checkpoint-dir, so
    that a session a drained pod ended is restored on another."""
    v = default_values()
    assert v["checkpoint"]["enabled"]
    sts = next(d for d in chart_docs(v) if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    args = [str(a) for a in c["args"]]
    key, ckdir = args[args.index("--checkpoint-key") + 1], args[args.index("--checkpoint-dir") + 1]
    assert not key.startswith(ckdir.rstrip("/") + "/")
    assert float(args[args.index("--checkpoint-every-s") + 1]) == v["checkpoint"]["everyS"]
    vol, _ = mount_of(c, ckdir, pod["volumes"])
    assert vol["persistentVolumeClaim"]["claimName"] == v["checkpoint"]["claim"]
    kvol, km = mount_of(c, key, pod["volumes"])
    assert "emptyDir" in kvol and km.get("readOnly")
    (init,) = pod["initContainers"]
    cmd = " ".join(init["command"])
    svol, sm = next((vv, m) for m in init["volumeMounts"]
                    for vv in pod["volumes"] if vv["name"] == m["name"] and "secret" in vv)
    assert svol["secret"]["secretName"] == v["checkpoint"]["keySecret"]
    assert f"cp {sm['mountPath']}/key {key}" in cmd and f"chmod 600 {key}" in cmd
    assert mount_of(init, key, pod["volumes"])[0] is kvol
    assert pod["securityContext"]["fsGroup"] == 65534  # nobody's group reads the Secret
    check_pod(sts["spec"])
    # off: no flags, no init container, no shared volume
    v["checkpoint"]["enabled"] = False
    sts = next(d for d in chart_docs(v) if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert not flags_of(pod["containers"][0]["args"]) & {"--checkpoint-key", "--checkpoint-dir"}
    assert "initContainers" not in pod
    assert not any("persistentVolumeClaim" in vv for vv in pod["volumes"])
    check_pod(sts["spec"])
