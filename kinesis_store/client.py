"""A Kinesis client on an endpoint, the one way every package builds one.

The caller gives the timeouts and retries (``config``): the producer's puts and reads
(:mod:`producer.clients`), the API's one short call (:mod:`api.retention`). An emulator's
endpoint gets its dummy credentials where the environment has none
(:func:`dedupe_store.settings.emulator_credentials_for`); AWS's (None) the SDK's own.
"""

from __future__ import annotations

from typing import Any

import botocore.session
from botocore.config import Config

from dedupe_store.sessions import new_session
from dedupe_store.settings import emulator_credentials_for

__all__ = ["kinesis_client_for"]


def kinesis_client_for(
    endpoint_url: str | None,
    *,
    region: str,
    config: Config,
    session: botocore.session.Session | None = None,
) -> Any:
    """A Kinesis client on ``endpoint_url`` in ``region``, from ``session`` (by default a new
    one, whose SDK data the process reads once: :func:`dedupe_store.sessions.new_session`).
    botocore's, not boto3's: the same client and credential chain, without boto3's
    import (its S3 transfer manager: a tenth of ``keo send``'s start)."""
    key_id, secret = emulator_credentials_for(endpoint_url) or (None, None)
    return (session or new_session()).create_client(
        "kinesis",
        region_name=region,
        endpoint_url=endpoint_url,
        config=config,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
    )
