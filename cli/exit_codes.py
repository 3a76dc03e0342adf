"""Exit codes of ``keo``: a contract with the scripts that run it."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # the command ran, and something is wrong or left undone
    USAGE = 2  # unknown flag, bad value (typer/click's own code for usage errors)
    CONFIG = 3  # invalid settings, no AWS credentials, a port in use, a missing dependency
    UNAVAILABLE = 4  # a backend could not be reached
    INTERNAL = 70  # a bug in keo: the traceback is in the log (sysexits' EX_SOFTWARE)
    INTERRUPTED = 130  # Ctrl-C or SIGTERM (keo send: after finishing the chunk in flight)
