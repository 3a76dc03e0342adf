"""The group item's packed members and positions: exact round trips, refusals, sizes.

Pure, no sockets. The seeded inputs at the top are the ones the table in
dedupe_store/packing.py was measured on.
"""

from __future__ import annotations

import random
import string
import uuid
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dedupe_store.packing import (
    MAX_PAYLOAD_BYTES,
    MAX_SUB_SEQUENCE_NUMBER,
    PackingError,
    members_size_bytes,
    pack_members,
    pack_positions,
    unpack_members,
    unpack_positions,
)
from dedupe_store.records import Position

SEED = 20240501
GROUP_SIZE = 500
SHARDS = [f"shardId-{n:012d}" for n in range(4)]


# --- the seeded inputs of the size table ------------------------------------------------------


def sequential_keys() -> list[str]:
    return [f"eo-{n:08d}" for n in range(1, GROUP_SIZE + 1)]


def uuid_keys() -> list[str]:
    rng = random.Random(SEED)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(GROUP_SIZE)]


def alphanumeric_keys() -> list[str]:
    rng = random.Random(SEED)
    alphabet = string.ascii_letters + string.digits
    return ["".join(rng.choices(alphabet, k=24)) for _ in range(GROUP_SIZE)]


def realistic_positions() -> dict[int, Position]:
    """Members routed at random over 4 shards; each shard's numbers start from a 56-digit base
    and grow by 1..2**20 from one member to the next in that shard."""
    rng = random.Random(SEED)
    current = {shard: rng.randrange(10**55, 10**56) for shard in SHARDS}
    positions: dict[int, Position] = {}
    for index in range(GROUP_SIZE):
        shard = rng.choice(SHARDS)
        current[shard] += rng.randint(1, 2**20)
        positions[index] = Position(shard, str(current[shard]))
    return positions


