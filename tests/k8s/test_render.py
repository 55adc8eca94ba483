"""Render tier: every profile x layout against its golden file, schemas of 1.32 and 1.37, invariants,
`netra k8s check`, and the kustomization (with `kubectl kustomize` where a kubectl is installed).

Regenerate the goldens after a deliberate change: ``NETRA_K8S_REGEN=1 python -m pytest tests/k8s -q``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from netra.deploy import images
from netra.deploy.profile import load_profile
from netra.k8s import render as kr
from netra.k8s.pod import pod_commands

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
PROFILES = sorted(p.stem for p in (ROOT / "launcher").glob("*.yaml"))
NODES = 2
CASES = [(p, lay) for p in PROFILES for lay in kr.LAYOUTS]


def _args(profile: str, layout: str, strict: bool = False) -> kr.RenderArgs:
    return kr.RenderArgs(profile=profile, nodes=NODES, layout=layout, strict=strict)


_CACHE: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}


def _built(profile: str, layout: str) -> dict[str, list[dict[str, Any]]]:
    key = (profile, layout)
    if key not in _CACHE:
        _CACHE[key] = kr.build(_args(profile, layout))
    return _CACHE[key]


def _golden_text(profile: str, layout: str) -> str:
    texts = kr.render(_args(profile, layout))
    return "".join(f"# ===== {name} =====\n{text}" for name, text in texts.items())


def _docs(profile: str, layout: str) -> list[dict[str, Any]]:
    return [d for docs in _built(profile, layout).values() for d in docs]


def _kind(profile: str, layout: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in _docs(profile, layout) if d["kind"] == kind]


def _pod_specs(profile: str, layout: str) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in _docs(profile, layout) if d["kind"] in ("StatefulSet", "Deployment")]


@pytest.mark.parametrize(("profile", "layout"), CASES)
def test_golden(profile: str, layout: str) -> None:
    path = GOLDEN / f"{profile}.{layout}.yaml"
    text = _golden_text(profile, layout)
    if os.environ.get("NETRA_K8S_REGEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} missing: NETRA_K8S_REGEN=1 python -m pytest tests/k8s"
    assert path.read_text() == text


def test_goldens_are_exactly_the_cases() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.yaml")) == sorted(f"{p}.{lay}.yaml" for p, lay in CASES)


@pytest.mark.parametrize("version", ["1.32.0", "1.37.0"])
def test_schemas_strict(version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    seen = 0
    for profile, layout in CASES:
        for name, docs in _built(profile, layout).items():
            if name == "kustomization.yaml":
                continue
            for d in docs:
                kv.validate(d, version, strict=True)
                seen += 1
    assert seen == len(CASES) * 13


def test_schema_rejects_a_misspelt_field() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    sts = dict(_kind("local-compose", "per-gpu", "StatefulSet")[0])
    sts["spec"] = {**sts["spec"], "replica": 2}
    with pytest.raises(kv.ValidationError):
        kv.validate(sts, "1.37.0", strict=True)


def _qty(q: str | int) -> Fraction:
    s = str(q)
    return Fraction(int(s[:-1]), 1000) if s.endswith("m") else Fraction(s)


@pytest.mark.parametrize(("profile", "layout"), CASES)
def test_guaranteed_qos_and_gpus(profile: str, layout: str) -> None:
    prof = load_profile(profile)
    for spec in _pod_specs(profile, layout):
        for c in spec["containers"]:
            r = c["resources"]
            assert r["requests"] == r["limits"], c["name"]
            assert set(r["limits"]) >= {"cpu", "memory"}
    sts = _kind(profile, layout, "StatefulSet")[0]
    containers = {c["name"]: c for c in sts["spec"]["template"]["spec"]["containers"]}
    gpu = kr.GPU_RESOURCE.get(prof.target)
    if layout == "per-gpu":
        assert sts["spec"]["replicas"] == NODES * prof.dp
        engine, serve = containers["engine"]["resources"]["limits"], containers["serve"]["resources"]["limits"]
        # Integer CPUs for the engine (exclusive cores under the static CPU manager), a share for serve.
        assert _qty(engine["cpu"]).denominator == 1
        assert _qty(serve["cpu"]) == Fraction(1, 2)
        assert engine.get(gpu) == 1 if gpu else not any("gpu" in k for k in engine)
        assert not any("gpu" in k for k in serve)
    else:
        assert sts["spec"]["replicas"] == NODES
        node = containers["node"]["resources"]["limits"]
        assert node.get(gpu) == prof.dp if gpu else not any("gpu" in k for k in node)


def test_engine_cpus_are_the_plan_share() -> None:
    sts = _kind("dp8-h200-throughput128", "per-gpu", "StatefulSet")[0]
    engine = sts["spec"]["template"]["spec"]["containers"][0]
    # numa/dual-socket-8x-h200: 4 GPUs per socket share its cores with SMT siblings -> 28 CPUs each.
    assert engine["resources"]["limits"]["cpu"] == "28"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1


@pytest.mark.parametrize(("profile", "layout"), CASES)
def test_images_equal_the_lock(profile: str, layout: str) -> None:
    prof = load_profile(profile)
    entries = images.load_lock()
    name = prof.image or next(n for n, e in entries.items() if e.target == prof.target and e.engine == prof.engine.kind)
    entry = entries[name]
    want = entry.tag if entry.built_id or not entry.resolved else f"{entry.tag}@{entry.digest}"
    lock = _kind(profile, layout, "ConfigMap")[0]
    assert lock["metadata"]["name"] == "netra-lock"
    assert lock["data"]["images"].split(" ") == [want]
    for spec in _pod_specs(profile, layout):
        assert {c["image"] for c in spec["containers"]} == {want}


@pytest.mark.parametrize(("profile", "layout"), CASES)
def test_selectors_ports_and_hashes(profile: str, layout: str) -> None:
    prof = load_profile(profile)
    plan = kr.reference_plan(prof)
    sha = plan.sha256()
    docs = _docs(profile, layout)
    for d in docs:
        if d["kind"] not in ("Kustomization", "ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy",
                             "ValidatingAdmissionPolicyBinding"):
            assert d["metadata"]["annotations"][kr.A_PLAN_SHA] == sha, d["kind"]
            assert d["metadata"]["annotations"][kr.A_PROFILE_SHA] == plan.profile_sha256
    sts = _kind(profile, layout, "StatefulSet")[0]
    assert sts["metadata"]["name"] == f"netra-{sha[:12]}"
    plan_cm = _kind(profile, layout, "ConfigMap")[1]
    assert plan_cm["data"]["plan.json"] == plan.canonical_json()
    for d in docs:
        if d["kind"] in ("StatefulSet", "Deployment"):
            tpl = d["spec"]["template"]["metadata"]
            assert d["spec"]["selector"]["matchLabels"] == tpl["labels"]
            assert tpl["annotations"][kr.A_PLAN_SHA] == sha
    workers = sts["spec"]["template"]["metadata"]["labels"]
    services = _kind(profile, layout, "Service")
    assert services[0]["spec"]["selector"] == workers
    assert services[0]["spec"]["clusterIP"] == "None"
    assert _kind(profile, layout, "PodDisruptionBudget")[0]["spec"]["selector"]["matchLabels"] == workers
    router = _kind(profile, layout, "Deployment")[0]
    assert services[1]["spec"]["selector"] == router["spec"]["template"]["metadata"]["labels"]
    # Every port is TCP (a 1.20 server-side-apply bug otherwise).
    for d in docs:
        for c in (d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])):
            assert all(p["protocol"] == "TCP" for p in c.get("ports", []))
    assert all(p["protocol"] == "TCP" for s in services for p in s["spec"]["ports"])
    # The router discovers the pods on the port their response layer (per-gpu) or front (per-node) listens on.
    argv = router["spec"]["template"]["spec"]["containers"][0]["command"]
    port = int(argv[argv.index("--service-discovery-port") + 1])
    sel = argv[argv.index("--selector") + 1:argv.index("--service-discovery-port")]
    assert dict(s.split("=", 1) for s in sel) == workers
    assert argv[argv.index("--policy") + 1] == kr.SMG_POLICY[prof.front.balance]
    assert argv[argv.index("--service-discovery-namespace") + 1] == f"netra-{prof.name}"
    pod = sts["spec"]["template"]
    if layout == "per-gpu":
        serve = pod["spec"]["containers"][1]
        assert port == serve["ports"][0]["containerPort"] == plan.workers[0].serve_port
        assert serve["readinessProbe"]["httpGet"] == {"path": "/health", "port": port}
        assert kr.SMG_PORTS not in pod["metadata"]["annotations"]
    else:
        assert port == plan.front.port
        assert pod["metadata"]["annotations"][kr.SMG_PORTS] == str(plan.front.port)
    assert services[0]["spec"]["ports"][0]["port"] == port
    role = _kind(profile, layout, "Role")[0]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = _kind(profile, layout, "RoleBinding")[0]
    assert binding["subjects"][0]["name"] == router["spec"]["template"]["spec"]["serviceAccountName"]
    vapb = _kind(profile, layout, "ValidatingAdmissionPolicyBinding")[0]
    assert vapb["spec"]["paramRef"]["name"] == "netra-lock"
    assert vapb["spec"]["policyName"] == _kind(profile, layout, "ValidatingAdmissionPolicy")[0]["metadata"]["name"]


def test_ordinal_runs_its_worker_on_the_pod_ports() -> None:
    prof = load_profile("dp8-h200-throughput128")
    plan = kr.reference_plan(prof)
    d = plan.to_dict()
    c = pod_commands(d, 11, gpu_target=True)  # second node, worker 3
    assert c["worker"] == 3
    argv = c["engine_argv"]
    assert argv[argv.index("--port") + 1] == "30000"
    assert c["engine_env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert c["engine_env"]["SGLANG_PLUGINS"] == d["workers"][3]["engine_env"]["SGLANG_PLUGINS"]
    serve = c["serve_argv"]
    assert serve[serve.index("--host") + 1] == "0.0.0.0"
    assert serve[serve.index("--port") + 1] == "31000"
    assert serve[serve.index("--upstream") + 1] == "http://127.0.0.1:30000"
    assert serve[serve.index("--worker-id") + 1] == "11"


def test_strict_render_refuses_unresolved_digests(tmp_path: Path) -> None:
    with pytest.raises(kr.K8sError, match="unresolved"):
        kr.build(kr.RenderArgs(profile="dp8-h200-throughput128", nodes=1, strict=True))
    from netra.cli import main

    assert main(["k8s", "render", "--profile", "dp8-h200-throughput128", "-o", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
    # An image built here (recorded ID) is resolved: a strict render passes.
    assert main(["k8s", "render", "--profile", "local-compose", "-o", str(tmp_path / "lc")]) == 0


def test_check_names_an_edited_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from netra.cli import main

    out = tmp_path / "r"
    assert main(["k8s", "render", "--profile", "dp2-h200", "--nodes", "3", "--unverified", "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(kr.FILES)
    assert kr.check(out) == []
    assert main(["k8s", "check", str(out)]) == 0
    text = (out / "workers.yaml").read_text()
    assert "cpu: '56'" in text
    (out / "workers.yaml").write_text(text.replace("cpu: '56'", "cpu: '55'", 1))
    (out / "pdb.yaml").unlink()
    problems = kr.check(out)
    sts = kr.build(kr.RenderArgs("dp2-h200", 3, strict=False))["workers.yaml"][1]["metadata"]["name"]
    assert problems == [
        f"workers.yaml: StatefulSet/{sts} spec.template.spec.containers[0].resources.requests.cpu: \"55\" "
        "(rendered: \"56\")",
        "pdb.yaml: missing"]
    capsys.readouterr()
    assert main(["k8s", "check", str(out)]) == 1
    err = capsys.readouterr().err
    assert "resources.requests.cpu" in err and "pdb.yaml: missing" in err


def test_kustomization_lists_every_file(tmp_path: Path) -> None:
    out = tmp_path / "r"
    kr.write(_args("local-compose", "per-gpu"), out)
    kust = yaml.safe_load((out / "kustomization.yaml").read_text().split("\n", 1)[1])
    assert sorted(kust["resources"]) == sorted(f for f in kr.FILES if f != "kustomization.yaml")
    assert all((out / f).is_file() for f in kust["resources"])
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl binary here: the kustomization is checked by its resource list only")
    proc = subprocess.run([kubectl, "kustomize", str(out)], capture_output=True, text=True, timeout=60, check=True)
    built = [d for d in yaml.safe_load_all(proc.stdout) if d]
    rendered = [d for n, docs in kr.build(_args("local-compose", "per-gpu")).items() if n != "kustomization.yaml"
                for d in docs]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in built) == \
        sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
