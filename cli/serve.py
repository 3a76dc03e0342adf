"""``keo serve``: the delivery-state API (FastAPI on uvicorn), reading the ledger.

Settings come from the environment (``KEO_*``, see ``api.settings.ApiSettings``); flags override
them. Without ``KEO_API_TOKEN`` it refuses to start (exit 3) unless ``--no-auth`` asks for an
open API explicitly, and that is allowed on a loopback address only.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from typing import Annotated, Any, NoReturn

import typer

from cli import logs
from cli.exit_codes import ExitCode
from dedupe_store.errors import ConfigurationError


def serve(
    *,
    table: Annotated[
        str | None,
        typer.Option(help="DynamoDB table of the ledger (default: KEO_TABLE, or keo-ledger)"),
    ] = None,
    host: Annotated[
        str, typer.Option(help="address to listen on (127.0.0.1: this machine only)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=1, max=65535)] = 8080,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="serve /v1 without a bearer token: local use only (loopback addresses only)",
        ),
    ] = False,
    dynamodb_endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--dynamodb-endpoint-url",
            help="DynamoDB endpoint (default: KEO_DYNAMODB_ENDPOINT_URL, or AWS)",
        ),
    ] = None,
    kinesis_endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--kinesis-endpoint-url",
            help="Kinesis endpoint, where the streams' retention is read "
            "(default: KEO_KINESIS_ENDPOINT_URL, or AWS)",
        ),
    ] = None,
    stream_retention_hours: Annotated[
        int | None,
        typer.Option(
            help="the streams' retention, for the exactly-once window (default: "
            "KEO_STREAM_RETENTION_HOURS, or each stream's own, read from Kinesis)",
            min=24,
            max=8760,
        ),
    ] = None,
) -> None:
    """Serve the delivery-state API: was key X delivered, where, and when?

    Every /v1 route needs 'Authorization: Bearer <KEO_API_TOKEN>'.

    /healthz, /readyz and /metrics are open. The OpenAPI document is at /openapi.json.
    """
    from pydantic import ValidationError

    from api import ApiSettings, create_app

    overrides: dict[str, Any] = {
        name: value
        for name, value in {
            "table": table,
            "dynamodb_endpoint_url": dynamodb_endpoint_url,
            "kinesis_endpoint_url": kinesis_endpoint_url,
            "stream_retention_hours": stream_retention_hours,
        }.items()
        if value is not None
    }
    try:
        settings = ApiSettings(**overrides)
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        )
        _fail_config(f"invalid settings: {reasons}")
    if no_auth:
        if not _is_loopback(host):
            _fail_config(
                f"--no-auth serves the ledger to anyone who can connect: refused on {host!r}; "
                "use a loopback address (127.0.0.1) or set KEO_API_TOKEN"
            )
        logs.report(
            "keo serve: WARNING: AUTHENTICATION IS OFF (--no-auth): every /v1 route answers "
            "without a token. For local use only.",
            event="auth_off",
            level=logging.WARNING,
            style={"fg": typer.colors.RED, "bold": True},
        )
    try:
        app = create_app(settings, require_auth=not no_auth)
    except ConfigurationError as exc:  # no token (ApiConfigError), no AWS region, and the like
        _fail_config(str(exc))

    import uvicorn

    # Listen first, announce after: the URL printed is one that answers, and a port in use is
    # reported as such before anything claims to be serving.
    listening = _listen(host, port)
    bound_port = listening.getsockname()[1]
    url = f"http://{_url_host(host)}:{bound_port}"
    logs.report(
        f"keo serve: delivery-state API on {url} "
        f"(table {settings.table}, auth {'off' if no_auth else 'bearer'})",
        event="serve_listening",
        url=url,
        table=settings.table,
    )
    # log_config=None: uvicorn logs through keo's logging setup (-v for access logs)
    config = uvicorn.Config(app, log_config=None, server_header=False)
    uvicorn.Server(config).run(sockets=[listening])


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``; exit 3 naming --host/--port when it cannot."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listening = socket.socket(family, kind, proto)
    except OSError as exc:
        _fail_config(f"cannot listen on --host {host!r}: {exc.strerror or exc}")
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(2048)
    except OSError as exc:
        listening.close()
        reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        _fail_config(f"cannot listen on {host}:{port} (--host, --port): {reason}")
    return listening


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _fail_config(message: str) -> NoReturn:
    logs.report(f"keo serve: {message}", event="config_error", level=logging.ERROR)
    raise typer.Exit(ExitCode.CONFIG)
