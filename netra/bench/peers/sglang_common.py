"""What every SGLang peer shares: SGLang's JIT loader and kernel registry as real files, the stubs
that answer SGLang's platform probes for a TP1 CUDA sm90 process, and the wheels the GPU host lacks.

``sglang_loader.manifests()`` always includes ``COMMON``; a peer's own manifest adds its kernel files
and only the stubs particular to it. A probe another peer needs answered goes here, once (two peers
answering the same probe differently is an error of ``sglang_loader.merge``).
"""

from __future__ import annotations

from typing import Any

from netra.bench.peers.sglang_loader import Manifest

JIT_UTILS = ("sglang.kernels.jit", "sglang.kernels.jit.utils", "sglang.kernels.jit.utils.arch",
             "sglang.kernels.jit.utils.common", "sglang.kernels.jit.utils.deps", "sglang.kernels.jit.utils.compile",
             "sglang.kernels.jit.utils.compile.cache", "sglang.kernels.jit.utils.compile.cpp_args",
             "sglang.kernels.jit.utils.compile.loader", "sglang.kernels.jit.utils.compile.ninja",
             "sglang.kernels.jit.utils.compile.parallel", "sglang.kernels.jit.utils.compile.paths",
             "sglang.kernels.jit.utils.compile.sailify", "sglang.kernels.jit.utils.compile.spec",
             "sglang.kernels.jit.utils.compile.toolchain")
MODULES = (*JIT_UTILS, "sglang.srt.environ", "sglang.kernels.registry", "sglang.kernels.selector",
           "sglang.kernels.spec", "sglang.kernels.kernel_api_logging")


def _torch_release() -> tuple[int, ...]:
    """``sglang.srt.utils.common.torch_release``: the installed torch's (major, minor, patch), read
    from its metadata (torch itself is not imported here)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("torch")
    except PackageNotFoundError:
        return (0, 0, 0)
    return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())


class _Flag:
    """An ``envs.X`` flag answering False / None. The peers load the real ``sglang.srt.environ`` (real
    defaults); this stands in for it in scripts that stub that module (scripts/gpu/plugin_h200.py)."""

    def get(self) -> Any:
        return False


class _Envs:
    def __getattr__(self, name: str) -> _Flag:
        return _Flag()


class _Platform:
    """``get_platform()``: a CUDA sm90 (Hopper) device; every other probe answers False."""

    is_cuda = True
    is_sm90 = True

    def __getattr__(self, name: str) -> bool:
        return False


def _sm90() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9)


def _no_symmetric_memory(*args: Any, **kwargs: Any) -> Any:
    import contextlib

    return contextlib.nullcontext()


def _register_custom_op(*args: Any, **kwargs: Any) -> Any:
    """``@register_custom_op(...)``: the function itself (no torch.library op around it)."""
    if args and callable(args[0]) and not kwargs:
        return args[0]
    return lambda f: f


def _exec_config() -> Any:
    from types import SimpleNamespace as NS

    return NS(moe=NS(enable_fused_moe_sum_all_reduce=False, disable_shared_experts_fusion=False,
                     ep_num_redundant_experts=0, enable_paged_experts=False),
              deterministic=NS(enable_deterministic_inference=False),
              kernel=NS(fp8_gemm_runner_backend="auto", bf16_gemm_backend="auto"))


def _parallel() -> Any:
    from types import SimpleNamespace as NS

    return NS(tp_group=None, tp_size=1, moe_ep_size=1)


def _device_name(*args: Any, **kwargs: Any) -> str:
    import torch

    return str(torch.cuda.get_device_name()) if torch.cuda.is_available() else "NVIDIA H200"


def _capability(device_id: int = 0) -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(device_id)) if torch.cuda.is_available() else (9, 0)  # type: ignore


def _cuda_version() -> tuple[int, int]:
    import torch

    major, minor = (torch.version.cuda or "13.0").split(".")[:2]
    return int(major), int(minor)


def _bool_env(name: str, default: str = "false") -> bool:
    import os

    return os.environ.get(name, default).lower() in ("1", "true", "yes")


SRT_UTILS = {
    "is_cuda": lambda: True, "is_hip": lambda: False, "is_cpu": lambda: False, "is_musa": lambda: False,
    "is_xpu": lambda: False, "is_npu": lambda: False, "cpu_has_amx_support": lambda: False,
    "is_sm90_supported": _sm90, "is_sm100_supported": lambda: False, "is_gfx95_supported": lambda: False,
    "is_gfx942_supported": lambda: False, "is_gfx1250_supported": lambda: False,
    "is_flashinfer_available": lambda: False, "get_device_name": _device_name,
    "ceil_align": lambda x, a: (x + a - 1) // a * a, "ceil_div": lambda a, b: (a + b - 1) // b,
    "get_bool_env_var": _bool_env,
    "log_info_on_rank0": lambda logger, msg: logger.info(msg), "get_device_core_count": lambda *a, **k: 132,
    "get_hip_version": lambda: (0, 0, 0), "offloader": None, "get_device_capability": _capability,
    "get_cuda_version": _cuda_version, "get_device_sm": lambda: 10 * _capability()[0] + _capability()[1],
}
STUBS: dict[str, dict[str, Any]] = {
    "sglang.srt.utils": SRT_UTILS,
    "sglang.srt.utils.common": {"is_cuda": lambda: True, "print_warning_once": lambda msg: None,
                                "torch_release": _torch_release()},
    "sglang.srt.utils.custom_op": {"register_custom_op": _register_custom_op},
    "sglang.srt.utils.patch_torch": {"register_fake_if_exists": lambda *a, **k: (lambda f: f)},
    "sglang.srt.runtime_context": {"get_platform": _Platform, "get_exec": _exec_config, "get_parallel": _parallel},
    "sglang.srt.batch_invariant_ops": {"is_batch_invariant_mode_enabled": lambda: False},
    "sglang.srt.distributed.device_communicators.pynccl_allocator": {"use_symmetric_memory": _no_symmetric_memory},
    "sglang.srt.layers.dp_attention": {"is_allocation_symmetric": lambda: False},
    # DeepGEMM (sgl-deep-gemm 0.2.3.post2) is a torch-2.14.1 extension: it cannot import on the H200's
    # torch 2.11, and SGLang's configurer answers False when `import deep_gemm` fails.
    "sglang.srt.layers.deep_gemm_wrapper": {"ENABLE_JIT_DEEPGEMM": False},
    "sglang.srt.hardware_backend.npu.utils": {"is_npu_arch35": lambda: False},
    "sglang.srt.layers.quantization.mxfp4_tensor": {"MXFP4QuantizeUtil": object},
}
MANIFEST = COMMON = Manifest("common", MODULES, stubs=STUBS,
                  wheels={"apache-tvm-ffi==0.1.11": "tvm_ffi", "msgspec==0.23.0": "msgspec"})
