"""speedrun: a reproducible pipeline for the NanoGPT speedrun.

The layout is the architecture, imports going downward only (tests/test_layout.py checks it):

* stage modules, here at the top: one per Snakemake rule and ``speedrun <stage>`` subcommand, each its
  arguments and ``main`` (corpus -> tokenize -> bos_index -> train -> parse -> stats / compare -> report,
  bundle; download), dispatched by :mod:`speedrun.cli`. No stage imports another.
* :mod:`speedrun.workflow`: what the Snakefile calls (the experiment resolved once, the stages' source files).
* :mod:`speedrun.training`: one training run (settings, data, launch, loop, log, preflight, compile cache).
* the libraries: ``data`` (shard format, tokenizer, loaders, Hub requests), ``model``, ``optim``,
  ``kernels`` and ``analysis`` (log parsing, statistics and comparisons with their records and renderers).
* :mod:`speedrun.support` (atomic output, stopping) and :mod:`speedrun.errors`, which every layer imports.

Nothing here touches CUDA, the network or ``torch.distributed`` at import.
"""

__version__ = "0.1.0"
