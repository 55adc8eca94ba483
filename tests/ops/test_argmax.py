"""argmax: the key design against torch.argmax on the CPU (CI), and the sm90 tactic on a GPU."""

from __future__ import annotations

import builtins
import io
import json
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from netra import dispatch
from netra.catalog import Catalog
from netra.dispatch import Dispatcher
from netra.ops import argmax as op
from netra.validate.argmax_cases import (
    BUCKETS,
    SCENARIOS,
    Case,
    adversarial_cases,
    build,
    check_adversarial,
    check_eager_vs_replay,
    chunk_bounds,
    emulate_cluster_kernel,
    emulate_two_stage,
    keys,
)

VOCAB = op.VOCAB


@pytest.fixture
def experiment_dispatch() -> Iterator[Dispatcher]:
    """Dispatch that selects experiment-or-better contracts (the tactic before its promotion)."""
    d = Dispatcher(min_maturity="experiment", disabled=False)
    dispatch.reset(d)
    yield d
    dispatch.reset(None)


# ---- CPU (CI) ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [2])
def test_key_emulation_equals_torch_argmax_on_cpu(dtype: str, rows: int) -> None:
    vec = op.vec_elems(dtype)
    _, chunks = op.launch_shape(rows, VOCAB, dtype, 256, 528)
    bounds = chunk_bounds(VOCAB, vec, chunks)
    assert bounds[0][0] == 0 and bounds[-1][1] == VOCAB and len(bounds) == chunks
    for i, scenario in enumerate(SCENARIOS):
        x = build(Case(scenario, rows, dtype, 11 + i), VOCAB, "cpu", bounds)
        want = torch.argmax(x, dim=-1)
        assert torch.equal(op.argmax_ref(x), want), scenario
        assert torch.equal(emulate_two_stage(x, chunks, vec), want), scenario


def test_keys_order_special_values() -> None:
    vals = torch.tensor([float("-inf"), -1.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, float("inf"), float("nan")])
    k = keys(vals[None, :])[0]
    hi = k >> 32
    assert hi[3] == hi[4]  # -0 == +0
    assert torch.all(hi[[0, 1, 2, 4, 5, 6, 7]].diff() > 0) and hi[8] > hi[7]
    assert k[3] > k[4]  # equal values: the lower index has the larger key


def test_adversarial_set_is_large_and_covers_buckets() -> None:
    cases = adversarial_cases()
    assert len(cases) >= 200
    assert {c.rows for c in cases} == set(BUCKETS)
    assert {c.scenario for c in cases} == set(SCENARIOS)
    assert len({c.name for c in cases}) == len(cases)


def test_params_struct_matches_contracts() -> None:
    cat = Catalog.load()
    for name in ("argmax_f32_v248320", "argmax_bf16_v248320"):
        c = cat.by_name(name)
        assert c.kernel["params_layout"] == op.params_layout(), name
        assert c.workspace["bytes"] >= op.KEYS_BYTES + 4 * op.MAX_ROWS
        assert c.dims["rows"].hi == op.MAX_ROWS
    c = cat.by_name("argmax_f32_cluster_v248320")
    assert op.is_cluster(c) and c.kernel["params_layout"] == op.params_layout(op.ArgmaxClusterParams)
    assert c.workspace["bytes"] == 0


