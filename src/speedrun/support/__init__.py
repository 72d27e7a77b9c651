"""Small helpers every layer may use: atomic file output (:mod:`.atomic`), how a long-running process stops
(:mod:`.stopping`), when a run has diverged (:mod:`.divergence`), ``NAME=VALUE`` arguments
(:mod:`.arguments`) and a workaround for a PyTorch bug that makes a process's first CPU float math inexact
(:mod:`.cpu_math`). They import nothing of the package but :mod:`speedrun.errors`."""
