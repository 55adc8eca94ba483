"""scripts/gpu/determinism_stress.py's CPU-checkable parts (issue 19): its bitwise tally, its op labels, and the
pre-fix conv variant it runs beside the tree's kernel (the same source less the one CTA barrier, numerically the
same kernel: under the interpreter, which runs a program's loads before its stores, both give the same bits)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from netra.ops import conv
from netra.ops.linear import Weight

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stress() -> Any:
    path = REPO / "scripts" / "gpu" / "determinism_stress.py"
    spec = importlib.util.spec_from_file_location("determinism_stress_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_tally_counts_bitwise_differences_nan_payloads_included(stress: Any) -> None:
    a = torch.tensor([1.0, float("nan"), -0.0])
    other_nan = a.clone()
    other_nan.view(torch.int32)[1] ^= 1  # another NaN payload: torch.equal would call both NaNs unequal anyway
    plus_zero = a.clone()
    plus_zero[2] = 0.0
    runs = [[a.clone()], [a.clone()], [other_nan], [a.clone()], [plus_zero], [other_nan.clone()]]
    assert stress.tally(runs) == (3, 3)
    assert stress.tally([[a.clone()] for _ in range(4)]) == (0, 1)  # NaN bits equal: no difference
    assert stress.tally(runs, ref=[plus_zero]) == (5, 3)
    assert stress.tally([[a], [a, a]]) == (1, 2)  # a run with another output count differs


def test_labels_and_signatures_tell_the_projections_apart(stress: Any) -> None:
    x = torch.zeros(4, 2048, dtype=torch.bfloat16)
    qkv, z = Weight(torch.zeros(8192, 2048)), Weight(torch.zeros(4096, 2048))
    o = Weight(torch.zeros(2048, 4096))
    assert stress.label_of("linear_group", (x, [qkv, z])) == "linear_group 8192+4096x2048"
    assert stress.label_of("linear", (x, o)) == "linear 2048x4096"
    assert stress.label_of("moe", (x, object())) == "moe"
    assert stress.sig_key("linear_group", (x, [qkv, z]), {}) != stress.sig_key("linear_group", (x, [o]), {})
    assert stress.sig_key("linear", (x, o), {}) == stress.sig_key("linear", (x.clone(), o), {})


def test_pre_fix_conv_is_the_tree_kernel_less_its_barrier(stress: Any, interp_entry: Any) -> None:
    entry, doc = interp_entry("conv1d_update_c8192_w4")
    pre = stress.pre_fix_conv_module()
    src = stress.CONV_SOURCE.read_text()
    assert src.count("tl.debug_barrier()") == 1
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 8192 + 96, generator=g).bfloat16()[:, :8192]
    w = (torch.randn(8192, 4, generator=g) * 0.5).bfloat16()
    pool = torch.randn(5, 8192, 3, generator=g).bfloat16()
    slots = torch.tensor([2, 0, 4])
    fixed_pool, pre_pool, ref_pool = pool.clone(), pool.clone(), pool.clone()
    y_fixed = entry(doc["launch"], x=x, weight=w, state_pool=fixed_pool, slots=slots)
    y_pre = pre.conv1d_update(doc["launch"], x=x, weight=w, state_pool=pre_pool, slots=slots)
    conv.causal_conv1d_update_ref(x, w, ref_pool, slots)
    assert torch.equal(y_fixed.view(torch.int16), y_pre.view(torch.int16))
    assert torch.equal(fixed_pool.view(torch.int16), pre_pool.view(torch.int16))
    assert torch.equal(pre_pool.view(torch.int16), ref_pool.view(torch.int16))  # the shift itself is exact


class _FakeGraph:
    """CUDA-graph stand-in on the CPU: the 'capture' (a null context) runs the calls eagerly and a replay leaves
    their outputs as they are, so the graph rows check the script's bookkeeping, not a GPU."""

    def replay(self) -> None:
        return None


def _fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import nullcontext

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: type("S", (), {"wait_stream": lambda *a: None})())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: type("S", (), {"wait_stream": lambda *a: None})())
    monkeypatch.setattr(torch.cuda, "stream", lambda *a, **k: nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, **k: nullcontext())


def test_stress_op_restores_in_place_state_and_counts_a_flaky_op(stress: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch)
    pool = torch.arange(12, dtype=torch.float32).reshape(4, 3)

    def conv_like(x: torch.Tensor, w: torch.Tensor, state_pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        state_pool.add_(1.0)  # mutates its state: without the restore every run would differ
        return x * state_pool.sum()

    x = torch.ones(2, 3)
    rows = stress.stress_op("conv.causal_conv1d_update", conv_like, (x, None, pool, None), {}, pool.clone(), n=20)
    assert [(r["variant"], r["differ"], r["distinct"]) for r in rows] == [
        ("eager", 0, 1), ("eager+state", 0, 1), ("graph x2", 0, 1)]
    assert rows[0]["runs"] == 20 and rows[2]["runs"] == 40

    calls = [0]

    def flaky(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        out = x.clone()
        if calls[0] % 7 == 0:  # a 1-ulp nudge now and then
            out.view(torch.int32)[0] += 1
        return out

    rows = stress.stress_op("norm.rmsnorm", flaky, (x,), {}, None, n=20)
    eager = rows[0]
    assert eager["variant"] == "eager" and eager["differ"] == 3 and eager["distinct"] == 2  # calls 7, 14, 21


def test_first_diff_names_the_first_op_whose_held_output_moved(stress: Any) -> None:
    a = torch.tensor([1.0, 2.0])
    b = a.clone()
    b.view(torch.int32)[1] += 1
    step0 = [("norm.rmsnorm", [a]), ("moe", [a.clone()]), ("linear", [a.clone()])]
    step1 = [("norm.rmsnorm", [a.clone()]), ("moe", [b]), ("linear", [b.clone()])]
    assert stress.first_diff(step0, step0) == ""
    assert stress.first_diff(step0, step1) == "op 1 moe"