def test_cluster_contract_launch_fits_one_wave_and_smem() -> None:
    """rows x cluster CTAs, one per SM (<= 132), and one CTA's chunk fits its shared-memory ring."""
    c = Catalog.load().by_name("argmax_f32_cluster_v248320")
    cl = int(c.launch["cluster"])
    assert c.launch["pdl"] is True and 1 <= cl <= 8  # portable cluster size
    assert c.dims["rows"].hi * cl <= 132
    chunk_bytes = -(-VOCAB // cl) * 4
    assert chunk_bytes <= c.launch["smem_bytes"] == 8 * 16384  # kSlots x 16 KB: no ring refill
    assert c.launch["smem_bytes"] + 1024 > 113 * 1024  # > half of 227 KB: one CTA per SM
    assert (VOCAB // 4) % cl == 0  # equal chunks, 16-byte aligned


def test_row_ranges_pick_one_tactic_each() -> None:
    """fp32 and bf16 rows 1-256 -> the chunked tactic of their dtype; the cluster tactic is
    rejected (record argmax_h200_v3cluster_2026-11-30) and never chosen, even with experiments on."""
    for rows in range(1, op.MAX_ROWS + 1):
        assert op.contract_for(rows, "float32").name == "argmax_f32_v248320", rows
        assert op.contract_for(rows, "bfloat16").name == "argmax_bf16_v248320"
    assert op.contract_launch_shape(16, "float32") == op.launch_shape(16, VOCAB, "float32", 256, 264)
    d = Dispatcher(min_maturity="experiment", disabled=False)
    from netra.dispatch import plan

    for rows in (1, 2, 16, 17):
        sig = op.explain_signatures()[0][1]
        sig = type(sig)(target="sm90", op="argmax", dims=(("rows", rows), ("vocab", VOCAB)),
                        dtypes=(("x", "float32"),), layouts=(("x", "contiguous_align16"),), graph_phase="capture")
        got = plan(sig, d.catalog, "experiment")
        assert got.contract is not None and got.contract.name == "argmax_f32_v248320", (rows, got.reason)


def test_cluster_emulation_equals_torch_argmax_on_cpu() -> None:
    """The cluster tactic's chunks (1/8 row per CTA) under the key emulation, every scenario."""
    _, chunks = op.contract_launch_shape(3, "float32")
    bounds = chunk_bounds(VOCAB, 4, chunks)
    for i, scenario in enumerate(SCENARIOS):
        x = build(Case(scenario, 3, "float32", 500 + i), VOCAB, "cpu", bounds)
        assert torch.equal(emulate_two_stage(x, chunks, 4), torch.argmax(x, dim=-1)), scenario


def test_launch_shape_fills_and_bounds() -> None:
    for dtype in ("float32", "bfloat16"):
        vec = op.vec_elems(dtype)
        for rows in range(1, 257):
            grid, chunks = op.launch_shape(rows, VOCAB, dtype, 256, 528)
            assert grid == rows * chunks and chunks >= 1
            assert VOCAB // vec // chunks >= 256  # every thread owns at least one 16-byte load
            assert grid <= max(528, rows)


def test_cpu_calls_fall_back_exactly() -> None:
    x = torch.randn(5, 1000)
    x[2, 10] = float("nan")
    assert torch.equal(op.argmax(x), torch.argmax(x, dim=-1))
    out = torch.full((5,), -7, dtype=torch.int64)
    assert op.argmax(x, out=out) is out and torch.equal(out, torch.argmax(x, dim=-1))
    d = dispatch.select(op.signature(x))
    assert d.fallback and "target cpu != sm90" in d.reason
    with pytest.raises(ValueError, match="contiguous int64 tensor of shape"):
        op.argmax(x, out=torch.empty(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="at least one dimension"):
        op.argmax(torch.tensor(1.0))


def test_runtime_without_gpu_raises_clearly() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from netra.runtime import RuntimeBridgeError, load_tactic

    with pytest.raises(RuntimeBridgeError, match="needs a CUDA GPU"):
        load_tactic(Catalog.load().by_name("argmax_f32_v248320"), 0)
    sig = op.explain_signatures()[0][1]
    with pytest.raises(RuntimeBridgeError, match="needs a CUDA GPU"):
        Dispatcher(min_maturity="experiment", disabled=False).select(sig)


# ---- GPU -----------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_adversarial_cases_bitwise(experiment_dispatch: Dispatcher) -> None:
    result = check_adversarial(torch.device("cuda"))
    report = os.environ.get("NETRA_TEST_REPORT_DIR")
    if report:
        pathlib.Path(report, "argmax_adversarial.json").write_text(json.dumps(result, indent=2))
    assert result["adversarial_cases"] >= 200
    assert result["tactic_cases"] == result["adversarial_cases"]  # every case ran the kernel
    assert result["mismatches"] == 0, result["failures"]


@pytest.mark.gpu
def test_eager_equals_graph_replay(experiment_dispatch: Dispatcher) -> None:
    result = check_eager_vs_replay(torch.device("cuda"))
    assert result["eager_equals_replay"], result["replay_failures"]


@pytest.mark.gpu
def test_repeated_launches_leave_workspace_zero(experiment_dispatch: Dispatcher) -> None:
    x = torch.randn(64, VOCAB, device="cuda")
    for _ in range(3):
        assert torch.equal(op.argmax(x), op.argmax_ref(x))
    t = dispatch.select(op.signature(x)).tactic
    torch.cuda.synchronize()
    assert int(t.workspace.count_nonzero()) == 0


class _Trap:
    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, *a: Any, **k: Any) -> Any:
        raise AssertionError(f"launch path touched {self.what}")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 64])
