"""The compact encoding of a claim group's members and positions (two DynamoDB Binary attributes).

DynamoDB bills a write by the item's size in 1 KB steps, and the group item is written at
open, at every lease renewal and at settle, so its size is most of the cost beyond one write
per key. Pure functions, stdlib only. The codec does not validate keys (the protocol does): it
round-trips any list of Unicode strings and any positions exactly, and refuses with
:class:`PackingError` only what it cannot store (a lone surrogate, a sub-sequence number
outside a Java long, an index outside the group, a payload over ``MAX_PAYLOAD_BYTES``) and
any blob it cannot read.

Format, version 1. Every integer is an unsigned LEB128 varint (7 bits a byte, lowest group
first, the high bit set on every byte but the last); ``zigzag(d)`` maps a signed difference
0, -1, 1, -2, 2 ... to 0, 1, 2, 3, 4 ...

Byte 0, the header, the same for both fields::

    bits 7..4  format version: 1; a blob of any other version is refused, never misread
    bit 3      field: 0 = members, 1 = positions (one field is never read as the other)
    bit 2      reserved: 0
    bit 1      members: 1 = front coded, 0 = plain; positions: 0
    bit 0      1 = the payload is a zlib stream (RFC 1950, with its Adler-32 checksum),
               0 = the payload follows as it is

Bytes 1..end: the payload, and nothing after it. The encoder keeps whichever is smaller, the
payload or its zlib stream (the payload on a tie). Of zlib streams it tries Huffman coding
only and level 6 deflate and keeps the smaller (see ``packing_wire._compress``); any zlib
stream reads. :mod:`dedupe_store.packing_wire` writes and reads these bytes.

Members payload, plain::

    varint count
    count x (varint n, n bytes: the key in UTF-8)

Members payload, front coded: each key against the key before it, in bytes of UTF-8 (a shared
prefix may end inside a character; every key is decoded whole)::

    varint count
    count x (varint shared: bytes equal to the previous key's first bytes, 0 for the first,
             varint n, n bytes: the rest of the key in UTF-8)

Positions payload: three columns, each in member index order (columns pack better than one
record per member: 1936 bytes against 2182 for the 4-shard input below, 405 against 456 for
the aggregated one)::

    varint count                          members, indexes 0 .. count - 1
    varint s, s x (varint n, n bytes)     the distinct shard ids in UTF-8, by first appearance
    count x varint tag                    0 = no position, else 1 + 2 x shard slot + escaped
    one entry a member with a position, the sequences column:
        escaped                           varint n, n bytes: the sequence number, in UTF-8
        the first integer of its shard    varint sequence number
        any later one                     varint zigzag(sequence number - its shard's last)
    one entry a member with a position, the subs column:
        varint                            0 = no sub-sequence number,
                                          else 1 + zigzag(sub-sequence number - expected)

A sequence number is stored as an integer only when it is its integer's canonical decimal
(ASCII digits, no leading zero, 1..129 digits: Kinesis's pattern ``0|([1-9]\\d{0,128})``);
any other string is escaped, stored as it is, and neither reads nor moves its shard's "last"
position. ``expected`` is the last sub-sequence number + 1 when the member's sequence number
equals its shard's last one and that one had a sub-sequence number (the user records of one
aggregated record), else 0.

Choices, measured on the inputs of the table below (blob sizes in bytes):
- Front coding is chosen when it makes the payload smaller before compression. That also gave
  the smaller blob on every input tried (sequential, UUIDs, prefixed UUIDs, timestamps, short
  random, CJK, duplicates): sequential keys take 99 bytes instead of 986 plain; UUIDs would
  take 10154 front coded instead of 9726.
- Huffman coding only beats deflate on random keys: UUIDs take 9726 bytes against 10781 at
  level 6 and 11073 at level 1, in a quarter of level 6's time. Deflate wins wherever there
  are repeats: front-coded sequential keys take 99 bytes against 660. Level 9 gains nothing
  over level 6 on any input here.
- Sub-sequence numbers are predicted rather than stored as sub + 1: the aggregated positions
  take 405 bytes instead of 926.
- The zlib container's 6 bytes (header, checksum) are kept over raw deflate: the checksum
  catches a corrupt payload.

Sizes in bytes (zlib 1.2.13; the seeded inputs of tests/unit/test_packing.py, which bounds
them)::

    input                                                     plain   packed   layout
    500 members eo-00000001 .. eo-00000500 (11 characters)     6002       99   front, deflate
    500 members, random UUID4 (36 characters)                 18502     9726   plain, Huffman
    500 members, random alphanumeric (24 characters)          12502     9370   plain, Huffman
    500 positions over 4 shards, 56-digit bases, steps of
        1 .. 2**20 in each shard, members routed at random     2679     1936   deflate
    500 aggregated positions over 4 shards: 4 sequence
        numbers, sub-sequence numbers 0 .. 124, at random      1691      405   deflate

("plain": the members' plain payload, or the positions payload, before compression.)

CPU in microseconds a call (Python 3.11.7 on a shared, busy 2-vCPU AMD EPYC VM; best of
150 x 20 calls; measured, never asserted)::

    input (as above)              pack   unpack
    500 members, sequential        210      175
    500 members, UUID4             170      150
    500 members, alphanumeric      145      135
    500 positions, 4 shards        340      575
    500 positions, aggregated      135      440

So a group's 500 members and 500 positions pack in 0.3 to 0.55 ms. Most of it is the Python
loop over positions (int() of a 56-digit string alone costs 0.1 us) and, when unpacking, the
frozen Position's constructor (0.43 us each).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dedupe_store.packing_wire import (
    FLAG_FRONT_CODED,
    FLAG_POSITIONS,
    FORMAT_VERSION,
    HEADER_MEMBERS,
    HEADER_POSITIONS,
    MAX_PAYLOAD_BYTES,
    PackingError,
    Reader,
    decode_utf8,
    open_blob,
    put_bytes,
    put_varint,
    seal,
    utf8_text,
    varint_size,
    varints,
)
from dedupe_store.records import Position

__all__ = [
    "FORMAT_VERSION",
    "MAX_PAYLOAD_BYTES",
    "MAX_SEQUENCE_DIGITS",
    "MAX_SUB_SEQUENCE_NUMBER",
    "PackingError",
    "members_size_bytes",
    "pack_members",
    "pack_positions",
    "unpack_members",
    "unpack_positions",
]

# Kinesis's API pattern for a sequence number is 0|([1-9]\d{0,128}): up to 129 digits
MAX_SEQUENCE_DIGITS = 129
# sub-sequence numbers are Java longs in the KPL's aggregation format
MAX_SUB_SEQUENCE_NUMBER = 2**63 - 1

_SEQUENCE_LIMIT = 10**MAX_SEQUENCE_DIGITS  # canonical sequence numbers are below it
# the longest sequence varint the decoder accepts (a longer one is corrupt, and would cost
# quadratic time): 448 bits, which the zigzag of a difference of two 129-digit numbers fits
_SEQUENCE_VARINT_MAX_BYTES = 64


# --- members --------------------------------------------------------------------------------


def pack_members(keys: Sequence[str]) -> bytes:
    """The group's member keys, in their order (duplicates kept), as one Binary attribute value."""
    if isinstance(keys, str):
        raise TypeError("pack_members takes a sequence of keys, not one key")
    encoded = _utf8_keys(keys)
    shared = _shared_prefixes(encoded)
    if _front_coded_saving_bytes(encoded, shared) > 0:
        return seal(HEADER_MEMBERS | FLAG_FRONT_CODED, _front_coded(encoded, shared), "members")
    return seal(HEADER_MEMBERS, _plain(encoded), "members")


