from __future__ import annotations

import os
from pathlib import Path

import pytest

from netra.deploy.topology import (
    PlacementError,
    format_cpulist,
    parse_cpulist,
    place,
    read_topology,
)
from netra.settings import REPO_ROOT

NUMA = REPO_ROOT / "numa"


def fixture_cpulist(name: str, node: int) -> set[int]:
    return set(parse_cpulist((NUMA / name / f"sys/devices/system/node/node{node}/cpulist").read_text()))


def test_cpulist_round_trip() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert parse_cpulist("") == [] and format_cpulist([]) == ""
    for text in ("0", "0-13,112-125", "1,3,5", "98-111,210-223"):
        assert format_cpulist(parse_cpulist(text)) == text


@pytest.mark.parametrize("name,vendor", [("dual-socket-8x-mi350x", "amd"), ("dual-socket-8x-h200", "nvidia")])
def test_dual_socket_article_placement(name: str, vendor: str) -> None:
    topo = read_topology(NUMA / name)
    # Only the 8 GPUs: the BMC's VGA (ASPEED), the NIC and the NVSwitches (bridge class) are not GPUs.
    assert [g.index for g in topo.gpus] == list(range(8)) and {g.vendor for g in topo.gpus} == {vendor}
    places = place(topo, vendor, 8)
    node_cpus = {n: fixture_cpulist(name, n) for n in (0, 1)}
    seen: set[int] = set()
    for k, p in enumerate(places):
        assert p.gpu is not None and p.gpu.index == k
        node = 0 if k < 4 else 1
        assert p.numa_node == node and p.mem_node == node
        # Reference (plain arithmetic on the fixture's numbering): worker k owns physical cores
        # 14k..14k+13 and their SMT siblings 112 apart.
        expect = {c for c in range(14 * k, 14 * k + 14)} | {c + 112 for c in range(14 * k, 14 * k + 14)}
        assert set(p.cpus) == expect and p.physical_cores == 14
        assert set(p.cpus) <= node_cpus[node]
        assert not (set(p.cpus) & seen)
        seen |= set(p.cpus)
    assert len(seen) == 224


def test_single_socket_and_partial_use() -> None:
    topo = read_topology(NUMA / "single-socket-4x-h200")
    places = place(topo, "nvidia", 4)
    for k, p in enumerate(places):
        assert set(p.cpus) == set(range(8 * k, 8 * k + 8)) | set(range(32 + 8 * k, 32 + 8 * k + 8))
        assert p.numa_node == 0 and p.mem_node is None  # one node: nothing to bind
    # Two workers on a 4-GPU node: GPUs 0 and 1, each with half of the node's cores.
    two = place(topo, "nvidia", 2)
    assert [p.gpu.index for p in two if p.gpu] == [0, 1] and [p.physical_cores for p in two] == [16, 16]


def test_no_numa_information_falls_back_to_core_ids() -> None:
    topo = read_topology(NUMA / "no-numa-2x-h200")
    assert not topo.has_numa and all(g.numa_node is None for g in topo.gpus)
    places = place(topo, "nvidia", 2)
    # core_id + physical_package_id group cpu c with c + 8 (no thread_siblings_list in this fixture).
    assert set(places[0].cpus) == {0, 1, 2, 3, 8, 9, 10, 11}
    assert set(places[1].cpus) == {4, 5, 6, 7, 12, 13, 14, 15}
    assert places[0].numa_node is None and places[0].mem_node is None


def test_refuses_more_workers_than_gpus() -> None:
    with pytest.raises(PlacementError, match=r"fewer GPUs than DP: the profile needs 8 nvidia GPUs, .* has 4"):
        place(read_topology(NUMA / "single-socket-4x-h200"), "nvidia", 8)
    with pytest.raises(PlacementError, match=r"needs 1 nvidia GPUs, .* has 0"):
        place(read_topology(NUMA / "dual-socket-8x-mi350x"), "nvidia", 1)
    with pytest.raises(PlacementError, match="no sys/ tree"):
        read_topology(NUMA)


def test_cpu_workers_split_and_share() -> None:
    topo = read_topology(NUMA / "single-socket-4x-h200")
    two = place(topo, None, 2)
    assert set(two[0].cpus) == set(range(16)) | set(range(32, 48)) and two[0].gpu is None
    # More workers than cores: workers share cores round robin rather than failing.
    tiny = read_topology(NUMA / "no-numa-2x-h200")
    many = place(tiny, None, 10)
    assert [p.cpus for p in many[:2]] == [(0, 8), (1, 9)] and many[8].cpus == (0, 8)


def test_this_machine() -> None:
    topo = read_topology()
    allowed = os.sched_getaffinity(0)
    cpus = {c for core in topo.cores for c in core.cpus}
    assert cpus == allowed
    places = place(topo, None, 2)
    assert all(set(p.cpus) <= allowed and p.cpus for p in places)


def test_fixtures_are_reproducible(tmp_path: Path) -> None:
    """numa/generate.py regenerates exactly the committed files."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("numa_generate", NUMA / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.HERE = tmp_path
    mod.main()
    for name in ("dual-socket-8x-mi350x", "dual-socket-8x-h200", "single-socket-4x-h200", "no-numa-2x-h200"):
        ours = sorted(p.relative_to(tmp_path / name) for p in (tmp_path / name).rglob("*") if p.is_file())
        committed = sorted(p.relative_to(NUMA / name) for p in (NUMA / name).rglob("*") if p.is_file())
        assert ours == committed
        assert all((tmp_path / name / f).read_text() == (NUMA / name / f).read_text() for f in ours)
