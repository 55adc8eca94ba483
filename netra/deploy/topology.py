"""Node topology from sysfs (GPUs with their NUMA node, CPUs grouped into physical cores), and placement.

`read_topology(root)` reads a sysfs tree: `/` for this machine, or a fixture under `numa/` that mirrors
the same files (`sys/bus/pci/devices/*/{vendor,class,numa_node}`,
`sys/devices/system/node/node*/cpulist`, `sys/devices/system/cpu/cpu*/topology/...`).

`place(topology, vendor, dp)` gives each worker one GPU and an even share of the physical cores of
that GPU's NUMA node, each core with all of its SMT siblings, and memory bound to the same node
(the article: GPUs 0-3 on node 0, 4-7 on node 1, 14 physical cores plus siblings per worker).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# PCI vendor ids of the GPU makers a profile can target.
VENDOR_IDS = {"nvidia": 0x10DE, "amd": 0x1002}
# PCI base classes of a GPU: 0x03 display controllers (VGA 0x0300, 3D 0x0302, other 0x0380) and
# 0x12 processing accelerators (how AMD Instinct boards enumerate). An NVSwitch (bridge, 0x0680) or
# a BMC's VGA from another vendor is not a GPU here.
GPU_BASE_CLASSES = (0x03, 0x12)


class PlacementError(ValueError):
    """The node cannot hold the profile (too few GPUs, unreadable topology); the message says why."""


@dataclass(frozen=True)
class Gpu:
    index: int  # position among this vendor's GPUs in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)
    pci: str
    vendor: str
    numa_node: int | None


@dataclass(frozen=True)
class Core:
    cpus: tuple[int, ...]  # the physical core's logical CPUs (SMT siblings), ascending
    node: int | None


@dataclass(frozen=True)
class Topology:
    source: str
    gpus: tuple[Gpu, ...]
    cores: tuple[Core, ...]
    has_numa: bool

    def gpus_of(self, vendor: str) -> list[Gpu]:
        return [g for g in self.gpus if g.vendor == vendor]

    def describe(self) -> str:
        nodes = sorted({c.node for c in self.cores if c.node is not None})
        smt = max((len(c.cpus) for c in self.cores), default=0)
        gpus = ", ".join(f"{g.vendor}:{g.index}@{g.pci}(node {g.numa_node})" for g in self.gpus) or "none"
        return (f"{self.source}: {len(self.cores)} physical cores x{smt} threads, "
                f"NUMA nodes {nodes or 'unknown'}, GPUs {gpus}")


@dataclass(frozen=True)
class Placement:
    gpu: Gpu | None
    numa_node: int | None
    cpus: tuple[int, ...]
    mem_node: int | None
    physical_cores: int


def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's cpulist format ("0-13,112-125")."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return sorted(set(out))


def format_cpulist(cpus: tuple[int, ...] | list[int]) -> str:
    """The inverse of `parse_cpulist` (compact ranges), as taskset and cgroups write it."""
    items = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_gpus(root: Path) -> tuple[Gpu, ...]:
    devices = root / "sys/bus/pci/devices"
    found: dict[str, list[tuple[str, int | None]]] = defaultdict(list)
    by_id = {v: k for k, v in VENDOR_IDS.items()}
    for dev in sorted(devices.iterdir()) if devices.is_dir() else []:
        vendor_raw, class_raw = _read(dev / "vendor"), _read(dev / "class")
        if vendor_raw is None or class_raw is None:
            continue
        vendor = by_id.get(int(vendor_raw, 16))
        if vendor is None or (int(class_raw, 16) >> 16) not in GPU_BASE_CLASSES:
            continue
        node_raw = _read(dev / "numa_node")
        node = int(node_raw) if node_raw is not None and int(node_raw) >= 0 else None
        found[vendor].append((dev.name, node))
    gpus: list[Gpu] = []
    for vendor, devs in sorted(found.items()):
        gpus.extend(Gpu(i, pci, vendor, node) for i, (pci, node) in enumerate(sorted(devs)))
    return tuple(gpus)


def _read_cores(root: Path, allowed: set[int] | None) -> tuple[tuple[Core, ...], bool]:
    cpu_dir = root / "sys/devices/system/cpu"
    online_raw = _read(cpu_dir / "online")
    if online_raw is not None:
        cpus = parse_cpulist(online_raw)
    else:
        cpus = sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*"))
    if allowed is not None:
        cpus = [c for c in cpus if c in allowed]
    if not cpus:
        raise PlacementError(f"{root}: no CPUs found under {cpu_dir}")
    node_of: dict[int, int] = {}
    node_dir = root / "sys/devices/system/node"
    for nd in sorted(node_dir.glob("node[0-9]*")):
        text = _read(nd / "cpulist")
        if text is not None:
            for c in parse_cpulist(text):
                node_of[c] = int(nd.name[4:])
    has_numa = bool(node_of)
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for c in cpus:
        topo = cpu_dir / f"cpu{c}/topology"
        siblings = _read(topo / "thread_siblings_list") or _read(topo / "core_cpus_list")
        if siblings is not None:
            key: tuple[int, ...] = (0, min(parse_cpulist(siblings)))
        else:
            core_id, pkg = _read(topo / "core_id"), _read(topo / "physical_package_id")
            key = (1, int(pkg), int(core_id)) if core_id is not None and pkg is not None else (2, c)
        groups[key].append(c)
    cores = [Core(tuple(sorted(g)), node_of.get(min(g)) if has_numa else None) for g in groups.values()]
    cores.sort(key=lambda core: core.cpus[0])
    return tuple(cores), has_numa


def read_topology(root: str | Path | None = None) -> Topology:
    """Read a sysfs tree; None means this machine (restricted to the CPUs this process may use)."""
    live = root is None
    base = Path("/") if root is None else Path(root)
    if not live and not (base / "sys").is_dir():
        raise PlacementError(f"topology {base}: no sys/ tree (expected a sysfs mirror as under numa/)")
    allowed = set(os.sched_getaffinity(0)) if live else None
    cores, has_numa = _read_cores(base, allowed)
    return Topology("this machine" if live else str(base), _read_gpus(base), cores, has_numa)


def _split(cores: list[Core], n: int) -> list[list[Core]]:
    """Split cores into n equal consecutive shares; with fewer cores than n, shares are shared."""
    if not cores:
        raise PlacementError("no cores to place workers on")
    if len(cores) < n:
        return [[cores[i % len(cores)]] for i in range(n)]
    share = len(cores) // n  # remainder cores stay free for nginx and the OS
    return [cores[i * share:(i + 1) * share] for i in range(n)]


def _placement(gpu: Gpu | None, cores: list[Core]) -> Placement:
    cpus = tuple(sorted(c for core in cores for c in core.cpus))
    nodes = {core.node for core in cores}
    node = next(iter(nodes)) if len(nodes) == 1 else None
    if gpu is not None and gpu.numa_node is not None:
        node = gpu.numa_node
    return Placement(gpu, node, cpus, node, len(cores))


def place(topology: Topology, vendor: str | None, dp: int) -> list[Placement]:
    """One placement per worker; GPU workers get NUMA-local cores, CPU workers split the machine.

    Memory is bound only on a machine with several NUMA nodes: on one node binding changes nothing,
    and containers often forbid set_mempolicy, which would make a plain laptop launch fail.
    """
    out = _place(topology, vendor, dp)
    if len({c.node for c in topology.cores if c.node is not None}) <= 1:
        out = [Placement(p.gpu, p.numa_node, p.cpus, None, p.physical_cores) for p in out]
    return out


def _place(topology: Topology, vendor: str | None, dp: int) -> list[Placement]:
    if vendor is None:
        return [_placement(None, share) for share in _split(list(topology.cores), dp)]
    gpus = topology.gpus_of(vendor)
    if len(gpus) < dp:
        listed = ", ".join(g.pci for g in gpus) or "none"
        raise PlacementError(f"fewer GPUs than DP: the profile needs {dp} {vendor} GPUs, "
                             f"{topology.source} has {len(gpus)} ({listed})")
    used = gpus[:dp]
    by_node: dict[int | None, list[Gpu]] = defaultdict(list)
    for g in used:
        by_node[g.numa_node if topology.has_numa else None].append(g)
    out: dict[int, Placement] = {}
    for node, node_gpus in by_node.items():
        # A GPU without NUMA information shares the whole machine's cores with the other such GPUs.
        pool = [c for c in topology.cores if node is None or c.node == node]
        if not pool:
            raise PlacementError(f"{topology.source}: NUMA node {node} of GPU {node_gpus[0].pci} has no CPUs")
        for g, share in zip(node_gpus, _split(pool, len(node_gpus)), strict=True):
            out[g.index] = _placement(g, share)
    return [out[g.index] for g in used]
