"""SGLang 0.5.23's ``sglang.srt.plugins`` entry point ``netra`` (pyproject.toml): Netra's tactics inside
every SGLang process.

SGLang runs `register` through ``load_plugins()`` in ``launch_server``, in ``Engine.__init__`` and in
its scheduler (the GPU worker, started with spawn), then ``HookRegistry.apply_hooks()`` patches each
registered target. `register` reads which tactic domains the profile enables from
``NETRA_SGLANG_TACTICS`` (the launcher renders it with ``SGLANG_PLUGINS=netra``; unset or empty: no
hook) and registers one AROUND hook per domain (`DOMAINS`):

* ``moe``: ``fused_experts`` of SGLang's Triton MoE runner (rendered with ``--moe-runner-backend
  triton`` so that this is the path the worker takes): Netra op ``moe_fp8_routed``
  (`netra.plugins.sglang_moe`);
* ``argmax``: ``Sampler.forward``'s all-greedy branch: Netra op ``argmax``
  (`netra.plugins.sglang_sampler`).

Each hook receives ``(original, *args, **kwargs)``. Its guard looks only at shapes, dtypes, strides,
devices and the call's configuration flags, never at values (decode runs inside captured CUDA graphs,
so the hook runs once per captured batch size); then it asks `netra.dispatch.select` with the same
`Signature` the embedded engine builds: accepted tactics only, exact match, each distinct reason
logged once. Anything else calls SGLang's original. Tactics load and workspaces are allocated on the
first eager call of a hook (`prepare`), never inside a capture: a first call made while the stream
captures runs the original and says so.

What happened is evidence (`netra.plugins.evidence`): hooks applied, code objects loaded (name +
sha256), hits and misses with reasons, in ``$NETRA_PLUGIN_EVIDENCE/<pid>.json``; the launcher's
audit refuses a worker without it (netra/deploy/audit.py).

Importing this module imports neither torch nor SGLang (the launcher reads `DOMAINS` from it).
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netra.plugins import evidence

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT = "netra"  # the name SGLANG_PLUGINS whitelists
# SGLANG_PLUGINS when a profile enables no domain: a whitelist naming no installed plugin, so
# SGLang loads none (an empty value would load every installed plugin).
PLUGINS_OFF = "none"
TACTICS_ENV = "NETRA_SGLANG_TACTICS"
EVIDENCE_ENV = "NETRA_PLUGIN_EVIDENCE"
# How long the application watcher waits for SGLang's apply_hooks() after register() returned.
APPLY_WAIT_S = 120.0


@dataclass(frozen=True)
class Domain:
    """One tactic domain a profile can enable: the SGLang function hooked and the Netra op asked."""

    name: str
    op: str  # the Netra op dispatch decides for
    target: str  # dotted SGLang 0.5.23 target (module path, then attribute path)
    module: str  # the Netra module holding `hook` (and the facts the CPU tests check)
    # SGLang options rendered with the domain so that the hooked function is the one the worker runs.
    sglang_options: tuple[tuple[str, str, str], ...] = ()  # (flag, ServerArgs dest, value)

    def hook(self) -> Callable[..., Any]:
        fn: Callable[..., Any] = importlib.import_module(self.module).hook
        return fn


DOMAINS: dict[str, Domain] = {
    d.name: d for d in (
        Domain("moe", "moe_fp8_routed", "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe.fused_experts",
               "netra.plugins.sglang_moe", (("--moe-runner-backend", "moe_runner_backend", "triton"),)),
        Domain("argmax", "argmax", "sglang.srt.layers.sampler.Sampler.forward", "netra.plugins.sglang_sampler"),
    )
}


class PluginConfigError(ValueError):
    pass


def parse_domains(raw: str | None) -> tuple[str, ...]:
    """``"moe,argmax"`` -> ("moe", "argmax") in `DOMAINS` order; unknown names are an error."""
    names = [n.strip() for n in (raw or "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(DOMAINS))
    if unknown:
        raise PluginConfigError(f"{TACTICS_ENV}={raw!r}: unknown tactic domain(s) {unknown}; known: {list(DOMAINS)}")
    return tuple(d for d in DOMAINS if d in names)


def enabled(tactics: str | tuple[str, ...]) -> tuple[str, ...]:
    """A profile's ``engine.tactics`` as domains in `DOMAINS` order (``"none"``: no domain)."""
    return () if tactics == "none" else parse_domains(",".join(tactics))


