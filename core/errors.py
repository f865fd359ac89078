"""User-facing errors of the AccelBench harness.

Anything raised as `UserError` is a problem with what the user asked for (a name, a knob, a value): the CLI prints
its message as one line and exits non-zero, before any work or MLflow run starts.
"""


class UserError(Exception):
    """A bad request: unknown name, bad knob, incompatible pair, invalid value."""


class WriteFailed(Exception):
    """A write that work under way needs failed: a full disk, a file system turned read-only. Not a `UserError`: the
    request was sound, and work had started (the CLI prints it as one line and exits 1, not 2).
    `WriteFailed(path, reason)`, e.g. reason "No space left on device"."""

    def __str__(self) -> str:
        return "cannot write {}: {}".format(*self.args)
