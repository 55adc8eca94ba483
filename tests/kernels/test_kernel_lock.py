"""Kernel lock: CI rebuilds every code object and compares hash, resources and flags (CPU + nvcc)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from netra.build import (
    BuildError,
    build_all,
    compare_locks,
    object_path,
    parse_ptxas,
    read_lock,
    verify_lock,
)
from netra.catalog import Catalog

CUDA13_REPORT = """ptxas info    : 36 bytes gmem
ptxas info    : Compiling entry function 'netra_argmax_sm90' for 'sm_90a'
ptxas info    : Function properties for netra_argmax_sm90
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 48 registers, used 1 barriers, 64 bytes smem
ptxas info    : Compile time = 72.964 ms
"""


def test_parse_ptxas_cuda13_report() -> None:
    assert parse_ptxas(CUDA13_REPORT, "netra_argmax_sm90") == {
        "registers": 48, "smem_bytes": 64, "spill_stores": 4, "spill_loads": 12, "stack_bytes": 8, "barriers": 1}
    with pytest.raises(BuildError, match="lacks"):
        parse_ptxas(CUDA13_REPORT, "other_kernel")


def test_lock_covers_catalog_and_has_the_shared_format() -> None:
    lock = read_lock()
    assert lock["version"] == 1 and lock["nvcc"].startswith("Cuda compilation tools")
    names = {e["name"] for e in lock["code_objects"]}
    cat = Catalog.load()
    objects = {o.name: o for o in cat.objects() if o.target == "sm90"}
    assert names == set(objects)
    for e in lock["code_objects"]:
        assert set(e) == {"target", "family", "name", "source", "kind", "code_object", "sha256", "flags", "resources"}
        assert e["code_object"] == objects[e["name"]].path
        assert len(e["sha256"]) == 64 and (Path(__file__).parents[2] / e["source"]).is_file()
        if e["kind"] == "triton":
            assert e["code_object"] == e["source"] and not e["resources"]
            continue
        assert e["code_object"] == f"{e['target']}/{e['family']}/{e['name']}.cubin"
        if e["resources"]["spill_stores"] or e["resources"]["spill_loads"]:
            assert objects[e["name"]].kernel.get("accepted_spills"), f"{e['name']}: unexplained spills"


def test_compare_locks_names_every_difference() -> None:
    lock = read_lock()
    other = json.loads(json.dumps(lock))
    other["code_objects"][0]["sha256"] = "0" * 64
    other["code_objects"][0]["resources"]["registers"] += 1
    other["nvcc"] = "Cuda compilation tools, release 99.0"
    problems = compare_locks(lock, other)
    name = lock["code_objects"][0]["name"]
    assert any(p.startswith(f"{name}: sha256 differs") for p in problems)
    assert any(p.startswith(f"{name}: resources differs") for p in problems)
    assert any(p.startswith("nvcc differs") for p in problems)
    other["code_objects"].pop()
    assert any("in the lock but no contract builds it" in p for p in compare_locks(lock, other))


def test_verify_lock_detects_missing_and_tampered_code_objects(tmp_path: Path) -> None:
    lock = read_lock()
    problems = verify_lock(tmp_path)
    cubins = [e for e in lock["code_objects"] if e["kind"] == "cubin"]  # Triton modules live in the repository
    assert len(problems) == len(cubins) and all("missing" in p for p in problems)
    e = cubins[0]
    (tmp_path / e["code_object"]).parent.mkdir(parents=True)
    (tmp_path / e["code_object"]).write_bytes(b"not a cubin")
    assert any(f"{e['name']}:" in p and "sha256" in p for p in verify_lock(tmp_path))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed (CI installs CUDA 13.0 nvcc)")
def test_rebuild_matches_lock_bitwise(tmp_path: Path) -> None:
    """CI: rebuilding from source, in another directory, gives exactly the locked bytes and resources
    (the lock was built elsewhere, earlier: equal hashes show the build is deterministic)."""
    fresh = build_all(tmp_path / "a")
    assert compare_locks(read_lock(), fresh) == []
    for e in fresh["code_objects"]:  # a Triton module's object is its source in the repository
        assert hashlib.sha256(object_path(e, tmp_path / "a").read_bytes()).hexdigest() == e["sha256"]
    assert verify_lock(tmp_path / "a") == []
