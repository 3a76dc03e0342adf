"""The bytes of the packed format (:mod:`dedupe_store.packing` draws it): the envelope, varints, UTF-8.

The envelope is the header byte and the payload, kept as it is or as a zlib stream, whichever
is smaller; :func:`seal` writes it and :func:`open_blob` reads it, refusing any header the
format does not define. Integers are unsigned LEB128 varints, read back by :class:`Reader`, a
cursor that refuses every overrun. Every refusal is a :class:`PackingError`. Pure, stdlib only.
"""

from __future__ import annotations

import zlib

from dedupe_store.errors import LedgerError

__all__ = [
    "FLAG_FRONT_CODED",
    "FLAG_POSITIONS",
    "FORMAT_VERSION",
    "HEADER_MEMBERS",
    "HEADER_POSITIONS",
    "MAX_PAYLOAD_BYTES",
    "ZLIB_LEVEL",
    "PackingError",
    "Reader",
    "decode_utf8",
    "open_blob",
    "put_bytes",
    "put_varint",
    "seal",
    "utf8_text",
    "varint_size",
    "varints",
]

FORMAT_VERSION = 1
# bounds the decoder's memory on a hostile blob (a DynamoDB item is at most 400 KB, and
# 500 keys of 256 four-byte characters are 514 KB raw); the encoder refuses what it bounds
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
ZLIB_LEVEL = 6
_PROBE_BYTES = 4096  # the head of a large payload that decides whether level 6 is worth it

_FLAG_ZLIB = 0x01
FLAG_FRONT_CODED = 0x02
_FLAG_RESERVED = 0x04
FLAG_POSITIONS = 0x08
HEADER_MEMBERS = FORMAT_VERSION << 4
HEADER_POSITIONS = FORMAT_VERSION << 4 | FLAG_POSITIONS

# varint lengths the decoder accepts: a longer varint is corrupt, and would cost quadratic time
_SMALL_VARINT_MAX_BYTES = 10  # up to 2**70: counts, lengths, tags, sub-sequence numbers


class PackingError(LedgerError, ValueError):
    """A blob that is corrupt or of an unknown format version, or an input that cannot be packed.

    A ledger error (a corrupt group item is not a settings problem), and a ValueError for
    callers that catch those."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- the envelope: header byte, optional zlib -----------------------------------------------


def seal(header: int, payload: bytearray, what: str) -> bytes:
    """The blob of a payload: its header byte, then the payload or its zlib stream."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise PackingError(f"{what} take {len(payload)} bytes, over {MAX_PAYLOAD_BYTES}")
    compressed = _compress(payload)
    if len(compressed) < len(payload):
        return bytes((header | _FLAG_ZLIB,)) + compressed
    return bytes((header,)) + payload


def _compress(payload: bytearray) -> bytes:
    """The smaller of two zlib streams: Huffman coding only, or deflate at ``ZLIB_LEVEL``.

    Random keys (UUIDs) have no repeats worth a match: Huffman coding alone packs them 10 %
    smaller than level 6 deflate, in a quarter of the time. On a payload over
    ``_PROBE_BYTES``, level 1 deflate of its head is a cheap probe for repeats: level 6 is spent
    only when the probe packs tighter than Huffman coding did.
    """
    huffman = zlib.compressobj(ZLIB_LEVEL, zlib.DEFLATED, 15, 9, zlib.Z_HUFFMAN_ONLY)
    smallest = huffman.compress(payload) + huffman.flush()
    if len(payload) > _PROBE_BYTES:
        head = bytes(payload[:_PROBE_BYTES])
        if len(zlib.compress(head, 1)) * len(payload) >= len(smallest) * len(head):
            return smallest
    return min(smallest, zlib.compress(payload, ZLIB_LEVEL), key=len)


