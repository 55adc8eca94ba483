from __future__ import annotations

import re
from pathlib import Path

import pytest

from netra.deploy import nginx
from netra.deploy.plan import Overrides, make_plan
from netra.deploy.profile import list_profiles, load_profile
from netra.settings import REPO_ROOT
from tests.deploy.conftest import needs_nginx

NUMA = REPO_ROOT / "numa"
TOPOLOGY = {"cpu": None, "sm90": NUMA / "dual-socket-8x-h200", "gfx950": NUMA / "dual-socket-8x-mi350x"}


def plan_for(name: str, run_dir: Path, **kw):
    prof = load_profile(name)
    for key, value in kw.items():
        prof = prof.replace(key, value)
    run_dir.mkdir(parents=True, exist_ok=True)
    return make_plan(prof, TOPOLOGY[prof.target], Overrides(run_dir=run_dir))


@needs_nginx
@pytest.mark.parametrize("name", list_profiles())
def test_every_profile_renders_a_valid_config(name: str, tmp_path: Path) -> None:
    plan = plan_for(name, tmp_path)
    nginx.write(plan)
    assert "test is successful" in nginx.validate(plan)
    text = Path(plan.front.conf_path).read_text()
    f = plan.front
    assert f"worker_processes {f.worker_processes};" in text
    assert f"worker_connections {f.worker_connections};" in text
    assert f"worker_rlimit_nofile {f.worker_rlimit_nofile};" in text
    assert re.search(rf"^\s+keepalive {f.keepalive};", text, re.M)
    for needed in ("proxy_buffering off;", "proxy_http_version 1.1;", 'proxy_set_header Connection "";',
                   f"proxy_read_timeout {f.read_timeout_s}s;", "proxy_next_upstream error timeout http_502 http_503 non_idempotent;"):
        assert needed in text
    servers = re.findall(r"^\s+server (127\.0\.0\.1:\d+) max_fails=(\d+) fail_timeout=(\d+)s;", text, re.M)
    assert [s[0] for s in servers] == list(f.upstreams)
    assert all(s[1:] == (str(f.max_fails), str(f.fail_timeout_s)) for s in servers)
    assert "least_conn;" not in text  # round robin by default
    assert str(tmp_path) in f.pid_path and f"pid {f.pid_path};" in text


def test_dp8_front_is_the_articles() -> None:
    plan = plan_for("dp8-throughput128", Path("/tmp/netra-unused"))
    text = nginx.render(plan)
    # 8,192 requests in flight: 8 processes, each with its share of 2 connections per request and of
    # a burst of 4 x 8,192 refused clients (a quarter more for unevenness), plus its keepalive pool.
    for needed in ("worker_processes 8;", "worker_connections 8768;", "worker_rlimit_nofile 17536;",
                   "limit_conn netra_front 8192;"):
        assert needed in text
    assert re.search(r"^\s+keepalive 1024;", text, re.M)
    assert len(re.findall(r"^\s+server 127\.0\.0\.1:\d+ ", text, re.M)) == 8


@pytest.mark.parametrize("target,processes", [(1, 1), (256, 1), (1024, 1), (1025, 2), (8192, 8), (1 << 20, 16)])
def test_front_is_sized_from_target_concurrency(target: int, processes: int) -> None:
    from netra.deploy.plan import front_sizing

    p, conns, nofile = front_sizing(target, 32)
    assert p == processes and nofile == 2 * conns
    # Two connections per admitted request, and room for a burst of refused clients to get their 503.
    assert p * (conns - 32 - 64) >= 1.25 * (2 * target + max(4 * target, 4096))


def test_nginx_errors_are_openai_json_and_503_says_retry_after() -> None:
    import json

    plan = plan_for("local", Path("/tmp/netra-unused"))
    text = nginx.render(plan)
    pages = dict(re.findall(r"error_page (\d+) (/_netra_error/\d+);", text))
    assert set(pages) == {"400", "405", "408", "413", "414", "494", "500", "502", "503", "504"}
    for status, uri in pages.items():
        block = text[text.index(f"location = {uri} {{"):]
        block = block[:block.index("}\n")]
        sent, body = re.search(r"return (\d+) '(.*)';", block).groups()  # type: ignore[union-attr]
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and "internal;" in block
        assert "default_type application/json;" in block
        assert int(sent) == (400 if status == "494" else int(status))
        assert ("add_header Retry-After 1 always;" in block) == (status == "503")
    assert "limit_conn netra_front 256;" in text and "limit_conn_status 503;" in text
    assert f"client_max_body_size {8 << 20};" in text


@needs_nginx
def test_least_conn_and_down_workers(tmp_path: Path) -> None:
    plan = plan_for("local", tmp_path, **{"front.balance": "least_conn"})
    nginx.write(plan, down=[1])
    nginx.validate(plan)
    text = Path(plan.front.conf_path).read_text()
    assert "least_conn;" in text
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("server 127.")]
    assert not lines[0].rstrip().endswith("down;  # worker 0") and " down;" in lines[1]
    # Every worker down: nginx would reject the block, so one stays listed (requests fail fast).
    nginx.write(plan, down=[0, 1])
    nginx.validate(plan)


def test_template_placeholders_are_strict() -> None:
    with pytest.raises(nginx.NginxError, match=r"no value for \['b'\]"):
        nginx.fill("{{a}} {{b}}", {"a": "1"})
    with pytest.raises(nginx.NginxError, match=r"no placeholder for \['c'\]"):
        nginx.fill("{{a}}", {"a": "1", "c": "2"})
    assert nginx.fill("x {{ a }} $host", {"a": "1"}) == "x 1 $host"


@needs_nginx
def test_nginx_rejects_a_broken_config(tmp_path: Path) -> None:
    plan = plan_for("local", tmp_path)
    nginx.write(plan)
    conf = Path(plan.front.conf_path)
    conf.write_text(conf.read_text().replace("proxy_buffering off;", "proxy_buffering maybe;"))
    with pytest.raises(nginx.NginxError, match="nginx -t rejected"):
        nginx.validate(plan)
