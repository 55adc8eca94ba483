"""Worker audit, after a worker is healthy and before any traffic reaches it.

The article's DP8 run was silently invalid because a wrapper dropped the engine options. So the
launcher does not trust what it asked for; it reads back what each worker actually runs with:
- its command line (`/proc/<pid>/cmdline`) and environment (`/proc/<pid>/environ`);
- its CPU set (`/proc/<pid>/status` Cpus_allowed_list) and memory policy (`/proc/<pid>/numa_maps`);
- the effective engine options it reports at `GET /server_info`;
- the locked code objects mapped into its memory (`/proc/<pid>/maps`, the process and its children);
- for an SGLang worker whose profile enables tactics, what Netra's plugin reports from inside it
  (`netra.plugins.evidence`): the plugin loaded, its hooks applied, and every code object it loaded
  equal (sha256) to the kernel lock's.
Any mismatch is a problem naming the worker and the option or artifact; the launch stops.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from netra.deploy.plan import WorkerPlan
from netra.deploy.topology import format_cpulist, parse_cpulist

_MISSING = object()


def proc_cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else []


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, val = item.partition(b"=")
            out[k.decode("utf-8", "replace")] = val.decode("utf-8", "replace")
    return out


def proc_cpus(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpulist(line.split(":", 1)[1])
    return []


def _children_by_ppid() -> dict[int, list[int]]:
    """Every process's children, from /proc/*/stat (kernels without /proc/PID/task/TID/children)."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(stat.parent.name))
    return kids


def proc_tree(pid: int) -> list[int]:
    """The process and all its descendants (SGLang runs its scheduler in a child process)."""
    has_children_files = Path(f"/proc/{pid}/task/{pid}/children").exists()
    by_ppid = {} if has_children_files else _children_by_ppid()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        if not has_children_files:
            todo.extend(by_ppid.get(p, []))
            continue
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return out


def mapped_files(pids: Iterable[int]) -> set[str]:
    files: set[str] = set()
    for p in pids:
        try:
            text = Path(f"/proc/{p}/maps").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                files.add(parts[5].removesuffix(" (deleted)"))
    return files


def mem_policies(pid: int) -> set[str]:
    try:
        lines = Path(f"/proc/{pid}/numa_maps").read_text().splitlines()
    except OSError:
        return set()
    return {line.split()[1] for line in lines if len(line.split()) > 1}


def find_option(info: Any, key: str) -> Any:
    """`key` at the top level of /server_info, or inside a nested section (SGLang groups its fields)."""
    if isinstance(info, dict):
        if key in info:
            return info[key]
        for value in info.values():
            found = find_option(value, key)
            if found is not _MISSING:
                return found
    elif isinstance(info, list):
        for value in info:
            found = find_option(value, key)
            if found is not _MISSING:
                return found
    return _MISSING


