"""`netra bench sweep` and `netra bench compare` end to end against synthetic upstreams."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from netra.bench import compare, synthetic
from netra.cli import main


def test_abba_order() -> None:
    assert "".join(compare.abba(3)) == "ABBAAB"
    assert "".join(compare.abba(4)) == "ABBAABBA"


def test_compare_gives_a_verdict_from_three_runs_per_arm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # B's upstream decodes 4x faster than A's: B must come out `better` on TPOT (lower is better).
    # TPOT is the upstream's pacing, stable on a loaded machine; output tok/s over such short runs
    # is dominated by TTFT noise, so it is only checked for direction here.
    with synthetic.running(synthetic.Config(rate=60.0, vocab_size=1000), tmp_path / "a") as url_a, \
            synthetic.running(synthetic.Config(rate=240.0, vocab_size=1000), tmp_path / "b") as url_b:
        rc = main(["bench", "compare", "--a-url", url_a, "--b-url", url_b, "--runs", "3", "-C", "4", "-R", "8",
                   "-I", "8", "-O", "12", "--metric", "tpot_ms_p50", "--no-progress", "--results-dir", str(tmp_path / "rec"),
                   "--work-dir", str(tmp_path / "work"), "--a-name", "slow", "--b-name", "fast"])
    out = capsys.readouterr().out
    assert rc == 0, out
    (path,) = list((tmp_path / "rec").glob("bench-compare-*.json"))
    rec = json.loads(path.read_text())
    c = rec["comparison"]
    assert [r["arm"] for r in rec["rows"]] == list("ABBAAB")
    assert len(c["arms"]["A"]["values"]) == 3 and len(c["arms"]["B"]["values"]) == 3
    assert c["verdict"] == "better" and rec["verdict"] == "accepted"
    assert c["metric"] == "tpot_ms_p50" and c["higher_is_better"] is False
    assert c["mean_b"] < c["mean_a"] / 2
    assert c["ci95"][1] < 0 and c["permutation"]["splits"] == 20
    assert all(r["checks"]["passed"] for r in rec["rows"])
    # Every other metric through the same gate, for the record.
    assert c["other_metrics"]["output_tok_s"]["mean_b"] > c["other_metrics"]["output_tok_s"]["mean_a"]
    assert "tpot_ms_p50" not in c["other_metrics"]
    assert "verdict: B is better" in out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:  # exited meanwhile
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def test_compare_command_arm_is_started_and_stopped_per_run(tmp_path: Path) -> None:
    cmd = f"{sys.executable} -m netra.bench.synthetic --port {{port}} --rate 500 --vocab-size 1000"
    with compare.command_upstream(cmd, tmp_path) as up:
        import httpx

        assert httpx.get(up.url + "/health", timeout=5).status_code == 200
        marker = f"--port {up.url.rsplit(':', 1)[1]} ".encode()
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and marker in _cmdline(int(p))]
        assert pids and all(_alive(p) for p in pids)
    assert not any(_alive(p) for p in pids)


def test_compare_refuses_fewer_than_three_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "compare", "--a-url", "http://127.0.0.1:9", "--b-url", "http://127.0.0.1:9", "--runs", "2"])
    assert rc == 1 and "--runs must be >= 3" in capsys.readouterr().err


def test_sweep_writes_record_and_plot(tmp_path: Path) -> None:
    rc = main(["bench", "sweep", "--synthetic", "--synthetic-rate", "200", "--concurrencies", "1,4",
               "--clients-list", "1,2", "--rounds", "2", "-I", "8", "-O", "8", "--vocab-size", "1000",
               "--no-progress", "--results-dir", str(tmp_path / "rec"), "--work-dir", str(tmp_path / "work")])
    assert rc == 0
    (path,) = list((tmp_path / "rec").glob("bench-sweep-*.json"))
    rec = json.loads(path.read_text())
    got = [(r["concurrency"], r["clients"], r["requests"]) for r in rec["rows"]]
    assert got == [(1, 1, 2), (4, 1, 8), (4, 2, 8)]  # K=2 > C=1 is skipped
    assert rec["checks"] == {"points": 3, "points_passed": 3}
    # The synthetic ideal: R*O / (rounds * (O-1)/rate) = 8*8 / (2 * 7/200) at C=4.
    assert rec["rows"][1]["ideal_output_tok_s"] == pytest.approx(8 * 8 / (2 * 7 / 200))
    png = path.with_suffix(".png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
