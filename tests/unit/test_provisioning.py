"""What keo init reports about an existing stream it leaves as it is (pure)."""

from __future__ import annotations

from kinesis_store.provisioning import ON_DEMAND, PROVISIONED, StreamSpec, StreamState, differences

FOUR_SHARDS = StreamState(mode=PROVISIONED, open_shards=4, retention_hours=24, kms_key=None)


def test_a_stream_as_asked_has_no_differences() -> None:
    asked = StreamSpec(shards=4, retention_hours=24)
    assert differences(asked, FOUR_SHARDS, shards_given=True) == []


def test_the_default_shard_count_is_no_difference_when_it_was_not_asked_for() -> None:
    # GIVEN keo init without --shards (4 by default) on a stream of 2 shards
    two = StreamState(mode=PROVISIONED, open_shards=2, retention_hours=24, kms_key=None)
    # THEN nothing is reported; with --shards 4 it is
    assert differences(StreamSpec(shards=4), two, shards_given=False) == []
    assert differences(StreamSpec(shards=4), two, shards_given=True) == [
        "it has 2 open shards, not 4"
    ]


def test_mode_retention_and_encryption_that_differ_are_each_reported() -> None:
    asked = StreamSpec(shards=None, retention_hours=168, kms_key="alias/aws/kinesis")
    assert differences(asked, FOUR_SHARDS, shards_given=False) == [
        "it is provisioned, not on demand",
        "its retention is 24 h, not 168 h",
        "it is not encrypted (asked: KMS alias/aws/kinesis)",
    ]
    other_key = StreamState(mode=ON_DEMAND, open_shards=4, retention_hours=168, kms_key="k-1")
    assert differences(asked, other_key, shards_given=False) == [
        "it is encrypted with k-1, not alias/aws/kinesis"
    ]


def test_a_summary_is_read_into_a_state_and_described() -> None:
    state = StreamState.of(
        {
            "StreamModeDetails": {"StreamMode": "ON_DEMAND"},
            "OpenShardCount": 4,
            "RetentionPeriodHours": 48,
            "EncryptionType": "KMS",
            "KeyId": "alias/aws/kinesis",
        }
    )
    assert state == StreamState(ON_DEMAND, 4, 48, "alias/aws/kinesis")
    assert state.describe() == "on demand, retention 48 h, KMS alias/aws/kinesis"
    # kinesalite's summary has no mode and no encryption
    assert StreamState.of({"OpenShardCount": 2, "RetentionPeriodHours": 24}).describe() == (
        "2 shards, retention 24 h, not encrypted"
    )
