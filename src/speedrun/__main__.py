"""``python -m speedrun`` is the ``speedrun`` command."""

from speedrun.cli import main

raise SystemExit(main())