def aggregated_positions() -> dict[int, Position]:
    """Members routed at random over 4 shards, 125 a shard, each shard's members packed into one
    aggregated record: 4 sequence numbers, sub-sequence numbers 0..124 in member order."""
    rng = random.Random(SEED)
    sequence_numbers = {shard: str(rng.randrange(10**55, 10**56)) for shard in SHARDS}
    routing = [shard for shard in SHARDS for _ in range(GROUP_SIZE // len(SHARDS))]
    rng.shuffle(routing)
    next_sub = dict.fromkeys(SHARDS, 0)
    positions: dict[int, Position] = {}
    for index, shard in enumerate(routing):
        positions[index] = Position(shard, sequence_numbers[shard], next_sub[shard])
        next_sub[shard] += 1
    return positions


def plain_size_bytes(keys: list[str]) -> int:
    """The raw plain members payload, computed here independently of the module."""

    def varint_size(value: int) -> int:
        return max(1, (value.bit_length() + 6) // 7)

    lengths = [len(key.encode()) for key in keys]
    return varint_size(len(keys)) + sum(varint_size(n) + n for n in lengths)


# --- strategies -------------------------------------------------------------------------------

# any Unicode text but lone surrogates, which the protocol refuses before a key gets here
KEY_CHARACTERS = st.characters(codec="utf-8")
any_key = st.text(KEY_CHARACTERS, min_size=1, max_size=256)
# keys that share prefixes, so front coding is chosen and its byte arithmetic exercised,
# including prefixes that end inside a multi-byte character ("é" and "ê" share 0xC3)
prefixed_key = st.builds(
    lambda prefix, suffix: (prefix + suffix)[:256],
    st.sampled_from(["eo-0000", "tenant-é/", "tenant-ê/", "\x00\n", "日本語-", "🙂🙃"]),
    st.text(KEY_CHARACTERS, min_size=1, max_size=12),
)
# keys that repeat: a group may list one key twice
repeated_key = st.sampled_from(["eo-00000001", "eo-00000002", "é"])
# group sizes spread over 0..500 (a plain st.lists stays short)
key_lists = st.integers(0, GROUP_SIZE).flatmap(
    lambda size: st.lists(
        st.one_of(any_key, prefixed_key, repeated_key), min_size=size, max_size=size
    )
)
# sequence number strings that are not their integer's canonical decimal, so must be escaped
odd_sequence_numbers = st.one_of(
    st.text("0123456789", max_size=140),  # "", leading zeros, past 129 digits
    st.text(KEY_CHARACTERS, max_size=20),
)


@st.composite
def position_maps(draw: st.DrawFn) -> tuple[int, dict[int, Position]]:
    """A group size and a sparse map of positions. The bulk comes from a seeded ``Random``
    (hundreds of draws would exhaust Hypothesis's buffer); the odd values come from Hypothesis.

    Sequence numbers: mostly small steps either way from the shard's last (a repeat now and
    then), sometimes any number up to 129 digits, sometimes odd strings; sub-sequence numbers:
    None, small, any up to 2**63 - 1, or the next of an aggregated run."""
    count = draw(st.integers(0, GROUP_SIZE))
    density = draw(st.sampled_from([0.0, 0.05, 0.5, 0.95, 1.0]))
    rng = draw(st.randoms(use_true_random=False))
    shard_ids = draw(
        st.lists(
            st.one_of(st.sampled_from(SHARDS), st.text(KEY_CHARACTERS, max_size=30)),
            min_size=1,
            max_size=6,
        )
    )
    odd_strings = draw(st.lists(odd_sequence_numbers, min_size=1, max_size=4))
    current = {shard: draw(st.integers(0, 10**56)) for shard in shard_ids}
    positions: dict[int, Position] = {}
    previous: Position | None = None
    for index in range(count):
        if rng.random() >= density:
            continue
        if previous is not None and rng.random() < 0.3:
            # an aggregated run: the previous member's record, the next sub-sequence number
            sub = previous.sub_sequence_number
            sub = None if sub is None else min(sub + 1, MAX_SUB_SEQUENCE_NUMBER)
            positions[index] = previous = Position(previous.shard_id, previous.sequence_number, sub)
            continue
        shard = rng.choice(shard_ids)
        kind = rng.random()
        if kind < 0.8:
            current[shard] = max(0, current[shard] + rng.randint(-(2**21), 2**21))
            sequence_number = str(current[shard])
        elif kind < 0.9:
            sequence_number = str(rng.randrange(10**129))
        else:
            sequence_number = rng.choice(odd_strings)
        sub = rng.choice([None, rng.randint(0, 200), rng.randint(0, MAX_SUB_SEQUENCE_NUMBER)])
        positions[index] = previous = Position(shard, sequence_number, sub)
    return count, positions


# --- members ----------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(keys=key_lists)
def test_members_round_trip_exactly(keys: list[str]) -> None:
    # GIVEN any list of valid keys, duplicates and shared prefixes included
    # WHEN it is packed and unpacked
    blob = pack_members(keys)
    # THEN the same keys come back in the same order
    assert unpack_members(blob) == keys
    # AND the size function is exact, and the raw plain layout (the cheap bound that callers
    # can grow key by key) is never exceeded
    assert members_size_bytes(keys) == len(blob)
    assert len(blob) <= 1 + plain_size_bytes(keys)


@pytest.mark.parametrize(
    "keys",
    [
        [],
        ["k"],
        ["x" * 256],
        ["🙂" * 256, "🙂" * 255 + "🙃"],  # 1024-byte keys: two-byte varints for the lengths
        ["a\x00b", "a\x00c", "line\nbreak", "line\nbreak"],
        ["tenant-é", "tenant-ê"],  # the shared prefix ends inside "é"
        ["same"] * GROUP_SIZE,
        sequential_keys(),
        uuid_keys(),
    ],
    ids=[
        "empty",
        "one",
        "256-chars",
        "4-byte-chars",
        "nul-newline",
        "split-char",
        "dups",
        "seq",
        "uuid",
    ],
)
def test_members_edge_cases_round_trip(keys: list[str]) -> None:
    # GIVEN keys at the edges of the format
    # WHEN packed and unpacked
    # THEN they come back exactly
    assert unpack_members(pack_members(keys)) == keys


def test_a_lone_surrogate_is_refused_with_its_member_index() -> None:
    # GIVEN a key list whose third key holds a lone surrogate (not Unicode text)
    keys = ["a", "b", "bad\ud800key"]
    # WHEN it is packed
    # THEN the codec refuses it and says which member, instead of storing something else
    with pytest.raises(PackingError, match="member 2") as info:
        pack_members(keys)
    assert "surrogate" in info.value.reason


def test_one_string_is_not_a_list_of_keys() -> None:
    # GIVEN a single key passed where the list of members is expected
    # WHEN it is packed
    # THEN it is refused rather than packed as one member per character
    with pytest.raises(TypeError):
        pack_members("order-1")


# --- positions --------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(group=position_maps())
def test_positions_round_trip_exactly(group: tuple[int, dict[int, Position]]) -> None:
    # GIVEN a group of some size and any sparse map of member index to position
    count, positions = group
    # WHEN it is packed and unpacked
    unpacked = unpack_positions(pack_positions(count, positions))
    # THEN every position comes back with the exact sequence number string it was given
    assert unpacked == positions


@pytest.mark.parametrize(
    "sequence_number",
    ["0", "007", "00", "", "1_000", " 12", "١٢٣", "9" * 129, "1" + "0" * 129, "abc"],
    ids=[
        "zero",
        "leading-zeros",
        "zeros",
        "empty",
        "underscore",
        "space",
        "arabic-digits",
        "129-digits",
        "130-digits",
        "text",
    ],
)
def test_sequence_numbers_keep_their_exact_string(sequence_number: str) -> None:
    # GIVEN a position whose sequence number is canonical or not, between two canonical ones
    positions = {
        0: Position(SHARDS[0], "49590338271490256608559692538361571095921575989136588898", 0),
        1: Position(SHARDS[0], sequence_number, 1),
        2: Position(SHARDS[0], "49590338271490256608559692538361571095921575989136588898", 1),
    }
    # WHEN packed and unpacked
    # THEN the string comes back as it was (int("007") would lose it) and its neighbours too
    assert unpack_positions(pack_positions(3, positions)) == positions


def test_a_group_with_no_positions_yet_round_trips() -> None:
    # GIVEN an open group of 500 members, none settled
    # WHEN its empty positions are packed
    blob = pack_positions(GROUP_SIZE, {})
    # THEN they unpack to no positions, and cost a few bytes, not one per member
    assert unpack_positions(blob) == {}
    assert len(blob) < 20


def test_positions_over_many_shards_round_trip() -> None:
    # GIVEN 500 members over 200 shards (tags of two varint bytes from the 64th shard on),
    # with sub-sequence numbers past one varint byte
    positions = {
        index: Position(f"shardId-{index % 200:012d}", str(10**55 + index), 1000 + index)
        for index in range(GROUP_SIZE)
    }
    # WHEN packed and unpacked
    # THEN they come back exactly
    assert unpack_positions(pack_positions(GROUP_SIZE, positions)) == positions


@pytest.mark.parametrize(
    ("count", "positions", "reason"),
    [
        (2, {2: Position(SHARDS[0], "1")}, "member index 2"),
        (2, {-1: Position(SHARDS[0], "1")}, "member index -1"),
        (-1, {}, "members count -1"),
        (1, {0: Position(SHARDS[0], "1", -1)}, "sub-sequence"),
        (1, {0: Position(SHARDS[0], "1", 2**63)}, "sub-sequence"),
        (1, {0: Position("shard\udc00", "1")}, "surrogate"),
        (1, {0: Position(SHARDS[0], "1\udc00")}, "surrogate"),
    ],
    ids=[
        "index-past-end",
        "negative-index",
        "negative-count",
        "negative-sub",
        "sub-over-long",
        "shard-surrogate",
        "sequence-surrogate",
    ],
)
def test_positions_that_cannot_be_stored_are_refused(
    count: int, positions: dict[int, Position], reason: str
) -> None:
    # GIVEN positions outside what the format stores
    # WHEN they are packed
    # THEN the codec refuses them with a reason instead of storing something else
    with pytest.raises(PackingError, match=reason):
        pack_positions(count, positions)


# --- corrupt blobs ----------------------------------------------------------------------------

VALID_BLOBS = {
    "members-zlib": pack_members(sequential_keys()),
    "members-raw": pack_members(["a", "b", "c"]),
    "members-plain-zlib": pack_members(uuid_keys()[:20]),
    "positions-zlib": pack_positions(60, dict(list(realistic_positions().items())[:50])),
    "positions-raw": pack_positions(2, {1: Position(SHARDS[1], "12", 3)}),
}


def unpack_any(blob: bytes, kind: str) -> object:
    return unpack_members(blob) if kind.startswith("members") else unpack_positions(blob)


def read_or_refuse(blob: bytes, kind: str) -> object:
    """What unpacking gives: the field's value, or None when it raised PackingError; any other
    exception propagates and fails the test."""
    try:
        value = unpack_any(blob, kind)
    except PackingError:
        return None
    if kind.startswith("members"):
        assert isinstance(value, list)
        assert all(isinstance(key, str) for key in value)
    else:
        assert isinstance(value, dict)
        assert all(isinstance(position, Position) for position in value.values())
    return value


@pytest.mark.parametrize("name", sorted(VALID_BLOBS))
def test_every_truncation_is_refused(name: str) -> None:
    # GIVEN a valid blob
    blob = VALID_BLOBS[name]
    for size in range(len(blob)):
        # WHEN any proper prefix of it is unpacked
        # THEN it is refused: a cut item never reads as fewer members or positions
        with pytest.raises(PackingError):
            unpack_any(blob[:size], name)


def uncompressed(blob: bytes) -> bytes:
    """The same blob with its payload stored raw, so a corruption reaches the parser instead of
    failing zlib's checksum."""
    if blob[0] & 0x01:
        return bytes((blob[0] & ~0x01,)) + zlib.decompress(blob[1:])
    return blob


@given(
    name=st.sampled_from(sorted(VALID_BLOBS)),
    raw=st.booleans(),
    data=st.data(),
)
def test_a_corrupted_blob_reads_or_is_refused_never_crashes(
    name: str, raw: bool, data: st.DataObject
) -> None:
    # GIVEN a valid blob, as packed or with its payload uncompressed, with some bytes overwritten
    blob = bytearray(uncompressed(VALID_BLOBS[name]) if raw else VALID_BLOBS[name])
    for _ in range(data.draw(st.integers(1, 4))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    # WHEN it is unpacked
    # THEN it either decodes to the field's type or raises PackingError: nothing else, no hang
    read_or_refuse(bytes(blob), name)


@given(blob=st.binary(max_size=2048), kind=st.sampled_from(["members", "positions"]))
def test_random_bytes_read_or_are_refused_never_crash(blob: bytes, kind: str) -> None:
    # GIVEN arbitrary bytes
    # WHEN they are unpacked as either field
    # THEN they either decode to the field's type or raise PackingError, nothing else
    read_or_refuse(blob, kind)


@given(blob=st.binary(max_size=2048), kind=st.sampled_from(["members", "positions"]))
def test_random_payloads_behind_a_valid_header_read_or_are_refused(blob: bytes, kind: str) -> None:
    # GIVEN arbitrary raw and compressed payloads behind the header of the right field
    header = 0x10 if kind == "members" else 0x18
    for packed in (bytes((header,)) + blob, bytes((header | 0x01,)) + zlib.compress(blob)):
        # WHEN they are unpacked
        # THEN they either decode to the field's type or raise PackingError, nothing else
        read_or_refuse(packed, kind)


@pytest.mark.parametrize("version", [0, 2, 15])
def test_an_unknown_format_version_is_refused(version: int) -> None:
    # GIVEN a valid members blob whose version nibble is changed
    blob = bytearray(pack_members(["a", "b"]))
    blob[0] = (version << 4) | (blob[0] & 0x0F)
    # WHEN it is unpacked
    # THEN it is refused as an unknown version, not misread
    with pytest.raises(PackingError, match=f"unknown format version {version}"):
        unpack_members(bytes(blob))


def test_one_field_is_never_read_as_the_other() -> None:
    # GIVEN a members blob and a positions blob
    members = pack_members(["a", "b"])
    positions = pack_positions(2, {0: Position(SHARDS[0], "1")})
    # WHEN each is unpacked as the other field
    # THEN both are refused
    with pytest.raises(PackingError, match="positions blob"):
        unpack_members(positions)
    with pytest.raises(PackingError, match="members blob"):
        unpack_positions(members)


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (b"", "empty"),
        (b"\x14", "reserved"),
        (b"\x1a\x00", "front coding"),  # positions with the members-only flag
        (b"\x10\x00\x00", "after the payload"),
        (b"\x10" + b"\xff" * 11, "varint"),
        (b"\x10\xff\xff\xff\xff\x0f", "exceeds the payload"),  # claims 4 billion members
        (b"\x12\x02\x00\x01a\x02\x01b", "shares 2 bytes"),  # front coded past the previous key
        (b"\x10\x01\x02\xc3\x28", "UTF-8"),
        (b"\x18\x01\x00\x01", "shard slot 0 of 0"),
        (b"\x11" + zlib.compress(b"\x00") + b"x", "after the compressed"),
        (b"\x11" + zlib.compress(b"\x00")[:-1], "truncated"),
        (b"\x11not zlib", "corrupt compressed"),
    ],
    ids=[
        "empty",
        "reserved-bit",
        "front-positions",
        "trailing",
        "long-varint",
        "huge-count",
        "shared-too-long",
        "bad-utf8",
        "bad-slot",
        "after-zlib",
        "cut-checksum",
        "not-zlib",
    ],
)
def test_corrupt_blobs_are_refused_with_a_reason(blob: bytes, reason: str) -> None:
    # GIVEN a blob corrupted in one specific way
    # WHEN it is unpacked
    # THEN the error names what is wrong, and is a ValueError for callers that catch those
    with pytest.raises(PackingError, match=reason) as info:
        unpack_any(blob, "positions" if blob[:1] in (b"\x18", b"\x1a") else "members")
    assert isinstance(info.value, ValueError)


def test_a_decompression_bomb_is_refused_without_inflating_it() -> None:
    # GIVEN a compressed payload that would inflate past the payload limit
    bomb = b"\x11" + zlib.compress(b"\x00" * (MAX_PAYLOAD_BYTES + 1), 9)
    # WHEN it is unpacked
    # THEN it is refused at the limit
    with pytest.raises(PackingError, match="inflates to over"):
        unpack_members(bomb)


def test_sequence_numbers_past_129_digits_are_refused_on_read() -> None:
    # GIVEN a positions payload whose first sequence number is 10**129 (130 digits)
    value = 10**129
    varint = bytearray()
    while value >= 0x80:
        varint.append((value & 0x7F) | 0x80)
        value >>= 7
    varint.append(value)
    blob = b"\x18\x01\x01\x01a\x01" + bytes(varint) + b"\x00"
    # WHEN it is unpacked
    # THEN it is refused: the encoder escapes such strings, so this is corruption
    with pytest.raises(PackingError, match="past 129 digits"):
        unpack_positions(blob)


# --- sizes ------------------------------------------------------------------------------------

# the measured sizes (module docstring) with about 5 % headroom, for another zlib build
SIZE_BOUNDS_BYTES = {
    "members: eo-00000001.. sequential": (sequential_keys, 105),
    "members: UUID4": (uuid_keys, 10_200),
    "members: 24-char alphanumeric": (alphanumeric_keys, 9_850),
}
POSITION_BOUNDS_BYTES = {
    "positions: 4 shards, deltas 1..2**20": (realistic_positions, 2_040),
    "positions: aggregated, 4 shards x 125": (aggregated_positions, 425),
}


@pytest.mark.parametrize("name", sorted(SIZE_BOUNDS_BYTES))
def test_packed_members_stay_under_their_measured_size(name: str) -> None:
    # GIVEN 500 seeded keys of a typical shape
    make_keys, bound_bytes = SIZE_BOUNDS_BYTES[name]
    keys = make_keys()
    # WHEN they are packed
    blob = pack_members(keys)
    # THEN the group item's members stay as small as measured (sizes are deterministic)
    assert len(blob) <= bound_bytes
    assert unpack_members(blob) == keys


@pytest.mark.parametrize("name", sorted(POSITION_BOUNDS_BYTES))
def test_packed_positions_stay_under_their_measured_size(name: str) -> None:
    # GIVEN 500 seeded positions of a typical shape
    make_positions, bound_bytes = POSITION_BOUNDS_BYTES[name]
    positions = make_positions()
    # WHEN they are packed
    blob = pack_positions(GROUP_SIZE, positions)
    # THEN the group item's positions stay as small as measured
    assert len(blob) <= bound_bytes
    assert unpack_positions(blob) == positions
