"""The metrics of ``keo send`` and ``keo reconcile`` out of the process.

Two ways, for two kinds of process:

- ``--metrics-port P``: ``/metrics`` on ``--metrics-host`` (127.0.0.1 unless told) while the
  command runs, for a scraper (a daemon: ``keo reconcile --loop``, a long ``keo send``);
- ``--metrics-file F``: node_exporter's textfile-collector format, written when the command
  ends (and after every pass of ``reconcile --loop``), for runs too short to scrape (cron).
  Written atomically: a temporary file in the same folder, then renamed over ``F``, so the
  collector never reads half a file. Only keo's own metrics go there, each with a ``command``
  label: two commands writing files for the same collector never clash.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from cli import logs
from cli.exit_codes import ExitCode

PREFIX = "keo_"

MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65535,
        help="serve Prometheus metrics on http://HOST:PORT/metrics while running",
        show_default=False,
    ),
]
MetricsHostOpt = Annotated[
    str,
    typer.Option(
        "--metrics-host",
        help="address --metrics-port listens on (127.0.0.1: this machine only)",
    ),
]
MetricsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--metrics-file",
        dir_okay=False,
        help="write the metrics there at the end, in node_exporter's textfile format "
        "(name it *.prom in the collector's folder)",
        show_default=False,
    ),
]


@contextlib.contextmanager
def exporting(command: str, *, port: int | None, host: str, file: Path | None) -> Iterator[None]:
    """The block's metrics served on ``host:port`` while it runs, and written to ``file`` when
    it ends, however it ends (each only when given). A folder that cannot take ``file`` exits
    2 and a port that cannot be listened on exits 3, before the block starts."""
    if file is not None and not os.access(file.parent, os.W_OK | os.X_OK):
        typer.echo(
            f"keo {command}: cannot write --metrics-file {file}: no such folder, or not writable",
            err=True,
        )
        raise typer.Exit(ExitCode.USAGE)
    try:
        with _serving(command, port, host):
            yield
    finally:
        if file is not None:
            write_file(file, command)


def write_file(path: Path, command: str) -> None:
    """keo's metrics in ``path`` (textfile format), replacing it atomically; a failure is a
    warning on stderr (what the command did stands)."""
    try:
        _write_atomically(path, _textfile(command))
    except OSError as exc:
        typer.echo(f"keo {command}: cannot write --metrics-file {path}: {exc}", err=True)


@contextlib.contextmanager
def _serving(command: str, port: int | None, host: str) -> Iterator[None]:
    if port is None:
        yield
        return
    try:
        server, thread = start_http_server(port, addr=host)
    except OSError as exc:
        reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        typer.echo(
            f"keo {command}: cannot serve metrics on {host}:{port} (--metrics-host, "
            f"--metrics-port): {reason}",
            err=True,
        )
        raise typer.Exit(ExitCode.CONFIG) from None
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/metrics"
    logs.report(f"keo {command}: metrics on {url}", event="metrics_listening", url=url)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _textfile(command: str) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Labelled(REGISTRY, command))
    return generate_latest(registry)


def _write_atomically(path: Path, body: bytes) -> None:
    # the temporary file's name does not end in .prom: the collector skips it
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)  # read by the collector, often another user
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class _Labelled(Collector):
    """The ``keo_`` metrics of ``source``, each sample with a ``command`` label."""

    def __init__(self, source: CollectorRegistry, command: str) -> None:
        self._source = source
        self._command = command

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            if not family.name.startswith(PREFIX):
                continue
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labelled.add_sample(
                    sample.name,
                    {**sample.labels, "command": self._command},
                    sample.value,
                    sample.timestamp,
                    sample.exemplar,
                )
            yield labelled
