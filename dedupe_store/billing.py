"""What AWS bills for DynamoDB requests: item sizes, write and read units, index writes.

Pure functions over items in DynamoDB's low-level wire format (``{"pk": {"S": "a"}}``), so the
bench can count what a workload would cost on AWS: emulators report no index writes, and
dynalite's ``ConsumedCapacity`` is not AWS's. Sizes are in bytes; a KB is 1024 bytes.

Item size (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html):
    item = sum over attributes of (UTF-8 bytes of the name) + (size of the value)
    S          UTF-8 bytes of the string
    N          1 byte per two significant digits, rounded up, + 1 byte; leading and trailing
               zeroes are trimmed. AWS calls this approximate and publishes nothing more exact,
               so this module implements the rule as written (the sign is not counted; zero is
               1 byte).
    B          raw bytes (the wire carries base64; the raw length counts)
    BOOL, NULL 1 byte
    L, M       3 bytes + for each element (1 byte + its size); a map element's size includes
               the UTF-8 bytes of its key
    SS, NS, BS the sum of the elements' sizes (no per-element overhead is documented)
    The 100 bytes per item "for indexing" on that page are storage overhead: they count
    toward the storage bill, not toward read or write units.

Write units (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/read-write-operations.html,
same rules in CapacityUnitCalculations.html above):
    units = ceil(size / 1 KB), at least 1.
    PutItem replacing an item and UpdateItem: the larger of the item before and after.
    DeleteItem: the item before (1 unit if it did not exist).
    BatchWriteItem: each put or delete on its own, each rounded up on its own.
    A failed condition still costs: the size of the existing item, or 1 unit if there is none;
    nothing is written, so no index is touched.

Read units (same pages):
    strongly consistent: ceil(size / 4 KB), at least 1; eventually consistent: half of that.
    GetItem, and each item of BatchGetItem, rounded on its own; an item that does not exist
    still costs the minimum. Query and Scan: the sizes of all items summed, then rounded up
    once (Scan counts the items it evaluated, which a filter can make more than it returns).
    A projection does not lower the cost: the whole item is read.

Global secondary indexes (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/GSI.html,
sections "Provisioned Throughput Considerations for Global Secondary Indexes: Write Capacity
Units" and "Storage Considerations for Global Secondary Indexes"). An item is in an index
when it has the index's hash key attribute (and its range key attribute, if any). Per write:
    enters the index                         1 index write (a put of the new entry)
    leaves the index                         1 index write (a delete of the old entry)
    an index key value changes, stays in     2 index writes (delete the old, put the new)
    only projected attributes change         1 index write
    not in the index before or after, or
    nothing projected changes                0
    Each index write is rounded up to 1 KB on its own, like a table write, on the size of the
    entry it writes or deletes. An entry holds the table's primary key, the index key
    attributes and the projected attributes (KEYS_ONLY: none more; INCLUDE: the named ones;
    ALL: every attribute). AWS lists "100 bytes of overhead per index item" under storage,
    not throughput, so :func:`index_entry_size_bytes` leaves it out and
    :func:`index_entry_storage_bytes` adds it.
    An update that only changes projected attributes is costed like a table update: the
    larger of the entry before and after (AWS documents one write, not which size).

Not modelled: transactions (2x), local secondary indexes, global tables' replicated writes.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation
from enum import StrEnum
from typing import Any, Final, TypeAlias

Item: TypeAlias = Mapping[str, Any]
"""An item in the wire format: attribute name -> ``{"S": ...}``, ``{"N": ...}``, ..."""

WRITE_UNIT_BYTES: Final = 1024
READ_UNIT_BYTES: Final = 4096
LIST_MAP_OVERHEAD_BYTES: Final = 3
NESTED_ELEMENT_OVERHEAD_BYTES: Final = 1
BOOL_NULL_BYTES: Final = 1
INDEX_ENTRY_STORAGE_OVERHEAD_BYTES: Final = 100

# DynamoDB numbers have up to 38 significant digits; the default context would round at 28
_EXACT: Final = Context(prec=40)


class Consistency(StrEnum):
    """How a read is made: a strongly consistent read costs twice an eventually consistent one."""

    STRONG = "strong"
    EVENTUAL = "eventual"


class Projection(StrEnum):
    """Which attributes a global secondary index copies, beyond the table and index keys."""

    KEYS_ONLY = "KEYS_ONLY"
    INCLUDE = "INCLUDE"
    ALL = "ALL"


class IndexChange(StrEnum):
    """What one table write does to one index; it decides the number of index writes."""

    NONE = "none"
    ENTERS = "enters"
    LEAVES = "leaves"
    KEY_CHANGES = "key_changes"
    PROJECTION_CHANGES = "projection_changes"


_INDEX_WRITES: Final[Mapping[IndexChange, int]] = {
    IndexChange.NONE: 0,
    IndexChange.ENTERS: 1,
    IndexChange.LEAVES: 1,
    IndexChange.KEY_CHANGES: 2,
    IndexChange.PROJECTION_CHANGES: 1,
}


@dataclass(frozen=True, slots=True)
class IndexSpec:
    """One global secondary index: its key attributes and what it projects."""

    name: str
    hash_key: str
    range_key: str | None = None
    projection: Projection = Projection.KEYS_ONLY
    non_key_attributes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.non_key_attributes and self.projection is not Projection.INCLUDE:
            raise ValueError(
                f"index {self.name!r}: non-key attributes are projected only with INCLUDE"
            )

    @property
    def key_attributes(self) -> tuple[str, ...]:
        return (self.hash_key,) if self.range_key is None else (self.hash_key, self.range_key)


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A table's primary key and global secondary indexes: all billing needs of its schema."""

    hash_key: str
    range_key: str | None = None
    indexes: tuple[IndexSpec, ...] = ()

    @property
    def key_attributes(self) -> tuple[str, ...]:
        return (self.hash_key,) if self.range_key is None else (self.hash_key, self.range_key)

    def key_of(self, item: Item) -> dict[str, Any]:
        """The primary key of ``item`` (a full item or a ``Key`` parameter)."""
        missing = [name for name in self.key_attributes if name not in item]
        if missing:
            raise ValueError(f"item lacks primary key attributes {missing}")
        return {name: item[name] for name in self.key_attributes}


