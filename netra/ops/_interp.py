"""Triton's CPU interpreter as the GPU specs' smoke paths and the interpreter tests use it.

`interpreter_fixes` mends three defects of Triton 3.6's interpreter that would otherwise make an
interpreted tactic disagree with its compiled self; `enable` turns the interpreter on for this process
(it must run before anything imports triton: Triton picks the interpreter when kernels are decorated).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any


def enable() -> None:
    """Turn Triton's interpreter on for this process; refuses when triton was already imported compiled."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set: the smoke path needs it first")
    os.environ["TRITON_INTERPRET"] = "1"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreter_fixes() -> Callable[[], None]:
    """Mend three defects of Triton 3.6's interpreter; returns the function that undoes it.

    * A scalar tensor becomes a Python int through ``int(array)`` of a one-element array, which NumPy
      >= 2.3 refuses ("only 0-dimensional arrays can be converted"): ``for i in range(start, end, step)``
      over loaded values fails. ``__index__`` takes the one element instead.
    * FP32 -> BF16 (and -> FP8) narrows by truncating the mantissa where the GPU rounds to nearest even
      (``cvt.rn``): float conversions between formats torch knows go through torch (round to nearest
      even, as the hardware does).
    * ``tl.dot`` of BF16 operands multiplies their raw 16-bit patterns (NumPy has no BF16): BF16 operands
      are widened to FP32 (exact) before the product.
    """
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    patch_tensor, convert = interpreter._patch_lang_tensor, interpreter._convert_float

    def patched(tensor: Any, scope: Any) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    formats = {tl.float32: torch.float32, tl.float16: torch.float16, tl.bfloat16: torch.bfloat16,
               tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}
    rtne = interpreter._ir.ROUNDING_MODE.RTNE

    def convert_rn(data: Any, src: Any, dst: Any, rounding_mode: Any) -> Any:
        if src not in formats or dst not in formats or rounding_mode not in (None, rtne):
            return convert(data, src, dst, rounding_mode)
        raw = torch.from_numpy(data.copy()).view(formats[src])
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[formats[dst].itemsize]
        return raw.to(formats[dst]).view(bits).numpy()

    dot = interpreter.InterpreterBuilder.create_dot

    def dot_bf16(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        if a.dtype == tl.bfloat16 or b.dtype == tl.bfloat16:
            def wide(h: Any) -> Any:
                if h.dtype != tl.bfloat16:
                    return h
                f32 = torch.from_numpy(h.data.copy()).view(torch.bfloat16).float().numpy()
                return interpreter.TensorHandle(f32, tl.float32)
            a, b = wide(a), wide(b)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter._patch_lang_tensor, interpreter._convert_float = patched, convert_rn
    interpreter.InterpreterBuilder.create_dot = dot_bf16

    def undo() -> None:
        interpreter._patch_lang_tensor, interpreter._convert_float = patch_tensor, convert
        interpreter.InterpreterBuilder.create_dot = dot

    return undo
