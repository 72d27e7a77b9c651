"""Small helpers every layer may use: atomic file output (:mod:`.atomic`) and how a long-running process stops
(:mod:`.stopping`). They import nothing of the package but :mod:`speedrun.errors`."""