@dataclass(frozen=True, slots=True)
class IndexWrite:
    """What one table write costs one index."""

    index_name: str
    change: IndexChange
    writes: int
    units: int


@dataclass(frozen=True, slots=True)
class WriteCost:
    """Write units for the table, and for its indexes (``index_writes`` operations in all)."""

    table_units: int
    index_units: int
    index_writes: int = 0

    @property
    def units(self) -> int:
        return self.table_units + self.index_units

    def __add__(self, other: WriteCost) -> WriteCost:
        return WriteCost(
            self.table_units + other.table_units,
            self.index_units + other.index_units,
            self.index_writes + other.index_writes,
        )


@dataclass(frozen=True, slots=True)
class ReadCost:
    """Read units; eventually consistent reads make halves, so this is a float."""

    units: float

    def __add__(self, other: ReadCost) -> ReadCost:
        return ReadCost(self.units + other.units)


# --- sizes ------------------------------------------------------------------------------------


def item_size_bytes(item: Item) -> int:
    """The size AWS bills for ``item``: names plus values, by the rules in the module docstring."""
    return sum(_utf8_len(name) + attribute_value_size_bytes(value) for name, value in item.items())


def attribute_value_size_bytes(value: Mapping[str, Any]) -> int:
    """The size of one typed value (``{"S": "abc"}`` is 3 bytes), without its name."""
    if len(value) != 1:
        raise ValueError(f"not a DynamoDB attribute value: {sorted(value)}")
    ((kind, payload),) = value.items()
    match kind:
        case "S":
            return _utf8_len(payload)
        case "N":
            return number_size_bytes(payload)
        case "B":
            return binary_size_bytes(payload)
        case "BOOL" | "NULL":
            return BOOL_NULL_BYTES
        case "SS":
            return sum(_utf8_len(element) for element in payload)
        case "NS":
            return sum(number_size_bytes(element) for element in payload)
        case "BS":
            return sum(binary_size_bytes(element) for element in payload)
        case "L":
            return LIST_MAP_OVERHEAD_BYTES + sum(
                NESTED_ELEMENT_OVERHEAD_BYTES + attribute_value_size_bytes(element)
                for element in payload
            )
        case "M":
            return LIST_MAP_OVERHEAD_BYTES + sum(
                NESTED_ELEMENT_OVERHEAD_BYTES
                + _utf8_len(name)
                + attribute_value_size_bytes(element)
                for name, element in payload.items()
            )
        case _:
            raise ValueError(f"unknown DynamoDB type descriptor {kind!r}")


