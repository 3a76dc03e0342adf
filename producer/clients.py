"""The Kinesis clients, built from settings: one for puts (SDK retries off: retries are the
protocol's) and one for reads. Apart from :mod:`producer.wiring`, which builds the whole
stack, so that the reader's client comes without the ledger and the producers."""

from __future__ import annotations

from typing import Any

import botocore.session
from botocore.config import Config

from dedupe_store.sessions import new_session
from kinesis_store.client import kinesis_client_for
from kinesis_store.reader import utc_timestamp
from producer.settings import ProducerSettings

__all__ = ["kinesis_client", "kinesis_read_client"]


def kinesis_client(settings: ProducerSettings, *, for_put: bool) -> Any:
    """A Kinesis client. For puts, SDK retries are off: retries are the protocol's."""
    return _kinesis_client(settings, for_put=for_put, session=new_session())


def kinesis_read_client(settings: ProducerSettings) -> Any:
    """A Kinesis client for reading records in bulk: ``kinesis_client(for_put=False)`` whose
    timestamps come back in UTC (:func:`kinesis_store.reader.utc_timestamp`), the same
    instants as the SDK's, not converted to the local time zone: that conversion was most of
    the Python time of a large GetRecords page."""
    core = new_session()
    core.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=utc_timestamp
    )
    return _kinesis_client(settings, for_put=False, session=core)


def _kinesis_client(
    settings: ProducerSettings, *, for_put: bool, session: botocore.session.Session
) -> Any:
    if for_put:
        config = Config(
            connect_timeout=settings.put_connect_timeout_s,
            read_timeout=settings.put_read_timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=16,
        )
    else:
        config = Config(
            connect_timeout=5,
            read_timeout=30,
            retries={"max_attempts": 5, "mode": "standard"},
            max_pool_connections=16,
        )
    return kinesis_client_for(
        settings.kinesis_endpoint_url,
        region=settings.kinesis_region(),
        config=config,
        session=session,
    )
