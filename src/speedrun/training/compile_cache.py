"""The on-disk compile caches that every run shares: Inductor's and Triton's folders (:func:`use_compile_cache`),
AOTAutograd's cache of the training graph and the key that ties every entry to our sources
(:func:`allow_training_graph_cache`, :func:`compile_cache_tag`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import MutableMapping

import torch

PACKAGE_DIR = Path(__file__).resolve().parents[1]     # src/speedrun: every source file a compiled graph may run


def use_compile_cache(folder: Path, env: MutableMapping[str, str]) -> None:
    """Point Inductor's and Triton's on-disk caches into ``folder`` (``inductor/``, ``triton/``), unless the
    user set TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR already. Their entries are keyed by the graph, the
    code and the torch/Triton/CUDA versions, so runs of one model shape share them: the second seed of a
    variant skips the compilation (modded-nanogpt #19 reports about 7 minutes of cold compile)."""
    folder = folder.resolve()
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(folder / "triton"))


def allow_training_graph_cache() -> None:
    """Let AOTAutograd's on-disk cache keep the training graph, so that a warm start (the second seed of a
    variant, :func:`use_compile_cache`) loads its forward and backward instead of tracing them again; and key
    every compile cache entry by our own sources (:func:`compile_cache_tag`).

    The loss turns autocast off inside the compiled model (:func:`speedrun.model.loss.linear_cross_entropy`
    computes the logits' products in the dtype it is given); Dynamo records that as calls of
    ``torch.amp.autocast_mode._enter_autocast`` / ``_exit_autocast``, which AOTAutograd's cache refuses by
    default ("Unsupported call_function target"): every start re-traced the training graph (warm start
    39.3 s on the H200 with the cache otherwise warm, docs/benchmarks.md). Their arguments (device type,
    dtype, enabled) are constants of the graph and so part of the cache key, as is the autocast state
    around the call: marking the two functions cacheable, keyed by the torch version, is safe. The same
    holds for custom autograd Functions (the FP8 linear, the fused cross-entropy and the Triton kernels'
    gradients), whose forward and backward Dynamo traces into the graph; torch versions that refuse them
    have a switch for it, turned on here.

    What the key does not see is the Python body of a custom operator (``torch.library.triton_op``: our
    Triton kernels' grids, block sizes and arguments are set there): the graph holds only the operator's
    name. So the entries are also keyed by a hash of every source file of the package
    (``torch.compiler.config.cache_key_tag``): after any edit of our code the caches miss and compile
    again. Process-wide and idempotent."""
    marked = torch._inductor.config.unsafe_marked_cacheable_functions
    for name in ("_enter_autocast", "_exit_autocast"):
        marked[f"torch.amp.autocast_mode.{name}"] = torch.__version__
    if hasattr(torch._functorch.config, "autograd_cache_allow_custom_autograd_functions"):
        torch._functorch.config.autograd_cache_allow_custom_autograd_functions = True
    torch.compiler.config.cache_key_tag = f"speedrun-{compile_cache_tag(PACKAGE_DIR)}"


def compile_cache_tag(package: Path) -> str:
    """16 hex digits of the SHA-256 of every ``*.py`` file under ``package`` (relative path and bytes, in
    sorted order): changes with any edit of the code that the compiled graphs run."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
