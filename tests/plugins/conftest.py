"""Fakes for the SGLang plugin's CPU tests.

`cpu_as_sm90`: a dispatcher over the real catalog plus one small fixture contract for
``moe_fp8_routed`` (experts 8, hidden 256, inter 128, top-k 2, tokens 1..128: shapes a CPU holds),
that decides for CPU tensors as it would on an sm90 device (the target rewritten, every rule of
`netra.dispatch.plan` unchanged) and returns a fake tactic instead of loading a code object. The
hook's guards and dispatch's exact matching are what the tests exercise; the launchers are fakes
that record their calls and write a known function of their inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from netra import dispatch
from netra.catalog import Catalog
from netra.contract import Signature, parse_contract
from netra.dispatch import Decision, Dispatcher, plan
from netra.ops import _common
from netra.plugins import sglang as plugin
from netra.plugins import sglang_moe, sglang_sampler
from netra.settings import REPO_ROOT

E, H, INTER, K, TMAX = 8, 256, 128, 2, 128
FIXTURE = {
    "name": "moe_routed_cpu_fixture", "target": "sm90", "family": "moe", "op": "moe_fp8_routed",
    "description": "test fixture: a small routed-MoE domain for the SGLang plugin's CPU tests",
    "maturity": "accepted",
    "match": {
        "dims": {"tokens": {"min": 1, "max": TMAX}, "hidden": {"eq": H}, "inter": {"eq": INTER},
                 "experts": {"eq": E}, "top_k": {"eq": K}},
        "dtypes": {"x": ["bfloat16"], "w13": ["float8_e4m3fn"], "w2": ["float8_e4m3fn"], "topk_ids": ["int32"],
                   "topk_w": ["float32"]},
        "layouts": {n: ["contiguous_align16"] for n in ("x", "w13", "w2", "topk_ids", "topk_w")},
        "quant": ["fp8_e4m3_block128"], "reduction_order": ["any", "fixed"], "graph_phases": ["eager", "capture"],
        "determinism": ["bitwise", "run_to_run", "none"],
    },
    "kernel": {"source": "kernels/sm90/moe/fixture.cu", "symbol": "fixture", "flags": []},
    "launch": {"block": 128, "grid": "fixture", "smem_bytes": 0},
    "workspace": {"bytes": 0, "zeroed": False},
    "numerics": {"policy": "bitwise", "oracle": "netra.ops.moe:moe_ref"},
    "evidence": ["results/sm90/argmax_h200_2026-11-30.json"],
}


@dataclasses.dataclass
class FakeTactic:
    contract: Any
    device: int = -1
    sha256: str = "f" * 64


class CpuAsSm90(Dispatcher):
    def _decide(self, sig: Signature) -> Decision:
        d = plan(dataclasses.replace(sig, target="sm90") if sig.target == "cpu" else sig, self.catalog,
                 self.min_maturity, self.disabled)
        if d.contract is None:
            return d
        return Decision(FakeTactic(d.contract), d.reason, d.contract, d.rejections)


class FakeMoeLauncher:
    """Writes 2*x + 1 into a persistent buffer and returns a view of it (as the real launcher does)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.buf = torch.zeros((TMAX, H), dtype=torch.bfloat16)

    def __call__(self, decision: Any, **kw: Any) -> Any:
        self.calls.append({"contract": decision.contract.name, **kw})
        out = self.buf[: kw["x"].shape[0]]
        out.copy_(kw["x"] * 2 + 1)
        return out


@pytest.fixture
def cpu_as_sm90(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    real = Catalog.load()
    fixture = parse_contract(FIXTURE, Path(REPO_ROOT / "kernels/sm90/moe/fixture.contract.json"))
    d = CpuAsSm90(catalog=Catalog((*real.contracts, fixture), real.root), min_maturity="accepted", disabled=False)
    dispatch.reset(d)
    import netra.ops.moe  # noqa: F401  (its import binds the real launcher; the fake replaces it here)

    moe_launch = FakeMoeLauncher()
    monkeypatch.setitem(_common._launchers, "moe_fp8_routed", moe_launch)
    argmax_calls: list[Any] = []

    def fake_argmax_launch(tactic: Any, x: Any, out: Any) -> Any:
        argmax_calls.append((tactic.contract.name, tuple(x.shape), x.dtype))
        return out.copy_(torch.argmax(x, dim=-1))

    monkeypatch.setattr("netra.ops.argmax.launch", fake_argmax_launch)
    plugin.reset()
    sglang_moe.reset()
    sglang_sampler.reset()
    yield {"dispatcher": d, "moe": moe_launch, "argmax": argmax_calls, "recorder": plugin.recorder()}
    dispatch.reset(None)
    plugin.reset()
    sglang_moe.reset()
    sglang_sampler.reset()
