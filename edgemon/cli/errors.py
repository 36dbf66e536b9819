"""Errors the command line turns into one clear line on stderr and an exit code."""

from __future__ import annotations

from edgemon.errors import EdgemonError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NEGATIVE = 3


class UsageError(EdgemonError):
    """Bad usage or bad input: printed as one line, exit code 2, no traceback."""