def worker_env(tactics: str | tuple[str, ...], evidence_dir: str | None) -> dict[str, str]:
    """What an SGLang worker's environment carries for the plugin: whitelisted with its domains and
    evidence directory, or left out through ``SGLANG_PLUGINS``."""
    domains = enabled(tactics)
    if not domains:
        return {"SGLANG_PLUGINS": PLUGINS_OFF}
    if not evidence_dir:
        raise PluginConfigError(f"tactics {list(domains)}: the worker needs an evidence directory")
    return {"SGLANG_PLUGINS": ENTRY_POINT, TACTICS_ENV: ",".join(domains), EVIDENCE_ENV: evidence_dir}


def selectable(domain: str, target: str, catalog: Any = None) -> list[str]:
    """Contracts of ``target`` that dispatch may select for the domain's op (built, not rejected, at or
    above the minimum maturity): what the plugin can load in a worker."""
    from netra import settings
    from netra.catalog import Catalog, maturity_rank

    cat = catalog if catalog is not None else Catalog.load()
    floor = maturity_rank(settings.get("NETRA_TACTIC_MIN_MATURITY"))
    return [c.name for c in cat.for_op(DOMAINS[domain].op) if c.target == target and not c.declaration
            and c.maturity != "rejected" and maturity_rank(c.maturity) >= floor]


def describe(domains: tuple[str, ...], target: str) -> list[str]:
    """Per domain, what the plugin hooks and which contracts of ``target`` dispatch can choose from."""
    from netra.catalog import Catalog

    catalog = Catalog.load()
    out = []
    for name in domains:
        d = DOMAINS[name]
        names = selectable(name, target, catalog)
        out.append(f"{name}: op {d.op} at {d.target} ({', '.join(names) or f'no {target} contract selectable'})")
    return out


# --- per-process state -----------------------------------------------------------------------------

_state: dict[str, Any] = {}


def recorder() -> evidence.Recorder:
    """This process's recorder (made by `register`; a bare in-memory one for direct use and tests)."""
    rec = _state.get("recorder")
    if rec is None:
        rec = _state["recorder"] = evidence.Recorder(tuple(DOMAINS), None)
    return rec


def reset() -> None:
    """Forget this process's plugin state (tests)."""
    _state.clear()


