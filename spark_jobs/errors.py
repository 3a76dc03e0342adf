"""Errors of the Spark layer. They grow from :mod:`producer.errors`' tree::

    KeoError
    └── ConfigurationError
        ├── OptionsError          options format("keo") or read_records cannot work with
        │                         (``options`` names them)
        └── SparkVersionError     the running Spark cannot do what was asked (``feature``,
                                  ``running``, ``needs``, and ``instead``: what to use)

Both are raised on the driver, before a task runs.
"""

from __future__ import annotations

from producer.errors import ConfigurationError

__all__ = ["OptionsError", "SparkVersionError"]


class OptionsError(ConfigurationError):
    """Options ``format("keo")`` cannot work with; ``options`` names the ones at fault."""

    def __init__(self, message: str, *, options: list[str]) -> None:
        super().__init__(message, setting=options[0] if options else None)
        self.options = options


class SparkVersionError(ConfigurationError):
    """``feature`` needs Spark ``needs`` or later; this session runs ``running``. ``instead``
    says what does the same work on the running Spark, where something does."""

    def __init__(self, feature: str, *, running: str, needs: str, instead: str) -> None:
        super().__init__(
            f"{feature} needs Spark {needs} or later (Python data sources); this session runs "
            f"Spark {running}. {instead}"
        )
        self.feature = feature
        self.running = running
        self.needs = needs
        self.instead = instead
