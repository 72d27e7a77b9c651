"""One training run: its settings (:mod:`.config`), data (:mod:`.data`), processes and device (:mod:`.launch`),
GPU preflight (:mod:`.preflight`), compile caches (:mod:`.compile_cache`), loop (:mod:`.loop`) and log
(:mod:`.runlog`); and one run of a record's own script (:mod:`.record_script`). Used by the ``train`` and
``run-script`` stages and, for its settings and data check, by :mod:`speedrun.workflow`.
"""