def number_size_bytes(text: str) -> int:
    """``ceil(significant digits / 2) + 1``: "12" and "0.0012" are 2 bytes, "123" is 3."""
    return math.ceil(_significant_digit_count(text) / 2) + 1


def binary_size_bytes(value: bytes | bytearray | memoryview | str) -> int:
    """Raw length. ``str`` is base64 text (a raw item from an error response may carry it)."""
    if isinstance(value, str):
        try:
            return len(base64.b64decode(value, validate=True))
        except binascii.Error as exc:
            raise ValueError("binary value is neither bytes nor base64 text") from exc
    return len(value)


def _significant_digit_count(text: str) -> int:
    number = _decimal(text)
    # Decimal(text) is exact (no rounding to a context); it keeps trailing zeroes, not leading
    return len("".join(str(digit) for digit in number.as_tuple().digits).strip("0"))


def _decimal(text: str) -> Decimal:
    try:
        number = Decimal(text)
    except InvalidOperation as exc:
        raise ValueError(f"not a DynamoDB number: {text!r}") from exc
    if not number.is_finite():
        raise ValueError(f"not a DynamoDB number: {text!r}")
    return number


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


# --- units ------------------------------------------------------------------------------------


def write_units(size_bytes: int) -> int:
    """Units for writing ``size_bytes``: rounded up to 1 KB, at least 1."""
    return max(1, math.ceil(size_bytes / WRITE_UNIT_BYTES))


def read_units(size_bytes: int, consistency: Consistency) -> float:
    """Units for reading ``size_bytes``: rounded up to 4 KB, at least 1; eventual reads half."""
    strong = max(1, math.ceil(size_bytes / READ_UNIT_BYTES))
    return float(strong) if consistency is Consistency.STRONG else strong / 2


def get_item_read_cost(item: Item | None, consistency: Consistency) -> ReadCost:
    """GetItem: the item's size; an absent item still costs the minimum."""
    return ReadCost(read_units(item_size_bytes(item) if item is not None else 0, consistency))


def batch_get_read_cost(items: Iterable[Item | None], consistency: Consistency) -> ReadCost:
    """BatchGetItem: each requested key as its own GetItem (``None`` for a key not found)."""
    return sum((get_item_read_cost(item, consistency) for item in items), ReadCost(0.0))


def query_read_cost(items: Iterable[Item], consistency: Consistency) -> ReadCost:
    """Query or Scan: the items' sizes summed, rounded up once. Pass the items evaluated."""
    return ReadCost(read_units(sum(item_size_bytes(item) for item in items), consistency))


# --- indexes ----------------------------------------------------------------------------------


def index_entry(table: TableSpec, index: IndexSpec, item: Item | None) -> dict[str, Any] | None:
    """The entry ``item`` has in ``index``, or None when it lacks an index key attribute."""
    if item is None or any(name not in item for name in index.key_attributes):
        return None
    match index.projection:
        case Projection.ALL:
            names: Iterable[str] = item.keys()
        case Projection.INCLUDE:
            names = (*table.key_attributes, *index.key_attributes, *index.non_key_attributes)
        case Projection.KEYS_ONLY:
            names = (*table.key_attributes, *index.key_attributes)
    return {name: item[name] for name in names if name in item}


def index_entry_size_bytes(table: TableSpec, index: IndexSpec, item: Item) -> int:
    """The size an index write of ``item``'s entry is billed on (0 if not in the index)."""
    entry = index_entry(table, index, item)
    return 0 if entry is None else item_size_bytes(entry)


def index_entry_storage_bytes(table: TableSpec, index: IndexSpec, item: Item) -> int:
    """The bytes ``item``'s entry is billed for in storage: its size + 100 bytes of overhead."""
    entry = index_entry(table, index, item)
    return 0 if entry is None else item_size_bytes(entry) + INDEX_ENTRY_STORAGE_OVERHEAD_BYTES


