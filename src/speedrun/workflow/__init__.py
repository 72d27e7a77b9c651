"""What serves the Snakefile: the experiment resolved from config.yaml (:mod:`.planning`), the source files
each stage runs (:mod:`.sources`) and the train rule's launcher (:mod:`.launcher`, run as ``python -m
speedrun.workflow.launcher``). Imported by the Snakefile and run by its rules, never imported by a stage."""
