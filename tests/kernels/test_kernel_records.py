"""Committed kernel records are well formed, and every accepted contract's evidence supports it."""

from __future__ import annotations

import json

from netra.catalog import Catalog
from netra.kernel_lock import read_lock
from netra.records import validate
from netra.settings import REPO_ROOT


def test_kernel_records_validate() -> None:
    for path in sorted((REPO_ROOT / "results" / "sm90").glob("*.json")):
        record = json.loads(path.read_text())
        validate(record)
        assert record["kind"] == "kernel" and record["target"] == "sm90", path
        for row in record["rows"]:  # RESULTS.md's kernel-row keys, every family
            assert {"shape", "dtype", "provider", "mode", "median_us", "p90_us"} <= set(row), path


def test_accepted_contracts_cite_passing_records() -> None:
    locked = {e["name"]: e["sha256"] for e in read_lock()["code_objects"]}
    for c in Catalog.load().contracts:
        if c.maturity != "accepted":
            continue
        for ev in (e for e in c.evidence if e.endswith(".json")):  # the .md notes hold history
            record = json.loads((REPO_ROOT / ev).read_text())
            assert record["family"] == c.family and record["status"] == "measured", ev
            assert record["verdict"] == "accepted", f"{c.name} cites {ev} whose verdict is {record['verdict']}"
            checks = record["checks"]
            assert checks.get("mismatches") == 0 and checks.get("eager_equals_replay") is True, ev
            promotion = record.get("promotion", {})
            assert promotion and all(g["pass"] for g in promotion.values()), ev
            for o in c.objects:
                assert o.name in record.get("code_objects", {}), f"{ev} did not measure {o.name} ({c.name})"
                # The evidence measured the code object the lock pins (a changed kernel needs a new record).
                assert record["code_objects"][o.name]["sha256"] == locked[o.name], f"{ev} measured another build"
