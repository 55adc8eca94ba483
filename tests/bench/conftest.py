from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def smoke_record(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """``smoke_record(name)``: the spec's smoke path run once per test session (``python -m netra.bench.harness
    NAME --smoke`` in a fresh process: the interpreter must be on before triton's import), asserted to exit 0 with
    "0 failed" and a smoke record of checked cases, none failed, nothing timed or promoted; returns the record.
    Every test that wants a spec's smoke record reads this one run."""
    pytest.importorskip("triton", reason="triton is not installed: the interpreter smoke paths need it")
    out = tmp_path_factory.mktemp("smoke")
    done: dict[str, dict[str, Any]] = {}

    def run(name: str) -> dict[str, Any]:
        if name not in done:
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            proc = subprocess.run([sys.executable, "-m", "netra.bench.harness", name, "--smoke", "--out", str(out)],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            assert f"{name}: " in proc.stdout and " 0 failed" in proc.stdout, proc.stdout[-3000:]
            record: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
            c = record["checks"]
            assert record["status"] == "smoke" and record["verdict"] == "info" and record["rows"] == []
            assert "promotion" not in record  # a smoke run times nothing, so it promotes nothing
            assert c["cases"] >= 1 and c["mismatches"] == 0, c["failed"]
            assert all(v["ok"] for v in c["by_case"].values())
            done[name] = record
        return done[name]

    return run
