"""Small helpers every layer may use: atomic file output (:mod:`.atomic`), how a long-running process stops
(:mod:`.stopping`), when a run has diverged (:mod:`.divergence`) and ``NAME=VALUE`` arguments
(:mod:`.arguments`). They import nothing of the package but :mod:`speedrun.errors`."""