def open_blob(blob: bytes, *, kind: int) -> tuple[int, bytes]:
    """The header byte and the (decompressed) payload of a blob of ``kind``."""
    if not blob:
        raise PackingError("empty blob")
    header = blob[0]
    version = header >> 4
    if version != FORMAT_VERSION:
        raise PackingError(f"unknown format version {version}")
    if header & _FLAG_RESERVED:
        raise PackingError("reserved header bit set")
    if header & FLAG_POSITIONS != kind:
        raise PackingError("a positions blob, not members" if kind == 0 else "a members blob")
    if kind and header & FLAG_FRONT_CODED:
        raise PackingError("front coding flag on a positions blob")
    body = blob[1:]
    if not header & _FLAG_ZLIB:
        if len(body) > MAX_PAYLOAD_BYTES:
            raise PackingError(f"payload over {MAX_PAYLOAD_BYTES} bytes")
        return header, body
    inflater = zlib.decompressobj()
    try:
        payload = inflater.decompress(body, MAX_PAYLOAD_BYTES + 1)
    except zlib.error as exc:
        raise PackingError(f"corrupt compressed payload: {exc}") from exc
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise PackingError(f"payload inflates to over {MAX_PAYLOAD_BYTES} bytes")
    if not inflater.eof:
        raise PackingError("truncated compressed payload")
    if inflater.unused_data:
        raise PackingError("bytes after the compressed payload")
    return header, payload


# --- varints and UTF-8 ----------------------------------------------------------------------


def put_varint(out: bytearray, value: int) -> None:
    """Appends ``value`` as a varint."""
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def varint_size(value: int) -> int:
    """How many bytes ``value`` takes as a varint."""
    return max(1, (value.bit_length() + 6) // 7)


def varints(values: list[int]) -> bytes:
    """A column of varints."""
    if max(values, default=0) < 0x80:
        return bytes(values)  # the usual column: one byte a value, built in C
    out = bytearray()
    for value in values:
        put_varint(out, value)
    return bytes(out)


def put_bytes(out: bytearray, raw: bytes) -> None:
    """Appends ``raw`` after its length as a varint."""
    put_varint(out, len(raw))
    out += raw


def utf8_text(text: str, index: int | None, what: str) -> bytes:
    """``text`` in UTF-8; a lone surrogate is refused, naming the member ``index`` when given."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = f"member {index}'s " if index is not None else ""
        raise PackingError(f"{where}{what} has a lone surrogate: not Unicode text") from exc


def decode_utf8(raw: bytes, what: str) -> str:
    """The text of ``raw``; bytes that are not UTF-8 are refused."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackingError(f"a {what} is not valid UTF-8") from exc


class Reader:
    """A cursor over a payload; every overrun is a :class:`PackingError`."""

    __slots__ = ("_data", "_offset")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._offset = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._offset

    def count(self, what: str) -> int:
        """A count of things that take at least a byte each: never more than the bytes left."""
        count = self.varint()
        if count > len(self._data) - self._offset:
            raise PackingError(f"{what} count {count} exceeds the payload")
        return count

    def varint(self, max_bytes: int = _SMALL_VARINT_MAX_BYTES) -> int:
        data = self._data
        offset = self._offset
        if offset < len(data) and data[offset] < 0x80:  # most varints are one byte
            self._offset = offset + 1
            return data[offset]
        end = min(len(data), offset + max_bytes)
        value = 0
        shift = 0
        while offset < end:
            byte = data[offset]
            offset += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self._offset = offset
                return value
            shift += 7
        if end == len(data):
            raise PackingError("truncated varint")
        raise PackingError(f"varint longer than {max_bytes} bytes")

    def varints(self, count: int) -> list[int]:
        """``count`` small varints: a column of them."""
        chunk = self._data[self._offset : self._offset + count]
        if len(chunk) == count and (not chunk or max(chunk) < 0x80):
            self._offset += count  # the usual column: one byte each, read in C
            return list(chunk)
        return [self.varint() for _ in range(count)]

    def take(self, size: int) -> bytes:
        end = self._offset + size
        if end > len(self._data):
            raise PackingError(f"{size} bytes wanted, {self.remaining} left")
        chunk = self._data[self._offset : end]
        self._offset = end
        return chunk

    def finish(self) -> None:
        if self._offset != len(self._data):
            raise PackingError(f"{self.remaining} bytes after the payload")
