"""Process-wide set-up of the test session: MKL's vector-math kernels chosen on one thread before any test runs
threaded float math (:mod:`speedrun.support.cpu_math`: otherwise a test's first ``sqrt`` may be inexact)."""

from speedrun.support.cpu_math import resolve_cpu_math_dispatch


def pytest_configure(config):
    resolve_cpu_math_dispatch()
