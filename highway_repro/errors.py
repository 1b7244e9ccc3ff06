"""The project's error classes: what the entry points report in one line (exit code 2), without a traceback.

Anything else is a bug and keeps its traceback.
"""


class HighwayError(ValueError):
    """Base of the errors caused by the user's input: config values, data files, checkpoints."""
