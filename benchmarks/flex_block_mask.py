"""The cost of building FlexAttention block masks for one packed micro-batch, and of the attention itself.

Compares, compiled on CUDA, FlexAttention's ``create_block_mask`` (evaluates the mask on all T² token
pairs) with :func:`speedrun.model.attention.document_block_mask` (from each 128-token block's first and last
document id, O((T/128)²)), at the record's 49,152 tokens per micro-batch and the 98,304 of a paired-head
layer's doubled sequence, with documents of geometric length (mean 800, cut at 2,048: the loader's shape),
and checks that both give the same blocks. Prints one JSON line per case (ms, median of 20 after warm-up)
and one for flex_attention forward + backward (6 heads of 128, bf16) for scale.

    PYTHONPATH=src python benchmarks/flex_block_mask.py
"""

from __future__ import annotations

import json

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from triton.testing import do_bench

from speedrun.model.attention import _document_causal_mod, document_block_mask
from speedrun.model.packing import document_ids


def documents(tokens: int, g: torch.Generator) -> torch.Tensor:
    """cu_seqlens (int32, CUDA) of geometric documents (mean 800 tokens, at most 2,048) filling ``tokens``."""
    bounds = [0]
    while bounds[-1] < tokens:
        length = min(2048, 1 + int(torch.empty(1).exponential_(1 / 800, generator=g)))
        bounds.append(min(tokens, bounds[-1] + length))
    return torch.tensor(bounds, dtype=torch.int32, device="cuda")


def main() -> None:
    g = torch.Generator().manual_seed(0)
    build_all_pairs = torch.compile(
        lambda ids, window, n: create_block_mask(_document_causal_mod(ids, window), None, None, n, n,
                                                 device="cuda"), dynamic=False)
    build_blocks = torch.compile(lambda ids, window: document_block_mask(ids, window,
                                                                         _document_causal_mod(ids, window)),
                                 dynamic=False)
    attend = torch.compile(flex_attention, dynamic=False)
    for tokens in (49152, 98304):
        ids = document_ids(documents(tokens, g), tokens)
        for window in (384, 1408, None):
            a = build_all_pairs(ids, window, tokens)
            b = build_blocks(ids, window)
            same = all(torch.equal(x.sum(), y.sum()) for x, y in (
                (a.kv_num_blocks, b.kv_num_blocks), (a.full_kv_num_blocks, b.full_kv_num_blocks)))
            figures = {"tokens": tokens, "window": window, "same_block_counts": same,
                       "create_block_mask_ms": do_bench(lambda: build_all_pairs(ids, window, tokens),
                                                        warmup=50, rep=200, return_mode="median"),
                       "document_block_mask_ms": do_bench(lambda: build_blocks(ids, window), warmup=50,
                                                          rep=200, return_mode="median")}
            if tokens == 49152:
                q, k, v = (torch.randn(1, 6, tokens, 128, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))

                def step():
                    attend(q, k, v, block_mask=b, scale=0.12).sum().backward()
                figures["flex_fwd_bwd_ms"] = do_bench(step, warmup=50, rep=200, return_mode="median")
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}),
                  flush=True)


if __name__ == "__main__":
    main()
