"""User-facing errors of the AccelBench harness.

Anything raised as `UserError` is a problem with what the user asked for (a name, a knob, a value): the CLI prints
its message as one line and exits non-zero, before any work or MLflow run starts.
"""


class UserError(Exception):
    """A bad request: unknown name, bad knob, incompatible pair, invalid value."""
