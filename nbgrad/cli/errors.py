"""User errors of the command line: one line on stderr and an exit status, no traceback."""

from __future__ import annotations

USAGE = 2  # bad arguments: unknown op, bad shape, missing module, ...
FAILED = 1  # the command ran and found a problem (or a prerequisite is missing)


class CliError(Exception):
    """An error to show as ``nbgrad <command>: error: <message>`` and exit with ``code``."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.message = " ".join(message.split())
        self.code = code
