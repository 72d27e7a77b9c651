"""What serves the Snakefile: the experiment resolved from config.yaml (:mod:`.planning`) and the source files
each stage runs (:mod:`.sources`). Imported by the Snakefile only, never by a stage."""
