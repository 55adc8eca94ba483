"""LEGACY (issue 7's harness, netra/bench/kernels_moe.py at c78ce29; goes with it): SGLang 0.5.23's
Triton fused-MoE kernels with Triton stand-ins for its JIT CUDA helpers. The peer that runs SGLang's
real pipeline is ``netra/bench/peers/sglang_moe.py``; ``make sglang-peer`` stages this one's files too.

SGLang 0.5.23's tuned Triton fused-MoE pipeline, loaded from the pinned wheel's own files.

The peer runs SGLang's kernels unchanged: ``fused_moe_kernel`` (both GEMMs, with the wheel's tuned
H200 configs for E=256, N=512, fp8_w8a8, block [128, 128]), ``_per_token_group_quant_8bit``
(Triton group quant), ``act_and_mul_triton``, ``moe_sum_reduce_triton`` and, for at most 64 routes,
``moe_align_small_numel`` (SGLang's own choice there). Only the kernel files are loaded; every other
``sglang.*`` / ``sgl_kernel`` import resolves to a stub module (platform probes answer "CUDA,
sm90", flags answer their defaults, anything else is a function that raises when called), so no
server code runs. The stubs used are listed in ``PEER_NOTES``.

Differences from a production SGLang process (all recorded with each measurement):
  * SGLang's JIT CUDA helpers (align for > 64 routes, silu_and_mul, the CUDA group quant,
    moe_sum_reduce) need ``apache-tvm-ffi`` builds at run time; the peer uses SGLang's pure-Triton
    equivalents instead, which SGLang itself uses on non-CUDA paths.
  * for > 64 routes the align step is computed once outside the timed region (SGLang's align there
    is a CUDA kernel not loadable here), so the peer is timed with one launch fewer than SGLang runs:
    this favours the peer.
  * the down GEMM runs the tuned tile config without its ``USE_TMA`` flag (the TMA variant needs the
    sorted JIT quant).

``SGLANG_ROOT`` is the folder holding the ``sglang`` package (the installed wheel here; on the GPU
machine a carried copy of just the needed files, see scripts/gpu/moe_h200.sh).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

REAL_MODULES = {
    "sglang.kernels.ops.moe.fused_moe_triton_kernels": "sglang/kernels/ops/moe/fused_moe_triton_kernels.py",
    "sglang.kernels.ops.quantization.fp8_kernel": "sglang/kernels/ops/quantization/fp8_kernel.py",
    "sglang.kernels.ops.quantization.int8_kernel": "sglang/kernels/ops/quantization/int8_kernel.py",
    "sglang.kernels.ops.quantization.fp8_utils": "sglang/kernels/ops/quantization/fp8_utils.py",
    "sglang.kernels.ops.moe.moe_align_small_numel": "sglang/kernels/ops/moe/moe_align_small_numel.py",
    # the shared expert's dense FP8 block linear (SGLang's Triton path, see SglangSharedMlp)
    "sglang.kernels.ops.gemm.fp8_kernel": "sglang/kernels/ops/gemm/fp8_kernel.py",
}
CONFIG_DIR = "sglang/srt/layers/moe/moe_runner/triton_utils/configs"
CONFIG_UP = "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
CONFIG_DOWN = "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"
# Tuned configs of SGLang's dense w8a8 block-FP8 Triton GEMM on the H200: the wheel has one for the
# shared expert's down projection (N=2048, K=512); the gate_up (N=1024, K=2048) has none, so SGLang
# uses its default tile there (and so does the peer: the lookup is SGLang's own, by file name).
GEMM_CONFIG_DIR = "sglang/kernels/ops/gemm/configs"
GEMM_CONFIG_DOWN = "N=2048,K=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
PEER_FILES = [*REAL_MODULES.values()]
CONFIG_FILES = [f"{CONFIG_DIR}/triton_3_6_0/{CONFIG_UP}", f"{CONFIG_DIR}/triton_3_6_0/{CONFIG_DOWN}",
                f"{GEMM_CONFIG_DIR}/{GEMM_CONFIG_DOWN}"]
PEER_NOTES: list[str] = []


class _Flag:
    """An ``envs.X`` flag: ``.get()`` gives its default (False / None)."""

    def get(self) -> Any:
        return False


class _Envs:
    def __getattr__(self, name: str) -> _Flag:
        return _Flag()


class _Platform:
    """``get_platform()``: CUDA sm90 (Hopper); every other probe answers False."""

    is_cuda = True
    is_sm90 = True

    def __getattr__(self, name: str) -> bool:
        return False


def _register_custom_op(*args: Any, **kwargs: Any) -> Any:
    """``@register_custom_op(...)``: leave the function as it is (no torch.library registration)."""
    if args and callable(args[0]) and not kwargs:
        return args[0]
    return lambda f: f


def _sm90() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9)


_EXPLICIT: dict[str, dict[str, Any]] = {
    "sglang.srt.utils": {
        "is_cuda": lambda: True, "is_hip": lambda: False, "is_cpu": lambda: False, "is_musa": lambda: False,
        "is_xpu": lambda: False, "is_npu": lambda: False, "cpu_has_amx_support": lambda: False,
        "is_sm90_supported": _sm90, "is_sm100_supported": lambda: False,
        "ceil_align": lambda x, a: (x + a - 1) // a * a, "get_bool_env_var": lambda *a, **k: False,
        "get_device_name": lambda *a, **k: "NVIDIA H200",
        "is_gfx1250_supported": lambda: False, "log_info_on_rank0": lambda logger, msg: logger.info(msg),
        "get_device_core_count": lambda *a, **k: 132,
    },
    "sglang.srt.runtime_context": {"get_platform": lambda: _Platform()},
    "sglang.srt.utils.custom_op": {"register_custom_op": _register_custom_op},
    "sglang.kernels.jit.utils": {"is_arch_support_pdl": _sm90},
    "sglang.srt.environ": {"envs": _Envs()},
    "sglang.srt.layers.moe.utils": {"get_moe_padding_size": lambda *a, **k: 0},
    "sglang.srt.batch_invariant_ops": {"is_batch_invariant_mode_enabled": lambda: False},
    "sglang.srt.utils.patch_torch": {"register_fake_if_exists": lambda *a, **k: (lambda f: f)},
}


def _raising(modname: str, attr: str) -> Any:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"peer stub {modname}.{attr} called: not part of the Triton pipeline")

    return stub


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        PEER_NOTES.append(f"stub {self.__name__}.{attr}")
        value = _raising(self.__name__, attr)
        setattr(self, attr, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not (fullname == "sglang" or fullname.startswith("sglang.") or fullname.split(".")[0] == "sgl_kernel"):
            return None
        if fullname in REAL_MODULES:
            return importlib.util.spec_from_file_location(fullname, self.root / REAL_MODULES[fullname])
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StubModule(spec.name)
        mod.__path__ = []
        for k, v in _EXPLICIT.get(spec.name, {}).items():
            setattr(mod, k, v)
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def load(root: Path) -> dict[str, Any]:
    """Import the peer's kernel modules from ``root`` (the folder holding ``sglang/``)."""
    missing = [f for f in PEER_FILES if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"SGLang peer files missing under {root}: {missing}")
    if any(m == "sglang" or m.startswith("sglang.") for m in sys.modules):
        raise RuntimeError("a real or stubbed sglang is already imported in this process; load the peer first")
    sys.meta_path.insert(0, _Finder(root))
    import importlib

    fmk: Any = importlib.import_module("sglang.kernels.ops.moe.fused_moe_triton_kernels")
    fp8k = importlib.import_module("sglang.kernels.ops.quantization.fp8_kernel")
    align = importlib.import_module("sglang.kernels.ops.moe.moe_align_small_numel")
    try:  # the shared-expert MLP peer; its failure leaves the routed peer usable
        gemm: Any = importlib.import_module("sglang.kernels.ops.gemm.fp8_kernel")
    except Exception as exc:
        PEER_NOTES.append(f"shared-MLP peer unavailable: {type(exc).__name__}: {exc}")
        gemm = None
    # SGLang's Triton group quant in place of the JIT CUDA one it calls on CUDA.
    fmk.sglang_per_token_group_quant_fp8 = fp8k._per_token_group_quant_8bit_raw
    cfg_root = root / CONFIG_DIR
    # (no glob: the file names hold "[128, 128]", a glob character class)
    up = json.loads((cfg_root / "triton_3_6_0" / CONFIG_UP).read_text())
    down = json.loads((cfg_root / "triton_3_6_0" / CONFIG_DOWN).read_text())
    return {"fmk": fmk, "fp8k": fp8k, "align": align, "up_cfg": up, "down_cfg": down, "gemm": gemm}


