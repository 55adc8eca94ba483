"""`netra bench serve` against the real `local` deployment (nginx -> response layers -> tiny engines).

`netra launch --profile local --detach` on free ports, a small run through the front with exact
checks and a record, then `netra stop` (always, via `sweep.launched`).
"""

from __future__ import annotations

import collections
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from netra.bench import sweep
from netra.cli import main


def _nginx() -> bool:
    return bool(shutil.which("nginx") or Path("/usr/sbin/nginx").exists())


@pytest.mark.skipif(not _nginx(), reason="nginx is not installed (`make nginx`)")
@pytest.mark.timeout(400)
def test_local_deployment_run_passes_exact_checks_and_writes_record(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with sweep.launched("local", [], tmp_path / "launch") as up:
        assert up.workers == 2 and up.info_url and up.run_dir is not None
        assert up.launch is not None and up.launch["profile"] == "local" and len(up.launch["plan_sha256"]) == 64
        rc = main(["bench", "serve", "--url", up.url, "--info-url", up.info_url, "-K", "2", "-C", "4", "-R", "8",
                   "-I", "32", "-O", "16", "--workers", "2", "--stream-interval", "1", "--no-progress",
                   "--scenario", "local-ci", "--results-dir", str(tmp_path / "records"),
                   "--work-dir", str(tmp_path / "work")])
        out = capsys.readouterr()
        assert rc == 0, out.err
        # The same deployment through the OpenAI API (token-ID prompts, usage counts).
        rc = main(["bench", "serve", "--api", "openai", "--url", up.url, "--info-url", up.info_url, "-K", "1",
                   "-C", "2", "-R", "4", "-I", "32", "-O", "16", "--workers", "2", "--no-progress", "--no-record",
                   "--work-dir", str(tmp_path / "work-openai")])
        assert rc == 0, capsys.readouterr().err
        access = up.run_dir / "nginx.access.log"
        deadline = time.monotonic() + 10
        lines: list[str] = []
        while time.monotonic() < deadline:  # nginx flushes its access log buffer every second
            lines = [ln for ln in access.read_text().splitlines() if '"POST /generate' in ln]
            if len(lines) >= 8:
                break
            time.sleep(0.5)
    records = list((tmp_path / "records").glob("bench-local-ci-c4-k2-*.json"))
    assert len(records) == 1
    rec = json.loads(records[0].read_text())
    assert rec["kind"] == "serving" and rec["status"] == "measured" and rec["checks"]["passed"] is True
    assert rec["checks"]["requests_completed"] == 8
    assert rec["checks"]["prompt_tokens_total"] == 8 * 32 and rec["checks"]["completion_tokens_total"] == 8 * 16
    assert rec["checks"]["cached_tokens_total"] == 0
    row = rec["rows"][0]
    assert row["workers"] == 2 and row["clients"] == 2 and row["output_tok_s"] > 0
    raw = [json.loads(ln) for p in (tmp_path / "work").glob("client-*.jsonl") for ln in p.read_text().splitlines()]
    window = max(r["t_end"] for r in raw) - min(r["t_start"] for r in raw)
    assert row["output_tok_s"] == pytest.approx(8 * 16 / window, rel=1e-12)
    # Round robin gave each worker the same number of measured requests.
    ups = collections.Counter(re.search(r"up=(\S+)", ln).group(1) for ln in lines)  # type: ignore[union-attr]
    assert sorted(ups.values()) == [4, 4], ups
