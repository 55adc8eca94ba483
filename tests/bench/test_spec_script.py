"""The GDN verify/commit spec's smoke path (netra/bench/specs/gdn_replay.py) through the harness
(``python -m netra.bench.harness gdn_replay --smoke``): its checks on the CPU under Triton's interpreter, on tiny
shapes (two value heads on one key head, head dims 64, C = 256, T = 3), one case per verify and commit contract:
outputs poisoned, bitwise against the decode kernels looped (the contracts' numerics), within a bf16 ulp of the
PyTorch reference (relative L2), pools read only (verify) / untouched outside the batch (commit), pad rows and count-0
rows. No graphs, timing or peers (those need the GPU)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.triton_interp


def test_gdn_replay_smoke_runs_the_checks(smoke_record) -> None:  # type: ignore[no-untyped-def]
    record = smoke_record("gdn_replay")
    cases = record["checks"]["by_case"]  # type: ignore[index]
    assert {k.split()[0] for k in cases} == {f"gdn_{op}_{v}_hv32" for op in ("verify", "commit")
                                             for v in ("f32_small", "f32", "bf16")}
    for key, case in cases.items():
        assert case["torch_ref"]["ok"] and case["torch_ref"]["policy"] == "rel_l2", key
        looped = case["decode_kernels_looped"]
        for c in ([looped] if "verify" in key else looped.values()):
            assert c["ok"] and c["policy"] == "bitwise", key
        if "verify" in key:
            assert case["pools_unchanged"] and case["pad_rows_zero"] and case["no_nan"], key
        else:
            assert case["untouched_bitwise"], key
