"""speedrun: a reproducible pipeline for the NanoGPT speedrun.

The layout is the architecture, imports going downward only (tests/test_layout.py checks it):

* stage modules, here at the top: one per Snakemake rule and ``speedrun <stage>`` subcommand (corpus ->
  tokenize -> bos_index -> train / run_script -> parse -> stats / compare -> report, bundle; download), each its
  arguments, ``main`` and the glue to the library call that does the work; dispatched by :mod:`speedrun.cli`.
  No stage imports another, so an edit of one reruns only the jobs of the rule that runs it
  (:mod:`speedrun.workflow.sources`).
* :mod:`speedrun.workflow`: what the Snakefile calls and its rules run (the experiment resolved once, the
  stages' source files, the train rule's launcher).
* :mod:`speedrun.training`: one training run (settings, data, launch, loop, log, preflight, compile cache).
* the libraries: ``data`` (corpus sources, shard format and writers, BOS index, tokenizer, loaders, Hub paths and
  downloads), ``model``, ``optim``, ``kernels`` and ``analysis`` (log parsing, statistics and comparisons with
  their records and renderers, the report's inputs, the record bundle).
* :mod:`speedrun.support` (atomic output, stopping) and :mod:`speedrun.errors`, which every layer imports.

Nothing here touches CUDA, the network or ``torch.distributed`` at import.
"""

__version__ = "0.1.0"