def same_value(want: Any, got: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got or (isinstance(got, str) and got.lower() == str(want).lower())
    if isinstance(want, int | float) and isinstance(got, int | float):
        return math.isclose(float(want), float(got), rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, list | tuple) and isinstance(got, list | tuple):
        return len(want) == len(got) and all(same_value(a, b) for a, b in zip(want, got, strict=True))
    if isinstance(want, int | float) and isinstance(got, str):
        try:
            return same_value(want, float(got))
        except ValueError:
            return False
    return bool(want == got)


def audit_options(w: WorkerPlan, server_info: dict[str, Any]) -> list[str]:
    problems = []
    for key, want in sorted(w.engine_expect.items()):
        got = find_option(server_info, key)
        if got is _MISSING:
            problems.append(f"engine option {key} did not reach worker {w.index}: /server_info does not "
                            f"report it (the plan sets {want!r})")
        elif not same_value(want, got):
            problems.append(f"engine option {key} did not reach worker {w.index}: the plan sets {want!r}, "
                            f"the worker runs with {got!r}")
    return problems


def audit_process(w: WorkerPlan, pid: int, argv: list[str], env: dict[str, str]) -> list[str]:
    """Compare a running worker process with what the launcher started (argv/env as executed)."""
    problems = []
    try:
        cmdline = proc_cmdline(pid)
        environ = proc_environ(pid)
        cpus = proc_cpus(pid)
    except OSError as exc:
        return [f"worker {w.index} (pid {pid}) cannot be audited: {exc}"]
    if cmdline != argv:
        missing = [a for a in argv if a not in cmdline]
        problems.append(f"worker {w.index} (pid {pid}) runs a different command line than planned"
                        f" (missing {missing[:6]}): {' '.join(cmdline)[:300]}")
    for key, want in sorted(env.items()):
        got = environ.get(key)
        if got != want:
            problems.append(f"environment {key} did not reach worker {w.index}: the plan sets {want!r}, "
                            f"the worker has {got!r}")
    if sorted(cpus) != sorted(w.cpus):
        problems.append(f"worker {w.index} (pid {pid}) CPU set is {format_cpulist(cpus)}, the plan says "
                        f"{w.cpulist}")
    if w.mem_node is not None:
        policies = mem_policies(pid)
        if policies and f"bind:{w.mem_node}" not in policies:
            problems.append(f"worker {w.index} (pid {pid}) memory is not bound to NUMA node {w.mem_node} "
                            f"(policies {sorted(policies)})")
    return problems


def audit_code_objects(w: WorkerPlan, pid: int, server_info: dict[str, Any],
                       code_objects: Iterable[dict[str, str]]) -> list[str]:
    """Each locked code object must be mapped in the worker's process tree (`/proc/PID/maps`), or be
    reported loaded with the same sha256 at /server_info `code_objects` (a runtime that loads the image
    from memory, as cuModuleLoadData does, leaves no file mapping)."""
    wanted = list(code_objects)
    if not wanted:
        return []
    mapped = mapped_files(proc_tree(pid))
    reported = find_option(server_info, "code_objects")
    loaded: set[str] = set()
    if isinstance(reported, list):
        for item in reported:
            if isinstance(item, dict):
                loaded.update(str(item.get(k)) for k in ("sha256", "path") if item.get(k))
            else:
                loaded.add(str(item))
    problems = []
    for obj in wanted:
        if obj["path"] in mapped or obj["sha256"] in loaded:
            continue
        problems.append(f"code object {obj['path']} ({obj.get('family')}/{obj.get('name')}) is neither mapped "
                        f"in worker {w.index} (pid {pid} and its children) nor reported loaded at /server_info")
    return problems


def audit_plugin(w: WorkerPlan, pid: int, code_objects: Iterable[dict[str, str]]) -> tuple[list[str], list[str]]:
    """(problems, warnings) for an SGLang worker whose plan enables tactic domains (``w.tactics``).

    Reads the evidence that the plugin wrote in ``w.plugin_evidence`` from live processes of the
    worker (pid and start time checked, so files left by an earlier run do not count). Problems: no
    such evidence (the plugin did not load), a plugin error, an enabled hook not applied in any
    process, a loaded code object that the kernel lock does not list or whose sha256 differs from it.
    Warning: an enabled domain that loaded no code object (every call so far went to SGLang's original;
    the evidence's miss reasons say why).
    """
    if not w.tactics:
        return [], []
    from netra.deploy.record import proc_start_ticks
    from netra.plugins import evidence
    from netra.plugins.sglang import DOMAINS, ENTRY_POINT

    label = f"worker {w.index} (pid {pid})"
    where = Path(str(w.plugin_evidence))
    tree = set(proc_tree(pid))
    records = [r for r in evidence.read(where)
               if r.get("pid") in tree and r.get("ticks") == proc_start_ticks(int(r["pid"]))]
    if not records:
        return [f"{label} enables tactics {', '.join(w.tactics)} but did not load the SGLang plugin {ENTRY_POINT}: "
                f"no process of the worker wrote evidence to {where} (netra must be installed in the worker's "
                f"environment with its sglang.srt.plugins entry point, and SGLANG_PLUGINS={ENTRY_POINT})"], []
    problems = [f"{label}: plugin {ENTRY_POINT} in pid {r['pid']} reports an error: {r['error']}"
                for r in records if r.get("error")]
    for d in w.tactics:
        hooks = [r.get("hooks", {}).get(d, {}) for r in records]
        if not any(h.get("registered") for h in hooks):
            problems.append(f"{label}: plugin {ENTRY_POINT} did not register its {d} hook ({DOMAINS[d].target})")
        elif not any(h.get("applied") for h in hooks):
            notes = sorted({str(h["note"]) for h in hooks if h.get("note")})
            problems.append(f"{label}: plugin {ENTRY_POINT}'s {d} hook on {DOMAINS[d].target} was registered but "
                            f"applied in no process{': ' + '; '.join(notes) if notes else ''}")
    locked = {o["name"]: o for o in code_objects}
    loaded = [t for r in records for t in r.get("tactics", [])]
    for t in loaded:
        entry = locked.get(t["name"])
        if entry is None:
            problems.append(f"{label} loaded code object {t['name']} ({t.get('family')}, sha256 "
                            f"{str(t['sha256'])[:16]}...) that the kernel lock does not list")
        elif entry["sha256"] != t["sha256"]:
            problems.append(f"{label} loaded code object {entry['path']} ({entry.get('family')}/{t['name']}) with "
                            f"sha256 {str(t['sha256'])[:16]}..., the kernel lock says {entry['sha256'][:16]}...")
    warnings = []
    ops = {t.get("op") for t in loaded}
    for d in w.tactics:
        if DOMAINS[d].op not in ops:
            reasons: dict[str, int] = {}
            for r in records:
                for why, n in r.get("counts", {}).get(d, {}).get("miss_reasons", {}).items():
                    reasons[why] = reasons.get(why, 0) + int(n)
            top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
            warnings.append(f"{label}: tactic domain {d} loaded no {DOMAINS[d].op} code object yet "
                            f"(SGLang's original ran{': ' + '; '.join(f'{n}x {why}' for why, n in top) if top else ''})")
    return problems, warnings