def unpack_members(blob: bytes) -> list[str]:
    """The keys :func:`pack_members` was given, in order. Raises :class:`PackingError`."""
    header, payload = open_blob(blob, kind=0)
    reader = Reader(payload)
    count = reader.count("members")
    raw_keys: list[bytes] = []
    if header & FLAG_FRONT_CODED:
        previous = b""
        for index in range(count):
            shared = reader.varint()
            if shared > len(previous):
                raise PackingError(
                    f"member {index} shares {shared} bytes with a key of {len(previous)}"
                )
            previous = previous[:shared] + reader.take(reader.varint())
            raw_keys.append(previous)
    else:
        raw_keys.extend(reader.take(reader.varint()) for _ in range(count))
    reader.finish()
    try:
        return [key.decode("utf-8") for key in raw_keys]
    except UnicodeDecodeError as exc:
        raise PackingError("a member is not valid UTF-8") from exc


def members_size_bytes(keys: Sequence[str]) -> int:
    """The exact size of ``pack_members(keys)`` in bytes (it packs them).

    A cheap upper bound that grows key by key: 1 + varint(count) + the sum over keys of
    (varint(n) + n) for n UTF-8 bytes, the raw plain layout, which the encoder never exceeds.
    """
    return len(pack_members(keys))


def _utf8_keys(keys: Sequence[str]) -> list[bytes]:
    encoded: list[bytes] = []
    for key in keys:
        try:
            encoded.append(key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise PackingError(
                f"member {len(encoded)} has a lone surrogate at character {exc.start}: "
                "not Unicode text"
            ) from exc
    return encoded


def _shared_prefixes(encoded: list[bytes]) -> list[int]:
    """For each key, how many leading bytes it shares with the key before it."""
    shared = [0] * len(encoded)
    previous = b""
    guess = 0
    for index, key in enumerate(encoded):
        # most random keys differ in their first byte: decided without slicing
        if previous and key and previous[0] == key[0]:
            limit = len(previous) if len(previous) < len(key) else len(key)  # min() costs a call
            guess = guess if guess < limit else limit
            # the last shared length is the likeliest (keys that count up share their stem),
            # and checking it is cheaper than finding the first differing byte
            if key.startswith(previous[:guess]) and (
                guess == limit or previous[guess] != key[guess]
            ):
                shared[index] = guess
                previous = key
                continue
            head = key[:limit]
            if previous.startswith(head):
                guess = limit
            else:
                # the highest differing bit of the big-endian XOR lies in the first differing byte
                diff = int.from_bytes(previous[:limit], "big") ^ int.from_bytes(head, "big")
                guess = limit - 1 - (diff.bit_length() - 1) // 8
            shared[index] = guess
        previous = key
    return shared


def _front_coded_saving_bytes(encoded: list[bytes], shared: list[int]) -> int:
    """How many bytes smaller the front-coded payload is than the plain one (before zlib)."""
    if max(map(len, encoded), default=0) < 0x80:
        # every length and shared prefix is one varint byte: front coding costs one byte a
        # key (its shared length) and saves its shared bytes
        return sum(shared) - len(encoded)
    return sum(
        varint_size(len(key))
        + shared_bytes
        - varint_size(shared_bytes)
        - varint_size(len(key) - shared_bytes)
        for key, shared_bytes in zip(encoded, shared, strict=True)
    )


def _plain(encoded: list[bytes]) -> bytearray:
    payload = bytearray()
    put_varint(payload, len(encoded))
    for key in encoded:
        if len(key) < 0x80:
            payload.append(len(key))
        else:
            put_varint(payload, len(key))
        payload += key
    return payload


def _front_coded(encoded: list[bytes], shared: list[int]) -> bytearray:
    payload = bytearray()
    put_varint(payload, len(encoded))
    for key, shared_bytes in zip(encoded, shared, strict=True):
        suffix = key[shared_bytes:] if shared_bytes else key
        if len(key) < 0x80:  # so are both varints
            payload.append(shared_bytes)
            payload.append(len(suffix))
        else:
            put_varint(payload, shared_bytes)
            put_varint(payload, len(suffix))
        payload += suffix
    return payload


# --- positions ------------------------------------------------------------------------------


def pack_positions(count: int, positions: Mapping[int, Position]) -> bytes:
    """The positions known for a group of ``count`` members, by member index, as one Binary value.

    Members without a position (not settled yet) cost one byte before compression.
    """
    slots, tags, sequences, subs = _position_columns(count, positions)
    payload = bytearray()
    put_varint(payload, count)
    put_varint(payload, len(slots))
    for shard_id in slots:
        put_bytes(payload, utf8_text(shard_id, None, "shard id"))
    payload += varints(tags)
    payload += sequences
    payload += varints(subs)
    return seal(HEADER_POSITIONS, payload, "positions")


def _position_columns(
    count: int, positions: Mapping[int, Position]
) -> tuple[dict[str, int], list[int], bytearray, list[int]]:
    """The shard slots, and the tags, sequences and subs columns (module docstring).

    One loop over local names: it is most of the encoder's time (attribute lookups and calls
    cost as much as the arithmetic here)."""
    slots: dict[str, int] = {}
    tags = [0] * count  # 0: no position
    sequences = bytearray()
    append_sequence = sequences.append
    subs: list[int] = []
    # per shard slot, the last position whose sequence number was stored as an integer:
    # its string, its integer and its sub-sequence number
    last_strings: dict[int, str] = {}
    last_sequences: dict[int, int] = {}
    last_subs: dict[int, int | None] = {}
    for index in _storable_indexes(count, positions):
        position = positions[index]
        slot = slots.setdefault(position.shard_id, len(slots))
        sub = position.sub_sequence_number
        sequence_number = position.sequence_number
        last_string = last_strings.get(slot)
        expected_sub = 0
        if sequence_number == last_string:
            # the shard's last record again: the next user record of an aggregated record
            sequences.append(0)  # zigzag(0)
            previous_sub = last_subs[slot]
            if previous_sub is not None:
                expected_sub = previous_sub + 1
        elif (
            0 < len(sequence_number) <= MAX_SEQUENCE_DIGITS
            and sequence_number.isascii()
            # bytes.isdigit accepts ASCII 0-9 only, and is four times faster than str.isdigit
            and sequence_number.encode().isdigit()
            and (sequence_number[0] != "0" or len(sequence_number) == 1)
        ):
            sequence = int(sequence_number)
            if last_string is None:
                put_varint(sequences, sequence)  # the first of its shard, in full
            else:
                delta = sequence - last_sequences[slot]
                zigzag = delta << 1 if delta >= 0 else ((-delta) << 1) - 1
                while zigzag >= 0x80:  # put_varint inlined: a call costs as much as a byte
                    append_sequence((zigzag & 0x7F) | 0x80)
                    zigzag >>= 7
                append_sequence(zigzag)
            last_strings[slot] = sequence_number
            last_sequences[slot] = sequence
        else:
            # escaped: stored as its string; the shard's last position stays as it was
            tags[index] = 2 * slot + 2
            put_bytes(sequences, utf8_text(sequence_number, index, "sequence number"))
            subs.append(0 if sub is None else 2 * sub + 1)  # zigzag(sub - 0) + 1
            continue
        tags[index] = 2 * slot + 1
        last_subs[slot] = sub
        if sub is None:
            subs.append(0)
        else:
            residual = sub - expected_sub
            subs.append((residual << 1 if residual >= 0 else ((-residual) << 1) - 1) + 1)
    return slots, tags, sequences, subs


def unpack_positions(blob: bytes) -> dict[int, Position]:
    """The positions :func:`pack_positions` was given. Raises :class:`PackingError`."""
    _, payload = open_blob(blob, kind=FLAG_POSITIONS)
    reader = Reader(payload)
    count = reader.count("members")
    shard_ids = [
        decode_utf8(reader.take(reader.varint()), "shard id") for _ in range(reader.count("shards"))
    ]
    # (member index, 2 x shard slot + escaped) of every member with a position
    placed = [(index, tag - 1) for index, tag in enumerate(reader.varints(count)) if tag]
    sequence_numbers, sequences = _read_sequences(reader, placed, len(shard_ids))
    subs = _read_subs(reader.varints(len(placed)), placed, sequences)
    reader.finish()
    return {
        index: Position(shard_ids[code >> 1], sequence_number, sub)
        for (index, code), sequence_number, sub in zip(placed, sequence_numbers, subs, strict=True)
    }


def _read_sequences(
    reader: Reader, placed: list[tuple[int, int]], shard_count: int
) -> tuple[list[str], list[int | None]]:
    """The sequences column: each placed member's sequence number string, and its integer
    (None when the string was escaped)."""
    strings: list[str] = []
    sequences: list[int | None] = []
    last: list[int | None] = [None] * shard_count
    for index, code in placed:
        slot = code >> 1
        if slot >= shard_count:
            raise PackingError(f"member {index} names shard slot {slot} of {shard_count}")
        if code & 1:
            strings.append(decode_utf8(reader.take(reader.varint()), "sequence number"))
            sequences.append(None)
            continue
        value = reader.varint(_SEQUENCE_VARINT_MAX_BYTES)
        previous = last[slot]
        if previous is not None:
            value = previous + (value >> 1 if not value & 1 else -((value + 1) >> 1))
        if not 0 <= value < _SEQUENCE_LIMIT:
            raise PackingError(
                f"member {index} has a sequence number past {MAX_SEQUENCE_DIGITS} digits"
            )
        last[slot] = value
        strings.append(str(value))
        sequences.append(value)
    return strings, sequences


def _read_subs(
    values: list[int], placed: list[tuple[int, int]], sequences: list[int | None]
) -> list[int | None]:
    """The subs column: each placed member's sub-sequence number, predicted as it was packed."""
    subs: list[int | None] = []
    # per shard slot, the last member whose sequence number was stored as an integer
    last: dict[int, tuple[int, int | None]] = {}
    for value, (index, code), sequence in zip(values, placed, sequences, strict=True):
        expected_sub = 0
        if sequence is not None:
            previous = last.get(code >> 1)
            if previous is not None and previous[0] == sequence and previous[1] is not None:
                expected_sub = previous[1] + 1
        sub = None
        if value:
            residual = value - 1
            sub = expected_sub + (residual >> 1 if not residual & 1 else -((residual + 1) >> 1))
            if not 0 <= sub <= MAX_SUB_SEQUENCE_NUMBER:
                raise PackingError(f"member {index} has sub-sequence number {sub}, out of range")
        if sequence is not None:
            last[code >> 1] = (sequence, sub)
        subs.append(sub)
    return subs


def _storable_indexes(count: int, positions: Mapping[int, Position]) -> list[int]:
    """The member indexes of ``positions`` in order, once each is known to be inside the group
    and its sub-sequence number to fit a Java long."""
    if not 0 <= count <= MAX_PAYLOAD_BYTES:  # every member takes a byte of the payload
        raise PackingError(f"members count {count} is outside [0, {MAX_PAYLOAD_BYTES}]")
    indexes = sorted(positions)
    if indexes and not (indexes[0] >= 0 and indexes[-1] < count):
        bad = indexes[0] if indexes[0] < 0 else indexes[-1]
        raise PackingError(f"member index {bad} is outside [0, {count})")
    for index in indexes:
        sub = positions[index].sub_sequence_number
        if sub is not None and not 0 <= sub <= MAX_SUB_SEQUENCE_NUMBER:
            raise PackingError(
                f"member {index} has sub-sequence number {sub}, outside [0, {MAX_SUB_SEQUENCE_NUMBER}]"
            )
    return indexes
