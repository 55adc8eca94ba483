"""Contracts, schema errors, catalog consistency and dispatch decisions (CPU)."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from netra.catalog import Catalog, CatalogError
from netra.contract import (
    ContractError,
    DimRange,
    Signature,
    expand,
    load_contract,
    merge_patch,
    parse_contract,
)
from netra.dispatch import Dispatcher, plan
from netra.settings import REPO_ROOT, SettingError
from netra.validate.schema import errors

F32 = "argmax_f32_v248320"  # a variant of kernels/sm90/argmax/argmax.contract.json


def base_doc() -> dict[str, Any]:
    """The repo's fp32 contract over the full row range 1-256 (the repo splits it with the cluster
    tactic at rows 2-16; these tests exercise the catalog and dispatch, not that split)."""
    doc = copy.deepcopy(Catalog.load().doc(F32))
    doc["match"]["dims"]["rows"] = {"min": 1, "max": 256}
    return doc


def sig(rows: int = 16, vocab: int = 248320, dtype: str = "float32", layout: str = "contiguous_align16",
        target: str = "sm90", phase: str = "eager") -> Signature:
    return Signature(target=target, op="argmax", dims=(("rows", rows), ("vocab", vocab)),
                     dtypes=(("x", dtype),), layouts=(("x", layout),), graph_phase=phase)


def write(root: Path, doc: dict[str, Any], fname: str | None = None) -> Path:
    d = root / doc["target"] / doc["family"]
    d.mkdir(parents=True, exist_ok=True)
    path = d / (fname or f"{doc['name']}.contract.json")
    path.write_text(json.dumps(doc))
    return path


def test_repo_catalog_loads_and_names_files() -> None:
    cat = Catalog.load()
    names = {c.name for c in cat.contracts}
    assert {"argmax_f32_v248320", "argmax_bf16_v248320"} <= names
    c = cat.by_name("argmax_f32_v248320")
    assert c.code_object == "sm90/argmax/argmax_f32_v248320.cubin"
    assert c.dims["vocab"].contains(248320) and not c.dims["vocab"].contains(248321)


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.__setitem__("colour", "red"), "unknown key 'colour'"),
    (lambda d: d["match"].__setitem__("dtype", ["float32"]), "$.match: unknown key 'dtype'"),
    (lambda d: d.__setitem__("maturity", "great"), "$.maturity: 'great' not one of"),
    (lambda d: d["launch"].__setitem__("block", 4096), "$.launch.block: 4096 above maximum 1024"),
    (lambda d: d["launch"].__setitem__("block", "256"), "$.launch.block: expected integer"),
    (lambda d: d.pop("numerics"), "missing required key 'numerics'"),
    (lambda d: d["match"]["dims"].__setitem__("rows", {"min": 1}), "$.match.dims.rows"),
    (lambda d: d["match"].__setitem__("graph_phases", ["replay"]), "$.match.graph_phases[0]"),
    (lambda d: d["workspace"].__setitem__("zeroed", 1), "$.workspace.zeroed: expected boolean"),
    (lambda d: d.__setitem__("evidence", ["notes.txt"]), "$.evidence[0]"),
])
def test_schema_errors_name_the_key(mutate: Any, needle: str, tmp_path: Path) -> None:
    doc = base_doc()
    mutate(doc)
    with pytest.raises(ContractError) as exc:
        parse_contract(doc, tmp_path / "x.contract.json")
    assert needle in str(exc.value)
    assert "x.contract.json" in str(exc.value)


def test_bad_range_and_misplaced_source_rejected(tmp_path: Path) -> None:
    doc = base_doc()
    doc["match"]["dims"]["rows"] = {"min": 9, "max": 2}
    with pytest.raises(ContractError, match="min 9 > max 2"):
        parse_contract(doc, tmp_path / "a.json")
    doc = base_doc()
    doc["kernel"]["source"] = "kernels/sm90/moe/argmax.cu"
    with pytest.raises(ContractError, match="must live under kernels/sm90/argmax/"):
        parse_contract(doc, tmp_path / "b.json")


def test_invalid_json_named(tmp_path: Path) -> None:
    p = tmp_path / "broken.contract.json"
    p.write_text("{nope")
    with pytest.raises(ContractError, match=r"broken\.contract\.json: not valid JSON"):
        load_contract(p)


def test_schema_validator_rejects_unsupported_keywords() -> None:
    with pytest.raises(ValueError, match="unsupported keywords"):
        errors(1, {"type": "integer", "multipleOf": 2})
    assert errors(True, {"type": "integer"})  # a JSON boolean is not an integer
    assert not errors({"eq": 3}, {"oneOf": [{"type": "object", "required": ["eq"]},
                                            {"type": "object", "required": ["in"]}]})


def test_catalog_duplicate_ambiguity_evidence_and_directory(tmp_path: Path) -> None:
    a = base_doc()
    write(tmp_path, a)
    write(tmp_path, a, "copy.contract.json")
    with pytest.raises(CatalogError, match="duplicate contract name 'argmax_f32_v248320'"):
        Catalog.load(tmp_path)

    root = tmp_path / "amb"
    b = base_doc()
    b["name"] = "argmax_f32_small"
    b["match"]["dims"]["rows"] = {"in": [1, 2, 4]}
    write(root, a)
    write(root, b)
    with pytest.raises(CatalogError, match=r"ambiguous: argmax_f32_small \(.*\) and argmax_f32_v248320"):
        Catalog.load(root)
    # Disjoint domains (or different maturities) are not ambiguous.
    b["match"]["dims"]["rows"] = {"min": 257, "max": 512}
    write(root, b)
    assert len(Catalog.load(root).contracts) == 2
    b["match"]["dims"]["rows"] = {"in": [1, 2, 4]}
    b["maturity"] = "rejected"
    write(root, b)
    assert len(Catalog.load(root).contracts) == 2

    root = tmp_path / "ev"
    c = base_doc()
    c["maturity"] = "accepted"
    c["evidence"] = []
    write(root, c)
    with pytest.raises(CatalogError, match="must cite evidence"):
        Catalog.load(root)
    c["evidence"] = ["results/sm90/does_not_exist.json"]
    write(root, c)
    with pytest.raises(CatalogError, match="evidence not found"):
        Catalog.load(root)

    root = tmp_path / "dir"
    d = base_doc()
    (root / "sm90" / "moe").mkdir(parents=True)
    (root / "sm90" / "moe" / "x.contract.json").write_text(json.dumps(d))
    with pytest.raises(CatalogError, match="disagree with its directory sm90/moe"):
        Catalog.load(root)


def _catalog(tmp_path: Path, maturities: dict[str, str]) -> Catalog:
    for dt, name in (("float32", "argmax_f32_v248320"), ("bfloat16", "argmax_bf16_v248320")):
        doc = base_doc()
        doc["name"] = name
        doc["match"]["dtypes"]["x"] = [dt]
        doc["maturity"] = maturities.get(name, "experiment")
        write(tmp_path, doc)
    return Catalog.load(tmp_path)


def test_plan_decisions_and_reasons(tmp_path: Path) -> None:
    cat = _catalog(tmp_path, {"argmax_f32_v248320": "verified", "argmax_bf16_v248320": "rejected"})
    d = plan(sig(), cat, "accepted")
    assert d.contract is None and "maturity verified below the required accepted" in d.reason
    d = plan(sig(), cat, "verified")
    assert d.contract is not None and d.contract.name == "argmax_f32_v248320"
    assert ("argmax_bf16_v248320", "dtype x=float32 not in ['bfloat16']") in d.rejections
    # rejected is never selected, whatever the minimum maturity.
    d = plan(sig(dtype="bfloat16"), cat, "experiment")
    assert d.contract is None and "rejected (kept as evidence" in d.reason
    for s, why in ((sig(vocab=1000), "dim vocab=1000 not == 248320"),
                   (sig(rows=257), "dim rows=257 not in [1, 256]"),
                   (sig(layout="strided"), "layout x=strided not in ['contiguous_align16']"),
                   (sig(target="cpu"), "target cpu != sm90"),
                   (sig(dtype="float16"), "dtype x=float16 not in ['float32']")):
        d = plan(s, cat, "experiment")
        assert d.contract is None and why in d.reason, (s, d.reason)
    d = plan(sig(), cat, "experiment", disabled=True)
    assert d.contract is None and "NETRA_DISABLE_TACTICS" in d.reason
    d = plan(Signature(target="sm90", op="softmax", dims=(), dtypes=(), layouts=()), cat)
    assert d.reason == "no contract for op 'softmax'"
    with pytest.raises(ValueError, match="min maturity"):
        plan(sig(), cat, "rejected")


def test_dispatcher_caches_and_logs_each_reason_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cat = _catalog(tmp_path, {})
    disp = Dispatcher(catalog=cat, min_maturity="accepted", disabled=False)
    caplog.set_level(logging.INFO, logger="netra.dispatch")
    first = disp.select(sig(target="cpu"))
    assert first.fallback and "target cpu != sm90" in first.reason
    assert disp.select(sig(target="cpu")) is first  # cached: the hot path is a dict lookup
    # Another signature with the same reason: decided again, not logged again.
    assert disp.select(sig(target="cpu", phase="capture")).reason == first.reason
    # A different reason is logged once more.
    assert "maturity experiment below" in disp.select(sig()).reason
    disp.select(sig())
    lines = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
    assert len(lines) == 2, lines
    assert len(disp.logged_reasons()) == 2


def test_disable_tactics_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cat = _catalog(tmp_path, {})
    monkeypatch.setenv("NETRA_DISABLE_TACTICS", "1")
    monkeypatch.setenv("NETRA_TACTIC_MIN_MATURITY", "experiment")
    d = Dispatcher(catalog=cat).select(sig())
    assert d.fallback and "NETRA_DISABLE_TACTICS" in d.reason
    monkeypatch.setenv("NETRA_TACTIC_MIN_MATURITY", "best")
    with pytest.raises(SettingError, match="NETRA_TACTIC_MIN_MATURITY='best'"):
        Dispatcher(catalog=cat)


def test_signature_of_cpu_tensors() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 248320)
    s = Signature.of(op="argmax", tensors={"x": x}, params={"rows": 4, "vocab": 248320})
    assert s.target == "cpu" and s.device == -1 and s.graph_phase == "eager"
    assert dict(s.dtypes) == {"x": "float32"}
    assert dict(s.layouts)["x"] in ("contiguous_align16", "contiguous")
    assert dict(Signature.of(op="argmax", tensors={"x": x.t()}).layouts) == {"x": "strided"}
    assert hash(s) == hash(Signature.of(op="argmax", tensors={"x": x}, params={"rows": 4, "vocab": 248320}))
    with pytest.raises(ValueError, match="tensor 'y' is on meta"):
        Signature.of(op="argmax", tensors={"x": x, "y": torch.empty(1, device="meta")})


def test_explain_cli_shows_in_and_out_of_contract(capsys: pytest.CaptureFixture[str]) -> None:
    from netra.cli import main

    assert main(["explain", "--min-maturity", "experiment"]) == 0
    out = capsys.readouterr().out
    assert "-> tactic argmax_f32_v248320" in out
    assert "dim vocab=151936 not == 248320" in out
    assert main(["explain", "--op", "argmax", "--dim", "rows=300", "--dtype", "x=bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "-> fallback" in out and "dim rows=300 not in [1, 256]" in out
    with pytest.raises(SystemExit, match="expected NAME=VALUE"):
        main(["explain", "--op", "argmax", "--dim", "rows"])


def test_declarations_are_never_built_or_selected(tmp_path: Path) -> None:
    cat = Catalog.load()
    decl = cat.by_name("argmax_f32_v248320_gfx950")
    assert decl.declaration and decl.target == "gfx950" and not decl.kernel
    d = plan(sig(target="gfx950"), cat, "experiment")
    assert d.contract is None
    assert ("argmax_f32_v248320_gfx950", "declaration only: no code object for gfx950 yet") in d.rejections
    doc = copy.deepcopy(decl.raw)
    doc["kernel"] = base_doc()["kernel"]
    with pytest.raises(ContractError, match="a declaration has no code object; remove \\['kernel'\\]"):
        parse_contract(doc, tmp_path / "d.json")
    doc.pop("kernel")
    doc["maturity"] = "accepted"
    with pytest.raises(ContractError, match="a declaration cannot be accepted"):
        parse_contract(doc, tmp_path / "d.json")
    full = base_doc()
    full.pop("launch")
    with pytest.raises(ContractError, match=r"missing required keys \['launch'\]"):
        parse_contract(full, tmp_path / "e.json")


def test_explain_domain_signature_lies_in_each_contract() -> None:
    from netra.dispatch_cli import domain_signature

    for c in Catalog.load().contracts:
        assert c.mismatch(domain_signature(c)) is None, c.name


def test_variants_expand_as_merge_patches(tmp_path: Path) -> None:
    base = base_doc()
    fam = {k: v for k, v in base.items() if k != "name"} | {"maturity": "verified"}
    fam["variants"] = [
        {"name": "a_small", "match": {"dims": {"rows": {"min": 1, "max": 8}}}},
        {"name": "a_big", "match": {"dims": {"rows": {"min": 9, "max": 256}}}, "launch": {"block": 512},
         "notes": None, "evidence": []},
    ]
    path = write(tmp_path, fam, "family.contract.json")
    cat = Catalog.load(tmp_path, tmp_path)
    assert [c.name for c in cat.contracts] == ["a_small", "a_big"]
    small, big = cat.contracts
    assert small.path == big.path == path
    assert small.dims["rows"] == DimRange(1, 8) and big.dims["rows"] == DimRange(9, 256)
    assert small.launch == base["launch"] and big.launch == base["launch"] | {"block": 512}
    assert "notes" in small.raw and "notes" not in big.raw and "variants" not in big.raw
    assert list(big.dims) == list(base["match"]["dims"])  # a patched key keeps its place
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": [3]}}) == {"a": {"c": 2, "d": [3]}}
    with pytest.raises(ContractError, match="declares 2 contracts"):
        load_contract(path)
    fam["variants"][1]["launch"] = {"block": 4096}
    write(tmp_path, fam, "family.contract.json")
    with pytest.raises(CatalogError, match=r"family.contract.json\[a_big\]: \$.launch.block: 4096 above maximum"):
        Catalog.load(tmp_path, tmp_path)
    for bad, needle in (([], "non-empty list"), ([{"match": {}}], "names its contract"),
                        ([{"name": "x", "variants": []}], "do not nest")):
        fam["variants"] = bad
        with pytest.raises(ContractError, match=needle):
            expand(fam, path)
    fam["variants"] = [{"name": "dup"}, {"name": "dup"}]
    write(tmp_path, fam, "family.contract.json")
    with pytest.raises(CatalogError, match="duplicate contract name 'dup'"):
        Catalog.load(tmp_path, tmp_path)


def test_repo_family_files() -> None:
    """Issue 34: one file per kernel source (a family's contracts as variants), at most 16 under sm90."""
    files = sorted((REPO_ROOT / "kernels" / "sm90").glob("*/*.contract.json"))
    assert len(files) <= 16, [f.name for f in files]


def test_notes_carry_no_measurements_and_history_is_cited() -> None:
    """Issue 34: notes say what the code is and why; figures live in records and the results/ notes (.md) that a
    contract's evidence cites (each such note names the contract)."""
    import re

    figure = re.compile(r"\d[\d,.]*\s*(?:us|µs|ms|ns|%|GB/s|TB/s)(?![\w/])|\d\.\d+x\b")  # times, shares, speedups
    for c in Catalog.load().contracts:
        notes = str(c.raw.get("notes", ""))
        assert not figure.search(notes), (c.name, figure.search(notes))
        for doc in (e for e in c.evidence if e.endswith(".md")):
            assert c.name in (REPO_ROOT / doc).read_text(), (c.name, doc)
