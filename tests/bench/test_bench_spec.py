"""`netra bench spec` on the CPU at a tiny grid: the record validates, every point is exact, each forced count is
the realised acceptance length, and plain decoding is the baseline of its concurrency."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netra.bench.spec import main
from netra.records import validate


def test_bench_spec_writes_an_exact_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETRA_CACHE_DIR", str(tmp_path / "cache"))  # the seeded drafter is written there
    assert main(["--concurrency", "2", "--steps", "3", "--output-len", "7", "--input-len", "4",
                 "--out", str(tmp_path), "--stem", "spec"]) == 0
    record = json.loads((tmp_path / "spec.json").read_text())
    validate(record)
    assert record["checks"] == {"exact_tokens": True, "tau_matches_forced": True} and record["verdict"] == "info"
    rows = {(r["T"], r["accept"]): r for r in record["rows"]}
    assert set(rows) == {(None, None), (3, 0), (3, 2)}  # plain; tau 1 and 3 (T/2 - 1 = 0 repeats tau 1)
    assert rows[(None, None)]["speedup_vs_plain"] == 1.0 and rows[(None, None)]["tau"] == 1.0
    assert rows[(3, 0)]["tau"] == 1.0 and rows[(3, 2)]["tau"] == 3.0  # 6 decode tokens in 6 and in 2 verifies
    assert (tmp_path / "cache" / "drafters" / "dflash-tiny-seed1" / "config.json").exists()
