"""botocore sessions that read the SDK's data files once a process.

Every client keo builds comes from a session of its own (the Kinesis read client's session
parses timestamps its own way: :func:`producer.clients.kinesis_read_client`). A session reads
its data from disk and parses them again: the endpoints, the service's model and its endpoint
rules, about 40 ms of CPU a client, so that ``keo send`` spent on its ledger's and Kinesis'
clients a third of its start. The sessions made here share one loader, botocore's cache of what
it read (a session reads its data only through it): the data are read-only, shared the way one
session shares them among its clients.
"""

from __future__ import annotations

import functools

import botocore.loaders
import botocore.session

__all__ = ["new_session"]


def new_session() -> botocore.session.Session:
    """A new botocore session (its own events, credentials and parsers) whose data loader is
    the process's one for its data path."""
    session = botocore.session.get_session()
    session.register_component("data_loader", _loader(session.get_config_variable("data_path")))
    return session


@functools.cache
def _loader(data_path: str | None) -> botocore.loaders.Loader:
    return botocore.loaders.create_loader(data_path)
