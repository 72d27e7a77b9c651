"""User-facing errors.

Every error a user can cause (a bad config value, a corrupt shard, a missing column) is raised as
:class:`SpeedrunError` with a message that names the file, key or value and what was expected. The
``speedrun`` command prints such errors as one line and exits with status 2 instead of a traceback.
"""


class SpeedrunError(Exception):
    """An error in the user's input or data, with a message meant to be read by that user."""