def index_write(
    table: TableSpec, index: IndexSpec, before: Item | None, after: Item | None
) -> IndexWrite:
    """What a table write from ``before`` to ``after`` (None: no item) costs ``index``."""
    old = index_entry(table, index, before)
    new = index_entry(table, index, after)
    if old is None:
        if new is None:
            return IndexWrite(index.name, IndexChange.NONE, 0, 0)
        return _index_write(index, IndexChange.ENTERS, write_units(item_size_bytes(new)))
    if new is None:
        return _index_write(index, IndexChange.LEAVES, write_units(item_size_bytes(old)))
    if any(_canonical(old[name]) != _canonical(new[name]) for name in index.key_attributes):
        units = write_units(item_size_bytes(old)) + write_units(item_size_bytes(new))
        return _index_write(index, IndexChange.KEY_CHANGES, units)
    if _canonical_item(old) != _canonical_item(new):
        larger = max(item_size_bytes(old), item_size_bytes(new))
        return _index_write(index, IndexChange.PROJECTION_CHANGES, write_units(larger))
    return IndexWrite(index.name, IndexChange.NONE, 0, 0)


def _index_write(index: IndexSpec, change: IndexChange, units: int) -> IndexWrite:
    return IndexWrite(index.name, change, _INDEX_WRITES[change], units)


# --- writes -----------------------------------------------------------------------------------


def write_cost(
    table: TableSpec,
    before: Item | None,
    after: Item | None,
    *,
    condition_failed: bool = False,
) -> WriteCost:
    """What one PutItem, UpdateItem or DeleteItem costs, table and indexes.

    ``before`` is the item as it was (None: absent), ``after`` as the write leaves it (None:
    deleted). With ``condition_failed`` nothing was written: ``after`` is ignored, the table
    is billed for the existing item (at least 1 unit) and no index is touched.
    """
    if condition_failed:
        return WriteCost(write_units(item_size_bytes(before) if before is not None else 0), 0)
    larger = max(
        item_size_bytes(before) if before is not None else 0,
        item_size_bytes(after) if after is not None else 0,
    )
    index_writes = [index_write(table, index, before, after) for index in table.indexes]
    return WriteCost(
        table_units=write_units(larger),
        index_units=sum(w.units for w in index_writes),
        index_writes=sum(w.writes for w in index_writes),
    )


# --- schema -----------------------------------------------------------------------------------


def table_spec_from_description(description: Mapping[str, Any]) -> TableSpec:
    """The billing view of a ``DescribeTable`` response's ``Table``.

    Local secondary indexes are refused rather than ignored: their writes would go unbilled.
    """
    if description.get("LocalSecondaryIndexes"):
        raise ValueError("local secondary indexes are not modelled")
    hash_key, range_key = _key_schema(description["KeySchema"])
    indexes = tuple(
        _index_from_description(index) for index in description.get("GlobalSecondaryIndexes", ())
    )
    return TableSpec(hash_key=hash_key, range_key=range_key, indexes=indexes)


def _index_from_description(index: Mapping[str, Any]) -> IndexSpec:
    hash_key, range_key = _key_schema(index["KeySchema"])
    projection = index.get("Projection", {})
    return IndexSpec(
        name=index["IndexName"],
        hash_key=hash_key,
        range_key=range_key,
        projection=Projection(projection.get("ProjectionType", Projection.KEYS_ONLY)),
        non_key_attributes=frozenset(projection.get("NonKeyAttributes", ())),
    )


def _key_schema(elements: Iterable[Mapping[str, str]]) -> tuple[str, str | None]:
    by_type = {element["KeyType"]: element["AttributeName"] for element in elements}
    return by_type["HASH"], by_type.get("RANGE")


# --- value equality ---------------------------------------------------------------------------


def _canonical_item(item: Item) -> dict[str, Any]:
    return {name: _canonical(value) for name, value in item.items()}


def _canonical(value: Mapping[str, Any]) -> Any:
    """A comparable form: "1.0" equals "1", base64 text equals its bytes, sets are unordered."""
    ((kind, payload),) = value.items()
    match kind:
        case "N":
            return ("N", _decimal(payload).normalize(_EXACT))
        case "B":
            return ("B", _raw(payload))
        case "SS":
            return ("SS", frozenset(payload))
        case "NS":
            return ("NS", frozenset(_decimal(element).normalize(_EXACT) for element in payload))
        case "BS":
            return ("BS", frozenset(_raw(element) for element in payload))
        case "L":
            return ("L", tuple(_canonical(element) for element in payload))
        case "M":
            return ("M", {name: _canonical(element) for name, element in payload.items()})
        case _:
            return (kind, payload)


def _raw(value: bytes | bytearray | memoryview | str) -> bytes:
    return base64.b64decode(value) if isinstance(value, str) else bytes(value)
