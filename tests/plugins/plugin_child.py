"""Child process for tests/plugins/test_entry_point.py: SGLang 0.5.23's own plugin loader, run on the CPU.

  python plugin_child.py load    load_plugins() with the real hook targets (they cannot import on a CPU,
                                 so SGLang's apply_hooks logs and skips them): what was registered
  python plugin_child.py check   netra.plugins.sglang.check_install() (what the sm90 image's build runs)
  python plugin_child.py apply   the two target modules stand in (same dotted names, functions with the
                                 pinned signatures) so apply_hooks patches them; then one call through
                                 each patched target that the guards send to the original

Prints one JSON object. The environment (SGLANG_PLUGINS, NETRA_SGLANG_TACTICS, NETRA_PLUGIN_EVIDENCE)
comes from the test.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import types
from typing import Any

from netra.deploy.sglang import import_shims

MOE_MODULES = ("sglang.srt.layers.moe", "sglang.srt.layers.moe.moe_runner",
               "sglang.srt.layers.moe.moe_runner.triton_utils",
               "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe")

STANDIN_SRC = '''
def fused_experts(hidden_states, w1, w2, topk_output, moe_runner_config, b1=None, b2=None, use_fp8_w8a8=False,
                  use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                  w1_scale=None, w2_scale=None, w1_zp=None, w2_zp=None, a1_scale=None, a2_scale=None,
                  block_shape=None, a1_q=None, fuse_swiglu_interleaved=False):
    return "sglang fused_experts"


class Sampler:
    def forward(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs,
                positions, *, logprob_logits=None):
        return "sglang Sampler.forward"
'''


def standins() -> None:
    ns: dict[str, Any] = {}
    exec(STANDIN_SRC, ns)
    for name in MOE_MODULES:
        sys.modules[name] = types.ModuleType(name)
    sys.modules[MOE_MODULES[-1]].fused_experts = ns["fused_experts"]  # type: ignore[attr-defined]
    sampler = types.ModuleType("sglang.srt.layers.sampler")
    sampler.Sampler = ns["Sampler"]  # type: ignore[attr-defined]
    sampler.Sampler.__module__ = sampler.__name__
    sys.modules[sampler.__name__] = sampler


def main() -> int:
    mode = sys.argv[1]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    import_shims()
    if mode == "check":
        from netra.plugins import sglang as plugin

        print(json.dumps({"check": plugin.check_install()}))
        return 0
    if mode == "apply":
        standins()
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    load_plugins()
    hooks = {target: [[ht.value, f"{h.__module__}.{h.__qualname__}", src.plugin_name if src else None,
                       src.dist_name if src else None] for ht, h, src in entries]
             for target, entries in HookRegistry._hooks.items()}
    out: dict[str, Any] = {"hooks": hooks, "patched": sorted(HookRegistry._patched)}
    if mode == "apply":
        from netra.plugins import sglang as plugin

        rec = plugin.recorder()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(h.get("applied") for h in rec.hooks.values()):
            time.sleep(0.05)
        fused = sys.modules[MOE_MODULES[-1]].fused_experts
        sampler = sys.modules["sglang.srt.layers.sampler"].Sampler()
        greedy_off = types.SimpleNamespace(is_all_greedy=False)
        out["calls"] = [fused("x", "w1", "w2", None, None),
                        sampler.forward(None, greedy_off, False, [], [], None)]
        out["evidence"] = rec.snapshot()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