def register() -> None:
    """The entry point SGLang calls: register one AROUND hook per enabled domain."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from netra import settings

    raw: str = settings.get(TACTICS_ENV)
    where: Path | None = settings.get(EVIDENCE_ENV)
    try:
        domains = parse_domains(raw)
    except PluginConfigError as exc:
        rec = _state["recorder"] = evidence.Recorder((), where)
        rec.fail(str(exc))
        raise
    rec = _state["recorder"] = evidence.Recorder(domains, where)
    if not domains:
        evidence.log.info("netra plugin: %s is empty; no hooks registered", TACTICS_ENV)
        rec.flush(force=True)
        return
    hooks: dict[str, Callable[..., Any]] = {}
    for name in domains:
        d = DOMAINS[name]
        hooks[name] = d.hook()
        HookRegistry.register(d.target, hooks[name], HookType.AROUND)
        rec.hook(name, target=d.target, type="around", op=d.op, registered=True, applied=False)
    # load_plugins() applies the hooks right after every plugin has registered; watch for it here
    # (calling apply_hooks() from a plugin would skip later plugins' hooks on the same targets).
    threading.Thread(target=_watch_application, args=(rec, hooks), name="netra-plugin-apply",
                     daemon=True).start()


def _watch_application(rec: evidence.Recorder, hooks: Mapping[str, Callable[..., Any]],
                       wait_s: float = APPLY_WAIT_S, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + wait_s
    pending = dict(hooks)
    while pending:
        for name, fn in list(pending.items()):
            if installed(DOMAINS[name].target, fn):
                rec.hook(name, applied=True)
                del pending[name]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    for name in pending:
        rec.hook(name, applied=False, note=f"not applied within {wait_s:.0f} s of registration "
                                           f"(HookRegistry.apply_hooks failed to resolve the target?)")


def resolve_loaded(target: str) -> tuple[Any, str] | None:
    """(owner object, attribute name) of a dotted target whose module is already imported, else None
    (nothing is imported here: SGLang's apply_hooks imports the module when it patches it)."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        owner: Any = module
        for attr in parts[cut:-1]:
            owner = getattr(owner, attr, None)
            if owner is None:
                return None
        return owner, parts[-1]
    return None


def installed(target: str, hook: Callable[..., Any]) -> bool:
    """Whether the attribute at ``target`` is now a wrapper chain that calls ``hook`` (SGLang's AROUND
    wrapper holds the hook in its closure and the wrapped function in ``__wrapped__``)."""
    found = resolve_loaded(target)
    if found is None:
        return False
    owner, attr = found
    fn = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    fn = getattr(fn, "__func__", fn)  # classmethod / staticmethod
    seen = 0
    while fn is not None and seen < 16:
        code = getattr(fn, "__code__", None)
        cells = dict(zip(code.co_freevars, fn.__closure__ or (), strict=True)) if code is not None else {}
        cell = cells.get("hook")  # sglang.srt.plugins.hook_registry._wrap_fn's wrappers close over `hook`
        try:
            if cell is not None and cell.cell_contents is hook:
                return True
        except ValueError:  # an empty cell
            pass
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return False


# --- helpers the hooks share -------------------------------------------------------------------------

REQUIRED = object()


def bind_call(params: tuple[tuple[str, Any], ...], args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> dict[str, Any] | str:
    """The call's arguments by name (defaults filled in), or why they cannot be bound."""
    if len(args) > len(params):
        return f"{len(args)} positional arguments, the pinned signature has {len(params)}"
    call = {name: default for name, default in params}
    names = [name for name, _ in params]
    call.update(zip(names, args, strict=False))
    for key, value in kwargs.items():
        if key not in call:
            return f"unknown argument {key!r} (not in the pinned SGLang signature)"
        call[key] = value
    missing = [k for k, v in call.items() if v is REQUIRED]
    if missing:
        return f"missing argument(s) {missing}"
    return call


def capturing() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def launcher(op: str) -> Callable[..., Any]:
    """The launcher the kernel side bound for ``op`` (`netra.ops._common.bind`); selecting a tactic
    with none bound is a broken deployment, raised, never a silent fallback."""
    from netra.ops import _common

    fn = _common._launchers.get(op)
    if fn is None:
        raise _common.TacticBindingError(f"dispatch selected a tactic for op {op!r} but no launcher is bound "
                                         f"(netra.ops._common.bind({op!r}, ...))")
    return fn


# --- the image's build-time check ---------------------------------------------------------------------


def check_install() -> str:
    """That SGLang's own discovery finds this entry point and loads `register`, and every domain's hook
    module imports: the check images/sglang-sm90.Dockerfile runs at build time (SGLANG_PLUGINS unset)."""
    from importlib.metadata import entry_points

    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    if GENERAL_PLUGINS_GROUP != ENTRY_POINT_GROUP:
        raise PluginConfigError(f"SGLang's general plugin group is {GENERAL_PLUGINS_GROUP!r}, not {ENTRY_POINT_GROUP!r}")
    ours = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ENTRY_POINT]
    if len(ours) != 1:
        raise PluginConfigError(f"{len(ours)} entry points named {ENTRY_POINT!r} in group {ENTRY_POINT_GROUP} "
                                f"(is netra installed with pip, pyproject.toml's entry point included?)")
    found = load_plugins_by_group(ENTRY_POINT_GROUP)
    if found.get(ENTRY_POINT, (None, None))[0] is not register:
        raise PluginConfigError(f"SGLang's load_plugins_by_group did not load netra.plugins.sglang:register "
                                f"(found {sorted(found)})")
    hooks = [f"{d.name} -> {d.hook().__module__}.hook at {d.target}" for d in DOMAINS.values()]
    return f"SGLang plugin {ENTRY_POINT} ({ours[0].value}, dist {found[ENTRY_POINT][1]}): " + "; ".join(hooks)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m netra.plugins.sglang", description=check_install.__doc__)
    ap.add_argument("--check-install", action="store_true", required=True)
    ap.parse_args()
    from netra.plugins import sglang as installed_module  # the module the entry point loads, not __main__

    print(installed_module.check_install())