def test_launch_path_invariants(experiment_dispatch: Dispatcher, monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """No allocation, no symbol lookup / driver call but the launch, no file or env access, no sync
    (rows 16 and 64: the chunked tactic, through cuLaunchKernelEx where its contract declares PDL)."""
    import netra.runtime as rt

    x = torch.randn(rows, VOCAB, device="cuda")
    out = torch.full((rows,), -7, dtype=torch.int64, device="cuda")
    op.argmax(x, out=out)  # first call: decision, load, bind
    torch.cuda.synchronize()
    real = rt._state["cu"]

    class DriverSpy:
        launches = 0

        def __getattr__(self, name: str) -> Any:
            if name not in ("cuLaunchKernel", "cuLaunchKernelEx"):
                raise AssertionError(f"launch path called driver {name}")

            def launch(*a: Any) -> Any:
                DriverSpy.launches += 1
                return getattr(real, name)(*a)
            return launch

    class EnvTrap(dict):  # type: ignore[type-arg]
        def __getitem__(self, k: Any) -> Any:
            raise AssertionError(f"launch path read env {k}")

        def get(self, k: Any, d: Any = None) -> Any:
            raise AssertionError(f"launch path read env {k}")

    allocs = torch.cuda.memory_stats()["allocation.all.allocated"]
    monkeypatch.setitem(rt._state, "cu", DriverSpy())
    monkeypatch.setattr(builtins, "open", _Trap("open()"))
    monkeypatch.setattr(io, "open", _Trap("io.open()"))
    monkeypatch.setattr(pathlib.Path, "read_bytes", _Trap("Path.read_bytes"))
    monkeypatch.setattr(pathlib.Path, "read_text", _Trap("Path.read_text"))
    monkeypatch.setattr(os, "environ", EnvTrap())
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        for _ in range(3):
            op.argmax(x, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        monkeypatch.undo()
    assert DriverSpy.launches == 3
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocs  # nothing allocated
    # Graph capture forbids synchronisation and cudaMalloc itself; only the launch reaches the driver.
    monkeypatch.setitem(rt._state, "cu", DriverSpy())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            op.argmax(x, out=out)
    finally:
        monkeypatch.undo()
    assert DriverSpy.launches == 4
    out.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, op.argmax_ref(x))


@pytest.mark.gpu
def test_dispatch_decisions_on_gpu() -> None:
    dispatch.reset(None)
    try:
        x16 = torch.randn(4, VOCAB, device="cuda", dtype=torch.float16)
        d = dispatch.select(op.signature(x16))
        assert d.fallback and "dtype x=float16" in d.reason
        assert torch.equal(op.argmax(x16), torch.argmax(x16, dim=-1))
        odd = torch.randn(4, VOCAB + 8, device="cuda")
        assert dispatch.select(op.signature(odd)).fallback
        for rows in (1, 4, 64):
            x = torch.randn(rows, VOCAB, device="cuda")
            d = dispatch.select(op.signature(x))
            c = op.contract_for(rows, "float32")
            assert (d.tactic is not None) == (c.maturity == "accepted"), d.reason
        unaligned = torch.randn(4 * VOCAB + 1, device="cuda")[1:].view(4, VOCAB)
        d = dispatch.select(op.signature(unaligned))
        assert d.fallback and "layout x=contiguous not in" in d.reason
        assert torch.equal(op.argmax(unaligned), torch.argmax(unaligned, dim=-1))
    finally:
        dispatch.reset(None)


@pytest.mark.parametrize("cluster", [8, 2])
def test_cluster_kernel_thread_emulation_equals_torch_argmax_on_cpu(cluster: int) -> None:
    """The cluster kernel's per-thread algorithm (pieces, lanes, batch filter, select chains, the
    fold), emulated on the CPU: cluster 8 as the contract launches it, cluster 2 the ring-refill path."""
    scenarios = SCENARIOS if cluster == 8 else ("random", "tie_piece_boundary", "several_nans", "increasing",
                                                "signed_zero_neg_first", "subnormal_tie", "all_nan", "all_neg_inf")
    bounds = chunk_bounds(VOCAB, 4, cluster)
    for i, scenario in enumerate(scenarios):
        x = build(Case(scenario, 2, "float32", 900 + i), VOCAB, "cpu", bounds)
        assert torch.equal(emulate_cluster_kernel(x, cluster), torch.argmax(x, dim=-1)), scenario
