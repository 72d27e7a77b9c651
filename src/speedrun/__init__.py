"""speedrun: a reproducible pipeline for the NanoGPT speedrun.

Stages (each one a Snakemake rule, a ``speedrun <stage>`` subcommand and a module here):
corpus -> tokenize -> bos_index -> train -> parse -> stats -> report.
Library code lives in the subpackages ``data`` (shard format, tokenizer, loaders), ``model``,
``optim`` and ``stats``. Nothing here touches CUDA, the network or ``torch.distributed`` at import.
"""

__version__ = "0.1.0"