def _closest(configs: dict[str, dict[str, Any]], m: int) -> dict[str, Any]:
    key = min(configs, key=lambda k: abs(int(k) - m))
    cfg = dict(configs[key])
    cfg.pop("USE_TMA", None)
    return cfg


def align_block_ref(ids: Any, num_experts: int, block: int, sorted_ids: Any, expert_ids: Any, ntp: Any) -> None:
    """SGLang's moe_align_block_size buffer contract in PyTorch: route indices grouped by expert in
    increasing order, each expert padded to a multiple of ``block`` with the sentinel ``ids.numel()``,
    one expert id per block, and the padded total."""
    import torch

    flat = ids.flatten().long()
    numel = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block - 1) // block * block
    pstart = torch.cumsum(padded, 0) - padded
    cstart = torch.cumsum(counts, 0) - counts
    e_sorted = flat[order]
    pos = pstart[e_sorted] + torch.arange(numel, device=flat.device) - cstart[e_sorted]
    sorted_ids.fill_(numel)
    sorted_ids[pos] = order.to(sorted_ids.dtype)
    blocks = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block)
    expert_ids.fill_(-1)
    expert_ids[: blocks.numel()] = blocks.to(expert_ids.dtype)
    ntp[0] = int(padded.sum())


class SglangRouted:
    """The routed-expert pipeline for one batch size, buffers preallocated (graph-capturable)."""

    def __init__(self, peer: dict[str, Any], m: int, w13: Any, w13_s: Any, w2: Any, w2_s: Any,
                 topk_ids: Any, topk_w: Any) -> None:
        import torch
        import triton.language as tl

        self.p, self.m = peer, m
        self.w13, self.w13_s, self.w2, self.w2_s = w13, w13_s, w2, w2_s
        self.ids, self.tw = topk_ids, topk_w
        self.up_cfg = _closest(peer["up_cfg"], m)
        self.down_cfg = _closest(peer["down_cfg"], m)
        self.tl_bf16 = tl.bfloat16
        e = w13.shape[0]
        numel = topk_ids.numel()
        bs = self.up_cfg["BLOCK_SIZE_M"]
        maxpad = numel * bs if numel < e + 1 else numel + (e + 1) * (bs - 1)
        maxpad = (maxpad + 3) // 4 * 4
        dev = topk_ids.device
        self.sorted_ids = torch.empty(maxpad, dtype=torch.int32, device=dev)
        self.expert_ids = torch.empty((maxpad + bs - 1) // bs, dtype=torch.int32, device=dev)
        self.ntp = torch.empty(1, dtype=torch.int32, device=dev)
        self.align_in_timed = numel <= 64
        self.cache1 = torch.empty(numel, 1024, dtype=torch.bfloat16, device=dev)
        self.cache2 = torch.empty(numel, 512, dtype=torch.bfloat16, device=dev)
        self.cache3 = torch.empty(m, topk_ids.shape[1], 2048, dtype=torch.bfloat16, device=dev)
        self.out = torch.empty(m, 2048, dtype=torch.bfloat16, device=dev)
        if not self.align_in_timed:
            self._align()

    def _align(self) -> None:
        if self.align_in_timed:
            self.p["align"].moe_align_small_numel(self.ids, self.w13.shape[0] + 1, self.up_cfg["BLOCK_SIZE_M"],
                                                  self.sorted_ids, self.expert_ids, self.ntp)
            return
        # > 64 routes: SGLang runs its CUDA align here (not loadable); its Triton small-numel kernel is
        # O(routes^2) and did not finish compiling at 128 routes on the H200 (results/sm90/moe_runs/run3),
        # so the same buffers are filled once by PyTorch, outside the timed region.
        align_block_ref(self.ids, self.w13.shape[0], self.up_cfg["BLOCK_SIZE_M"], self.sorted_ids,
                        self.expert_ids, self.ntp)

    def __call__(self, x: Any) -> Any:
        fmk = self.p["fmk"]
        if self.align_in_timed:
            self._align()
        common = dict(compute_type=self.tl_bf16, use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False,
                      use_int4_w4a16=False, per_channel_quant=False, block_shape=[128, 128], filter_expert=False)
        fmk.invoke_fused_moe_kernel(x, self.w13, None, self.cache1, None, self.w13_s, None, self.tw, self.ids,
                                    self.sorted_ids, self.expert_ids, self.ntp, False, self.ids.shape[1],
                                    self.up_cfg, **common)
        fmk.act_and_mul_triton(self.cache1, self.cache2, self.up_cfg, None, None, False, "silu")
        fmk.invoke_fused_moe_kernel(self.cache2, self.w2, None, self.cache3, None, self.w2_s, None, self.tw,
                                    self.ids, self.sorted_ids, self.expert_ids, self.ntp, True, 1,
                                    self.down_cfg, **common)
        fmk.moe_sum_reduce_triton(self.cache3, self.out, 1.0)
        return self.out

    def act_quant_pair(self, gu: Any) -> Any:
        """SGLang's two-kernel activation + quantization (act_and_mul_triton, then group quant)."""
        fmk, fp8k = self.p["fmk"], self.p["fp8k"]
        h = self.cache2[: gu.shape[0]]
        fmk.act_and_mul_triton(gu, h, self.up_cfg, None, None, False, "silu")
        return fp8k._per_token_group_quant_8bit_raw(h, 128)


class SglangSharedMlp:
    """The shared expert the way SGLang's Qwen MoE block runs it for an FP8 block-quantized checkpoint
    (``Qwen2MoeSparseMoeBlock._forward_shared_experts`` -> ``Qwen2MoeMLP``): gate_up linear ->
    SiluAndMul -> down linear, each linear ``Fp8LinearMethod`` with 128x128 block scales; then
    ``sigmoid(shared_expert_gate(x)) * out`` (a BF16 ``torch.nn.Linear(2048, 1)``) and the add into
    the routed output (``final_hidden_states.add_(shared_output)``).

    On sm90 SGLang's auto backend for the block linear is DeepGEMM (JIT-compiled at run time, not
    loadable on the offline H200); its own fallback, used here, is ``triton_w8a8_block_fp8_linear``:
    per-token group quant (SGLang's JIT CUDA op on CUDA -> its Triton ``_per_token_group_quant_8bit``
    here) + ``w8a8_block_fp8_matmul_triton`` (the wheel's tuned H200 config for the down projection,
    the default tile for gate_up, as in SGLang). SiluAndMul is ``sgl_kernel.silu_and_mul`` in SGLang
    (AOT CUDA, not in the wheel copy) -> SGLang's Triton ``act_and_mul_triton`` here.
    ``__call__(x, routed)`` adds into ``routed`` in place (pass a scratch copy) and returns it.
    """

    def __init__(self, peer: dict[str, Any], m: int, w13: Any, w13_s: Any, w2: Any, w2_s: Any,
                 w_gate: Any) -> None:
        import torch

        if peer.get("gemm") is None:
            raise RuntimeError("SGLang's dense FP8 block GEMM module did not load (see PEER_NOTES)")
        self.p, self.m = peer, m
        self.w13, self.w13_s, self.w2, self.w2_s = w13, w13_s, w2, w2_s  # [1024, 2048], [8, 16], ...
        self.w_gate = w_gate.reshape(1, -1)  # [1, 2048] BF16, the nn.Linear weight
        self.h = torch.empty(m, w2.shape[1], dtype=torch.bfloat16, device=w13.device)
        self.act_cfg = _closest(peer["up_cfg"], m)  # act_and_mul_triton reads only BLOCK_SIZE_* from it

    def _linear(self, x: Any, w: Any, ws: Any) -> Any:
        import torch

        q, s = self.p["fp8k"]._per_token_group_quant_8bit_raw(x, 128, column_major_scales=False)
        return self.p["gemm"].w8a8_block_fp8_matmul_triton(q, w, s, ws, [128, 128], output_dtype=torch.bfloat16)

    def mlp(self, x: Any) -> Any:
        gu = self._linear(x, self.w13, self.w13_s)
        self.p["fmk"].act_and_mul_triton(gu, self.h, self.act_cfg, None, None, False, "silu")
        return self._linear(self.h, self.w2, self.w2_s)

    def __call__(self, x: Any, routed: Any) -> Any:
        import torch.nn.functional as F

        shared = self.mlp(x)
        shared = F.sigmoid(F.linear(x, self.w_gate)) * shared
        return routed.add_(shared)


def stage(dest: Path) -> list[Path]:
    """Copy the peer's files out of the installed ``sglang`` distribution (pinned 0.5.23, installed
    with --no-deps; not imported) into ``dest``, the folder the H200 run carries as .sglang_peer/."""
    from importlib.metadata import distribution

    dist = distribution("sglang")
    root = Path(str(dist.locate_file("")))
    copied = []
    for rel in PEER_FILES + CONFIG_FILES:
        src = root / rel
        if not src.is_file():
            raise FileNotFoundError(f"{src} not in the installed sglang {dist.version}")
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(src.read_bytes())
        copied.append(out)
    return copied
