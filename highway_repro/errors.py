"""The project's own error classes (no torch; importable before anything else).

Everything raised for a mistake the USER can fix (a bad option, a config value, a corrupt or mismatched
checkpoint, a missing or damaged data file) is a subclass of `HighwayError`, so that the entry point
(`highway_repro.train`) reports exactly these in one line, without a traceback, and lets every other
exception (a bug) keep its traceback. `HighwayError` is a `ValueError`, so code that caught ValueError
before keeps working.

What belongs here: the base class and the error classes that several packages raise or catch (today
`ConfigError`). Errors of one package may live in that package (`engine.checkpoint.CheckpointError`,
`data.sources.DataError`) as long as they subclass `HighwayError`.
"""

from __future__ import annotations


class HighwayError(ValueError):
    """Base of every error that reports a user mistake (one line: what was wrong and what is allowed)."""


class ConfigError(HighwayError):
    """A bad option or config value: `model.d_ff=0 is not allowed (valid: a positive integer)`.

    Raised by `highway_repro.options` (so by the model constructors and by `config.validate`)."""
