"""The rendered compose file serves text: its serve services mount the worker's Hugging Face cache,
get HF_TOKEN and the API key from the environment, and, started as Compose would start serve0 (its
resolved command and environment, the cache volume as HF_HOME, the worker a contract fake reporting
a hub id as SGLang does), answer a chat request; with an empty cache their /health says why not."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from netra.deploy import compose
from netra.deploy.profile import load_profile
from netra.serve.fakeworker import FakeConfig, create_fake_worker, write_tokenizer
from netra.web.server import ServerThread
from tests.deploy.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "dp8-h200-throughput128"
TOPOLOGY = ROOT / "numa" / "dual-socket-8x-h200"


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    profile = load_profile(PROFILE)
    path = tmp_path_factory.mktemp("compose") / "compose.yaml"
    path.write_text(compose.render(profile, TOPOLOGY, verified=False))
    old = os.environ.get("HF_TOKEN")
    os.environ["HF_TOKEN"] = "hf_from_the_environment"
    try:
        out = compose.resolved(path)  # as `docker compose` itself reads it (interpolation included)
    finally:
        if old is None:
            os.environ.pop("HF_TOKEN")
        else:
            os.environ["HF_TOKEN"] = old
    return out


def _mounts(svc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(v["source"], v["target"]) for v in svc.get("volumes", []) if v.get("type") == "volume"}


def test_serve_services_mount_the_workers_cache_and_get_hf_token(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    workers = sorted(n for n in services if n.startswith("worker"))
    assert len(workers) == 8
    for name in workers:
        i = name.removeprefix("worker")
        cache = ("hf-cache", compose.HF_CACHE)
        assert cache in _mounts(services[name]) and cache in _mounts(services[f"serve{i}"]), services[f"serve{i}"]
        assert services[name]["environment"]["HF_TOKEN"] == "hf_from_the_environment"
        assert services[f"serve{i}"]["environment"]["HF_TOKEN"] == "hf_from_the_environment"


def test_front_runs_nginx_master_and_workers_unprivileged(resolved: dict[str, Any]) -> None:
    front = resolved["services"]["front"]
    script = front["command"][-1]
    steps = script.rstrip().split(" && ")
    assert "chown -R www-data:www-data" in script
    # the last step drops to www-data, then execs nginx: no nginx process ever runs as root
    last = shlex.split(steps[-1])
    assert last[:5] == ["exec", "setpriv", "--reuid=www-data", "--regid=www-data", "--init-groups"], last
    assert last[5] == "nginx" and "--ambient-caps=+net_bind_service" not in last  # port 8000: no capability kept
    conf = resolved["configs"]["nginx_conf"]["content"]
    assert not re.search(r"^\s*user\s", conf, re.M), "a user line makes sense only to a root master"
    pid = re.search(r"^pid (\S+);", conf, re.M)
    assert pid is not None and pid.group(1).startswith(steps[0].split()[-1].rsplit("/", 1)[0]), (pid, steps[0])


def test_api_key_comes_from_the_environment_and_is_required(tmp_path: Path) -> None:
    profile = load_profile(PROFILE).replace("serve.api_key_env", "NETRA_API_KEY")
    path = tmp_path / "compose.yaml"
    path.write_text(compose.render(profile, TOPOLOGY, verified=False))
    assert "--api-key-env" in path.read_text() and "secret" not in path.read_text()
    env = {k: v for k, v in os.environ.items() if k != "NETRA_API_KEY"}
    proc = subprocess.run([str(compose.compose_binary()), "-f", str(path), "config", "-q"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "NETRA_API_KEY" in proc.stderr  # `up` without the key refuses
    env["NETRA_API_KEY"] = "secret"
    proc = subprocess.run([str(compose.compose_binary()), "-f", str(path), "config", "--format", "json"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and '"NETRA_API_KEY": "secret"' in proc.stdout


def _hub_cache(root: Path, repo_id: str) -> Path:
    """A Hugging Face hub cache (HF_HOME) holding `repo_id`'s tokenizer files, as a worker leaves it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / "hub" / f"models--{repo_id.replace('/', '--')}"
    write_tokenizer(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return root


@contextmanager
def _serve_as_compose_would(svc: dict[str, Any], upstream: str, hf_home: Path) -> Iterator[str]:
    """serve0's resolved command and environment on a free port, its hf-cache volume as HF_HOME."""
    argv = list(svc["command"])
    assert argv[:2] == ["netra", "serve"], argv
    port = free_port()
    argv[argv.index("--upstream") + 1] = upstream
    argv[argv.index("--port") + 1] = str(port)
    env = {**os.environ, **svc.get("environment", {}), "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "netra", *argv[1:]], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                httpx.get(url + "/metrics", timeout=2)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "netra serve did not start"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def test_serve_service_answers_chat_with_the_mounted_cache(resolved: dict[str, Any], tmp_path: Path) -> None:
    svc = resolved["services"]["serve0"]
    model_path = load_profile(PROFILE).engine.model_path
    assert model_path is not None
    worker = create_fake_worker(FakeConfig(hub_id=model_path))
    name = svc["command"][svc["command"].index("--model-name") + 1]
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    with ServerThread(worker) as upstream:
        with _serve_as_compose_would(svc, upstream, _hub_cache(tmp_path / "volume", model_path)) as url:
            assert httpx.get(url + "/health", timeout=10).status_code == 200
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 5 and r.json()["choices"][0]["message"]["content"]
        # Without the cache mount (an empty volume): unhealthy, saying why, and chat cannot be served.
        with _serve_as_compose_would(svc, upstream, tmp_path / "empty") as url:
            health = httpx.get(url + "/health", timeout=10)
            assert health.status_code == 503 and "tokenizer" in health.json()["error"]["message"]
            assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).status_code == 503
