"""The one comparison (netra.validate.compare), the one promotion rule (netra.validate.promotion) and the one
harness (netra.bench.harness): their rules on adversarial inputs, that nothing else in the tree defines them, and
that every family's spec runs its smoke path (CPU, Triton's interpreter) through the harness."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest
import torch

from netra.bench import harness
from netra.validate.compare import compare, rel_l2
from netra.validate.promotion import judge, promote

REPO = Path(__file__).resolve().parents[2]
BITS = {"policy": "bitwise"}


def test_bitwise_compares_bits() -> None:
    x = torch.tensor([1.0, float("nan"), -0.0, float("inf")])
    assert compare(BITS, x, x.clone())["ok"]  # NaN equals the same NaN, inf equals inf
    assert not compare(BITS, torch.tensor([0.0]), torch.tensor([-0.0]))["ok"]  # equal as numbers, not as bits
    assert not compare(BITS, x.bfloat16(), x)["ok"]  # dtypes differ
    assert not compare(BITS, x[:3], x)["ok"]  # shapes differ
    y = x.clone()
    y[0] = torch.nextafter(y[0], torch.tensor(2.0))
    r = compare(BITS, y, x)
    assert not r["ok"] and r["outside"] == 1
    q = torch.tensor([1.0, -2.0]).to(torch.float8_e4m3fn)
    assert compare(BITS, q, q.clone())["ok"]


def test_rel_l2_is_one_definition_with_its_edges() -> None:
    ref = torch.tensor([3.0, 4.0])
    assert rel_l2(ref, ref) == 0.0
    assert rel_l2(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert rel_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    assert rel_l2(torch.tensor([0.0, 1e-30]), torch.zeros(2)) == float("inf")
    assert rel_l2(torch.tensor([3.0, float("nan")]), ref) == float("inf")
    num = {"policy": "rel_l2", "rtol": 0.1}
    assert compare(num, torch.tensor([3.0, 4.5]), ref)["ok"]  # at the bound
    assert not compare(num, torch.tensor([3.0, 4.51]), ref)["ok"]
    assert not compare(num, torch.tensor([3.0, float("inf")]), ref)["ok"]
    assert not compare({**num, "atol": 0.4}, torch.tensor([3.0, 4.5]), ref)["ok"]  # max |err| 0.5 > atol


def test_elementwise_judges_each_element() -> None:
    ref = torch.full((1000,), 100.0)
    ref[0] = 1.0
    got = ref.clone()
    got[0] = 1.2  # rel-L2 tiny, but this element is 20 % off
    num = {"policy": "elementwise", "rtol": 0.01, "atol": 1e-5}
    assert compare({"policy": "rel_l2", "rtol": 0.01}, got, ref)["ok"]
    r = compare(num, got, ref)
    assert not r["ok"] and r["outside"] == 1
    got[0] = 1.0 + 0.01 + 1e-5 * 100 * 0.99  # within rtol*|ref| + atol*max|ref|
    assert compare(num, got, ref)["ok"]
    special = torch.tensor([float("nan"), float("inf"), 1.0])
    assert compare(num, special.clone(), special)["ok"]  # non-finite exactly where the reference has them
    assert not compare(num, torch.tensor([float("nan"), float("-inf"), 1.0]), special)["ok"]
    assert not compare(num, torch.tensor([0.0, float("inf"), 1.0]), special)["ok"]
    with pytest.raises(ValueError, match="tolerance"):
        compare({"policy": "tolerance", "rtol": 1.0}, ref, ref)


def test_every_catalog_contract_names_a_policy_compare_applies() -> None:
    from netra.catalog import Catalog

    for c in Catalog.load().contracts:
        num = c.numerics
        assert num["policy"] in ("bitwise", "rel_l2", "elementwise"), c.name
        if num["policy"] != "bitwise":
            assert "rtol" in num, c.name
        if num["policy"] == "elementwise":
            assert "atol" in num, c.name


def test_promotion_needs_every_check_and_no_loss_at_any_shape() -> None:
    ok = [{"ok": True}, {"ok": True, "eager_equals_replay": True}]
    times = {"m=1": {"netra": 2.0, "torch": 3.0, "peer": 2.0}, "m=8": {"netra": 4.0, "torch": 9.0}}
    assert promote(ok, times, "netra")["pass"]  # a tie with the best peer is not a loss
    assert not promote([*ok, {"ok": False}], times, "netra")["pass"]
    assert not promote([], times, "netra")["pass"]  # never checked
    assert not promote(ok, {}, "netra")["pass"]  # never timed
    slower = {**times, "m=64": {"netra": 5.0, "torch": 9.0, "other_tactic": 4.9}}
    r = promote(ok, slower, "netra")
    assert not r["pass"] and [x["shape"] for x in r["lost"]] == ["m=64"] and r["lost"][0]["best_other"] == "other_tactic"
    assert not promote(ok, {"m=1": {"torch": 1.0}}, "netra")["pass"]  # ours not timed there
    j = judge({"a": promote(ok, times, "netra"), "b": r})
    assert list(j["promotion"]) == ["a"] and list(j["not_promoted"]) == ["b"] and j["verdict"] == "accepted"
    assert judge({"b": r})["verdict"] == "info"


def _defs(names: set[str]) -> list[str]:
    hits = []
    for root in ("netra", "scripts", "tests", "kernels"):
        for path in (REPO / root).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                    hits.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
            for node in tree.body:  # a module-level name bound to one (a local variable is not a definition)
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names
                                                         for t in node.targets):
                    hits.append(f"{path.relative_to(REPO)}:{node.lineno} (assignment)")
    return hits


def test_one_comparison_and_one_promotion_rule_in_the_tree() -> None:
    compares = _defs({"rel_l2", "tolerance_report", "judge_numerics"})
    assert compares == [h for h in compares if h.startswith("netra/validate/compare.py")], compares
    rules = _defs({"promotion", "promotion_by_contract", "PROMOTION_RULE", "promote", "RULE"})
    assert rules == [h for h in rules if h.startswith("netra/validate/promotion.py")], rules


def _toy_spec(corrupt: bool) -> harness.Spec:
    def check() -> dict[str, object]:
        ref = torch.arange(16, dtype=torch.float32)
        got = ref.clone()
        if corrupt:
            got[3] += 1
        return {"out": (r := compare(BITS, got, ref)), "ok": r["ok"]}

    def smoke():  # type: ignore[no-untyped-def]
        yield lambda: harness.Case(key="n=16", op="toy", shape={"n": 16}, dtype="float32", check=check,
                                   contract="toy_contract")
        yield lambda: (_ for _ in ()).throw(RuntimeError("a case that cannot be built"))

    return harness.Spec(name="toy", family="toy", doc="toy", cases=lambda o: iter(()), smoke=smoke)


@pytest.mark.parametrize("corrupt", [False, True])
def test_harness_records_each_case_and_a_broken_one(corrupt: bool) -> None:
    rec = harness.run(_toy_spec(corrupt), argparse.Namespace(smoke=True))
    c = rec["checks"]
    assert c["cases"] == 2 and rec["status"] == "smoke" and rec["verdict"] == "info"
    assert "a case that cannot be built" in c["by_case"]["case 1"]["error"]
    assert c["by_case"]["n=16"]["ok"] is (not corrupt)
    assert c["mismatches"] == (2 if corrupt else 1)
    assert "promotion" not in rec  # a smoke run promotes nothing


def test_harness_refuses_a_timed_run_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert harness.main(["norm_fp8"]) == 2
    assert "--smoke" in capsys.readouterr().err


def test_every_sm90_contract_is_measured_by_a_spec() -> None:
    """Every sm90 contract dispatch may select (plans and declarations alike; a rejected one never is) is one a spec
    checks and times, so the one harness is the way any of them gets a record."""
    from netra.catalog import Catalog

    covered = {c for s in harness.specs().values() for c in s.contracts}
    wanted = {c.name for c in Catalog.load().contracts if c.target == "sm90" and c.maturity != "rejected"}
    assert wanted <= covered, sorted(wanted - covered)
    names = {c.name for c in Catalog.load().contracts}
    assert covered <= names, sorted(covered - names)  # no spec names a contract that does not exist


def test_a_deadline_cut_promotes_nothing() -> None:
    spec = _toy_spec(False)
    rec: dict[str, object] = {"skipped_past_deadline": ["case 3"]}
    checks = {"n=16": {"ok": True}}
    harness._finish(rec, checks, {"n=16": "toy_contract"}, {"toy_contract": {"n=16": {"netra": 1.0, "torch": 2.0}}},
                    {"toy_contract": "netra"})
    assert rec["verdict"] == "info" and "cut" in rec["not_promoted"]["toy_contract"]  # type: ignore[index]
    rec = {}
    harness._finish(rec, checks, {"n=16": "toy_contract"}, {"toy_contract": {"n=16": {"netra": 1.0, "torch": 2.0}}},
                    {"toy_contract": "netra"})
    assert rec["verdict"] == "accepted" and spec.name == "toy"


@pytest.mark.parametrize("name", sorted(harness.specs()))
def test_each_spec_runs_its_interpreter_smoke_path(name: str, smoke_record) -> None:  # type: ignore[no-untyped-def]
    """Every smoke case of every spec checks out through the harness (tests/bench/conftest.py runs it once)."""
    assert smoke_record(name)["spec"] == name
