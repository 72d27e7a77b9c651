"""fp32 master weights kept as a bf16 weight plus its lower 16 bits (record #57 of the public speedrun; records
#57-#89 and HEAD, speedrun-spec.md 3.2 "mantissa").

The records store their weight matrices in bf16, the upper half of an fp32 number: sign, exponent and the top 7
mantissa bits. Muon keeps the lower 16 bits of each weight (the records' ``mantissa`` buffer) in its state,
so that weight + lower bits is the exact fp32 weight the update is applied to; the forward pass multiplies the
upper half, which is the fp32 weight truncated towards zero to bf16 (not rounded). The bits are held as int16
(the same 16 bits as the records' uint16): CPU torch has no shifts of unsigned 32-bit integers, and the int32
arithmetic below gives the records' bit patterns on every device.
"""

from __future__ import annotations

import torch


def join_bf16(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The fp32 tensor whose upper 16 bits are ``high`` (bf16) and lower 16 bits ``low`` (int16, of
    ``high``'s shape): a new tensor of that shape. Raises ``TypeError`` for other dtypes."""
    if high.dtype != torch.bfloat16 or low.dtype != torch.int16:
        raise TypeError(f"join_bf16 expects a bfloat16 and an int16 tensor, got {high.dtype} and {low.dtype}")
    upper = high.view(torch.int16).to(torch.int32) << 16                 # sign-extended, then shifted: exact
    return (upper | (low.to(torch.int32) & 0xFFFF)).view(torch.float32)


def split_fp32_(value: torch.Tensor, high: torch.Tensor, low: torch.Tensor) -> None:
    """Write the upper 16 bits of the fp32 ``value`` into ``high`` (bf16: ``value`` truncated towards zero) and
    its lower 16 bits into ``low`` (int16), in place; all three of one shape. ``join_bf16(high, low)`` is then
    ``value`` bit for bit. Raises ``TypeError`` for other dtypes."""
    if value.dtype != torch.float32 or high.dtype != torch.bfloat16 or low.dtype != torch.int16:
        raise TypeError(f"split_fp32_ expects float32, bfloat16 and int16 tensors, got {value.dtype}, "
                        f"{high.dtype} and {low.dtype}")
    bits = value.contiguous().view(torch.int32)
    high.view(torch.int16).copy_((bits >> 16).to(torch.int16))           # the value fits int16: exact
    low.copy_(((bits & 0xFFFF) - ((bits & 0x8000) << 1)).to(torch.int16))  # 0..65535 as a signed 16-bit value
