"""Triton kernels for CUDA GPUs, each next to a pure-PyTorch reference elsewhere in the package.

``relu_square_mlp``: the fused ReLU² MLP (records #59, #87; reference :class:`speedrun.model.mlp.MLP`).

Importing this package imports nothing (no Triton, no CUDA); import the kernel module you need, which needs
the ``triton`` package.
"""
