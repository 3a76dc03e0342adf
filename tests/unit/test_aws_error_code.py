"""``aws_error_code`` reads a vendor error's code the one way every package reads it."""

from __future__ import annotations

import botocore.exceptions
import pytest

from dedupe_store.errors import aws_error_code


def throttled() -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "PutItem"
    )


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (throttled().response, "ThrottlingException"),
        (throttled(), "ThrottlingException"),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), None),
        (ValueError("no response at all"), None),
        ({"Responses": []}, None),
        ({"Error": None}, None),
        ({"Error": {"Message": "no code"}}, None),
    ],
    ids=[
        "response",
        "client error",
        "transport error",
        "other exception",
        "response without an error",
        "error of None",
        "error without a code",
    ],
)
def test_the_code_is_read_from_a_response_or_an_error_that_carries_one(
    answer: object, code: str | None
) -> None:
    # GIVEN a botocore response, or an exception (with a response or without)
    # WHEN its AWS error code is read
    # THEN it is the response's Error.Code, or None where it has none
    assert aws_error_code(answer) == code
