"""``kinesis_client_for``: the one Kinesis client builder, its timeouts and retries the caller's."""

from __future__ import annotations

import pytest
from botocore.config import Config

from dedupe_store.settings import EMULATOR_CREDENTIALS
from kinesis_store.client import kinesis_client_for


def test_a_client_on_an_emulator_has_its_dummy_credentials_and_the_callers_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN no AWS credentials in the environment, and an emulator's endpoint
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    # WHEN a client is built on it with short timeouts
    client = kinesis_client_for(
        "http://127.0.0.1:4567",
        region="eu-west-1",
        config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 2}),
    )
    # THEN it talks to the emulator in that region, with the emulator's credentials and the
    # timeouts given
    assert (client.meta.endpoint_url, client.meta.region_name) == (
        "http://127.0.0.1:4567",
        "eu-west-1",
    )
    credentials = client._request_signer._credentials
    assert (credentials.access_key, credentials.secret_key) == EMULATOR_CREDENTIALS
    assert (client.meta.config.connect_timeout, client.meta.config.read_timeout) == (2, 5)
