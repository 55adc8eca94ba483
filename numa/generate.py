"""Write the sysfs-mirror topology fixtures in this folder (stdlib only; rerun to regenerate).

Each fixture holds the files Netra's placement reads, at their sysfs paths:
  sys/bus/pci/devices/<bdf>/{vendor,class,numa_node}
  sys/devices/system/node/node<N>/cpulist            (absent on a machine without NUMA information)
  sys/devices/system/cpu/online
  sys/devices/system/cpu/cpu<N>/topology/thread_siblings_list  (or core_id + physical_package_id)
CPU numbering follows Linux on x86 servers: first every core's thread 0, socket by socket, then
every core's thread 1 in the same order (so cpu c and c + cores*sockets are SMT siblings).
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
NVIDIA, AMD, ASPEED, MELLANOX = "0x10de", "0x1002", "0x1a03", "0x15b3"
H200_CLASS, MI350X_CLASS = "0x030200", "0x120000"  # 3D controller; processing accelerator
VGA_CLASS, BRIDGE_CLASS, NIC_CLASS = "0x030000", "0x068000", "0x020700"


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _ranges(cpus: list[int]) -> str:
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def write(name: str, *, sockets: int, cores: int, smt: int, numa: bool, siblings_files: bool,
          pci: list[tuple[str, str, str, int]]) -> None:
    root = HERE / name
    shutil.rmtree(root / "sys", ignore_errors=True)
    total = sockets * cores
    ncpu = total * smt
    _w(root / "sys/devices/system/cpu/online", f"0-{ncpu - 1}")
    node_cpus: dict[int, list[int]] = {s: [] for s in range(sockets)}
    for cpu in range(ncpu):
        core_global = cpu % total
        sock, core = divmod(core_global, cores)
        node_cpus[sock].append(cpu)
        sib = [core_global + t * total for t in range(smt)]
        topo = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        if siblings_files:
            _w(topo / "thread_siblings_list", _ranges(sib))
        else:
            _w(topo / "core_id", str(core))
            _w(topo / "physical_package_id", str(sock))
    if numa:
        for node, cpus in node_cpus.items():
            _w(root / f"sys/devices/system/node/node{node}/cpulist", _ranges(sorted(cpus)))
    for bdf, vendor, klass, node in pci:
        dev = root / "sys/bus/pci/devices" / bdf
        _w(dev / "vendor", vendor)
        _w(dev / "class", klass)
        _w(dev / "numa_node", str(node if numa else -1))


def main() -> None:
    # 8 GPUs: 4 on each socket's PCIe root complexes; a BMC VGA and (NVIDIA) NVSwitches are not GPUs.
    bdfs = ["0000:05:00.0", "0000:15:00.0", "0000:65:00.0", "0000:75:00.0",
            "0000:85:00.0", "0000:95:00.0", "0000:e5:00.0", "0000:f5:00.0"]
    common = [("0000:02:00.0", ASPEED, VGA_CLASS, 0), ("0000:0a:00.0", MELLANOX, NIC_CLASS, 0)]
    write("dual-socket-8x-mi350x", sockets=2, cores=56, smt=2, numa=True, siblings_files=True,
          pci=common + [(b, AMD, MI350X_CLASS, 0 if i < 4 else 1) for i, b in enumerate(bdfs)])
    write("dual-socket-8x-h200", sockets=2, cores=56, smt=2, numa=True, siblings_files=True,
          pci=common + [(b, NVIDIA, H200_CLASS, 0 if i < 4 else 1) for i, b in enumerate(bdfs)]
          + [(f"0000:{0xc0 + k:02x}:00.0", NVIDIA, BRIDGE_CLASS, 1) for k in range(4)])
    write("single-socket-4x-h200", sockets=1, cores=32, smt=2, numa=True, siblings_files=True,
          pci=common + [(b, NVIDIA, H200_CLASS, 0) for b in bdfs[:4]])
    write("no-numa-2x-h200", sockets=1, cores=8, smt=2, numa=False, siblings_files=False,
          pci=[(b, NVIDIA, H200_CLASS, -1) for b in bdfs[:2]])


if __name__ == "__main__":
    main()
