"""The billing model against AWS's published rules and worked examples.

Sources, quoted in each test:
- CAP: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html
- RW:  https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/read-write-operations.html
- GSI: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/GSI.html
  ("Provisioned Throughput Considerations", "Storage Considerations")

A KB is 1024 bytes throughout, as in AWS's examples.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupe_store.billing import (
    Consistency,
    IndexChange,
    IndexSpec,
    Item,
    Projection,
    ReadCost,
    TableSpec,
    WriteCost,
    attribute_value_size_bytes,
    batch_get_read_cost,
    get_item_read_cost,
    index_entry,
    index_entry_size_bytes,
    index_entry_storage_bytes,
    index_write,
    item_size_bytes,
    number_size_bytes,
    query_read_cost,
    read_units,
    table_spec_from_description,
    write_cost,
    write_units,
)

KB = 1024
STRONG = Consistency.STRONG
EVENTUAL = Consistency.EVENTUAL

# the ledger's schema (dedupe_store/model.py): a sparse, KEYS_ONLY in-flight index
INFLIGHT = IndexSpec(
    name="inflight-index",
    hash_key="inflight_bucket",
    range_key="lease_expires_at_ms",
    projection=Projection.KEYS_ONLY,
)
LEDGER = TableSpec(hash_key="pk", indexes=(INFLIGHT,))
NO_INDEXES = TableSpec(hash_key="pk")


def item_of_size(size_bytes: int, pk: str = "k") -> dict[str, Any]:
    """An item of exactly ``size_bytes``: "pk" + its value, and a filler string "f"."""
    fixed = len("pk") + len(pk) + len("f")
    assert size_bytes >= fixed
    return {"pk": {"S": pk}, "f": {"S": "x" * (size_bytes - fixed)}}


# --- item size (CAP) --------------------------------------------------------------------------


def test_a_string_counts_the_utf8_bytes_of_its_name_and_value() -> None:
    """GIVEN a string attribute with a multi-byte character in its name and its value
    WHEN its size is computed
    THEN name and value count in UTF-8 bytes, not characters (CAP: "Strings")."""
    item = {"näme": {"S": "€1"}}  # "ä" is 2 bytes, "€" is 3
    assert item_size_bytes(item) == 5 + 4


@pytest.mark.parametrize(
    ("number", "size_bytes"),
    [
        pytest.param("7", 2, id="one digit"),
        pytest.param("12", 2, id="two digits"),
        pytest.param("123", 3, id="three digits"),
        pytest.param("1200", 2, id="trailing zeroes trimmed"),
        pytest.param("0.0012", 2, id="leading zeroes trimmed"),
        pytest.param("1.50", 2, id="trailing decimal zero trimmed"),
        pytest.param("-123.45", 4, id="sign not counted"),
        pytest.param("1E+5", 2, id="exponent notation"),
        pytest.param("1732345678901", 8, id="epoch milliseconds"),
        pytest.param("1" * 38, 20, id="38 significant digits"),
        pytest.param("0", 1, id="zero"),
    ],
)
def test_a_number_is_one_byte_per_two_significant_digits_plus_one(
    number: str, size_bytes: int
) -> None:
    """GIVEN a number
    WHEN its size is computed
    THEN it is ceil(significant digits / 2) + 1 bytes, leading and trailing zeroes trimmed
    (CAP: "Numbers")."""
    assert number_size_bytes(number) == size_bytes


def test_a_binary_counts_raw_bytes_whether_given_as_bytes_or_base64_text() -> None:
    """GIVEN the same 4 raw bytes as bytes (botocore) and as base64 text (a raw error body)
    WHEN their size is computed
    THEN both count the 4 raw bytes, not the 8 base64 characters (CAP: "binary value")."""
    assert attribute_value_size_bytes({"B": b"\x00\x01\x02\x03"}) == 4
    assert attribute_value_size_bytes({"B": "AAECAw=="}) == 4


def test_bool_and_null_are_one_byte() -> None:
    """GIVEN a Boolean and a null attribute
    WHEN their sizes are computed
    THEN each is its name + 1 byte (CAP: "null attribute or a Boolean attribute")."""
    assert item_size_bytes({"ok": {"BOOL": False}, "no": {"NULL": True}}) == (2 + 1) + (2 + 1)


def test_lists_and_maps_cost_3_bytes_plus_1_byte_per_element() -> None:
    """GIVEN an empty list, a list of two elements and a map of one element
    WHEN their sizes are computed
    THEN each is 3 bytes + for each element 1 byte + its size, a map element's size including
    its key (CAP: "List or Map requires 3 bytes of overhead", "each element ... 1 byte")."""
    assert attribute_value_size_bytes({"L": []}) == 3
    assert attribute_value_size_bytes({"M": {}}) == 3
    assert attribute_value_size_bytes({"L": [{"S": "ab"}, {"N": "12"}]}) == 3 + (1 + 2) + (1 + 2)
    assert attribute_value_size_bytes({"M": {"key": {"S": "ab"}}}) == 3 + (1 + 3 + 2)


def test_nested_containers_add_their_overheads_at_each_level() -> None:
    """GIVEN a map holding a list holding a Boolean
    WHEN its size is computed
    THEN each level adds its 3 bytes and each element its 1 byte."""
    value = {"M": {"l": {"L": [{"BOOL": True}]}}}
    inner_list = 3 + (1 + 1)
    assert attribute_value_size_bytes(value) == 3 + (1 + len("l") + inner_list)


def test_sets_are_the_sum_of_their_elements() -> None:
    """GIVEN a string set, a number set and a binary set
    WHEN their sizes are computed
    THEN each is the sum of its elements' sizes."""
    assert attribute_value_size_bytes({"SS": ["a", "bcd"]}) == 4
    assert attribute_value_size_bytes({"NS": ["12", "123"]}) == 2 + 3
    assert attribute_value_size_bytes({"BS": [b"ab", "AAE="]}) == 2 + 2


def test_a_ledger_key_item_has_the_size_of_its_names_and_values() -> None:
    """GIVEN an in-flight ledger item as the claim writes it
    WHEN its size is computed
    THEN it is the sum of every name and value, worked out here by hand."""
    item = {
        "pk": {"S": "orders#k-1"},  # 2 + 10
        "state": {"S": "IN_FLIGHT"},  # 5 + 9
        "attempt": {"N": "1"},  # 7 + 2
        "inflight_bucket": {"S": "orders#3"},  # 15 + 8
        "lease_expires_at_ms": {"N": "1732345678901"},  # 19 + 8
        "payload": {"B": b"hello"},  # 7 + 5
    }
    assert item_size_bytes(item) == 12 + 14 + 9 + 23 + 27 + 12


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"X": "1"}, id="unknown type"),
        pytest.param({"N": "one"}, id="not a number"),
        pytest.param({"S": "a", "N": "1"}, id="two types"),
        pytest.param({"B": "not base64!"}, id="not base64"),
    ],
)
def test_a_malformed_value_is_refused(value: dict[str, Any]) -> None:
    """GIVEN a value that is not DynamoDB's wire format
    WHEN its size is asked
    THEN a ValueError says so rather than a guess."""
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies by the defect
        attribute_value_size_bytes(value)


# --- write units (CAP, RW) --------------------------------------------------------------------


def test_a_3_5_kb_item_costs_4_write_units() -> None:
    """GIVEN a new 3.5 KB item
    WHEN it is put
    THEN it costs 4 write units: sizes round up to the next 1 KB."""
    assert write_cost(NO_INDEXES, None, item_of_size(3584)) == WriteCost(4, 0)


def test_a_1_6_kb_put_or_delete_costs_2_write_units() -> None:
    """GIVEN a 1.6 KB item
    WHEN it is put, then deleted
    THEN each costs 2 units (CAP: "if you put or delete an item of 1.6 KB, DynamoDB rounds
    the item size up to 2 KB")."""
    item = item_of_size(round(1.6 * KB))
    assert write_cost(NO_INDEXES, None, item).table_units == 2
    assert write_cost(NO_INDEXES, item, None).table_units == 2


def test_a_tiny_write_costs_one_unit_and_a_delete_of_nothing_too() -> None:
    """GIVEN a 10-byte item, and a key with no item
    WHEN the item is put and the absent key deleted
    THEN each costs the minimum of 1 unit."""
    assert write_units(10) == 1
    assert write_cost(NO_INDEXES, None, item_of_size(10)).table_units == 1
    assert write_cost(NO_INDEXES, None, None).table_units == 1


@pytest.mark.parametrize(
    ("before_bytes", "after_bytes", "units"),
    [
        pytest.param(3 * KB, KB // 2, 3, id="shrinking update costs the old size"),
        pytest.param(KB // 2, 3 * KB, 3, id="growing update costs the new size"),
        pytest.param(2 * KB, 2 * KB, 2, id="same size"),
    ],
)
def test_an_update_or_replacing_put_costs_the_larger_image(
    before_bytes: int, after_bytes: int, units: int
) -> None:
    """GIVEN an item before and after an UpdateItem (or a PutItem replacing it)
    WHEN the write is costed
    THEN it costs the larger of the two sizes (CAP: "the larger of these item sizes"; for
    PutItem "the item size that matters is the larger of the two")."""
    before, after = item_of_size(before_bytes), item_of_size(after_bytes)
    assert write_cost(NO_INDEXES, before, after).table_units == units


def test_batch_write_rounds_each_item_on_its_own() -> None:
    """GIVEN a BatchWriteItem of a 500-byte item and a 3.5 KB item
    WHEN it is costed as its puts
    THEN it costs 5 units (1 + 4), not 4 (CAP: "DynamoDB will calculate the size as 5 KB")."""
    puts = [item_of_size(500, "a"), item_of_size(3584, "b")]
    total = sum((write_cost(NO_INDEXES, None, item) for item in puts), WriteCost(0, 0))
    assert total.table_units == 5


@pytest.mark.parametrize(
    ("existing_bytes", "units"),
    [
        pytest.param(KB, 1, id="a 1 KB item costs 1"),
        pytest.param(2 * KB, 2, id="twice that size costs 2"),
        pytest.param(None, 1, id="no item costs 1"),
    ],
)
def test_a_failed_conditional_write_still_costs(existing_bytes: int | None, units: int) -> None:
    """GIVEN an UpdateItem whose condition fails against the existing item (or no item)
    WHEN it is costed
    THEN it costs the existing item's size, at least 1 unit, and no index write (CAP: "a
    failed conditional write of a 1 KB item would consume one write capacity unit; if the
    item were twice that size ... two"; "If the item does not exist ... one")."""
    existing = None if existing_bytes is None else item_of_size(existing_bytes)
    would_write = {**item_of_size(5 * KB), "inflight_bucket": {"S": "orders#1"}}
    cost = write_cost(LEDGER, existing, would_write, condition_failed=True)
    assert cost == WriteCost(table_units=units, index_units=0, index_writes=0)


# --- read units (CAP, RW, GSI) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("size_bytes", "strong", "eventual"),
    [
        pytest.param(3500, 1.0, 0.5, id="3,500 bytes reads as 4 KB"),
        pytest.param(7 * KB, 2.0, 1.0, id="7 KB"),
        pytest.param(8 * KB, 2.0, 1.0, id="8 KB"),
        pytest.param(10 * KB, 3.0, 1.5, id="10 KB rounds to 12 KB"),
        pytest.param(80 * KB, 20.0, 10.0, id="80 KB"),
    ],
)
def test_a_read_rounds_up_to_4_kb_and_an_eventual_read_costs_half(
    size_bytes: int, strong: float, eventual: float
) -> None:
    """GIVEN an item of a published size
    WHEN it is read with GetItem, strongly and eventually consistent
    THEN it costs one unit per 4 KB rounded up, half that when eventual (RW: "reading a
    3,500-byte item consumes the same throughput as reading a 4 KB item", "8 KB ... 2 read
    units ... eventually consistent ... 1"; CAP: "10 KB ... 12 KB", "80 KB ... 10")."""
    item = item_of_size(size_bytes)
    assert get_item_read_cost(item, STRONG) == ReadCost(strong)
    assert get_item_read_cost(item, EVENTUAL) == ReadCost(eventual)


def test_reading_an_absent_item_costs_the_minimum() -> None:
    """GIVEN a key with no item
    WHEN it is read
    THEN it costs 1 unit strongly consistent, 0.5 eventually (CAP: "If you perform a read
    operation on an item that does not exist, DynamoDB will still consume ...")."""
    assert get_item_read_cost(None, STRONG) == ReadCost(1.0)
    assert get_item_read_cost(None, EVENTUAL) == ReadCost(0.5)


def test_batch_get_rounds_each_item_on_its_own() -> None:
    """GIVEN a BatchGetItem returning a 1.5 KB and a 6.5 KB item
    WHEN it is costed strongly consistent
    THEN it costs 12 KB worth, 3 units, not 8 KB (CAP: "4 KB + 8 KB")."""
    items = [item_of_size(round(1.5 * KB), "a"), item_of_size(round(6.5 * KB), "b")]
    assert batch_get_read_cost(items, STRONG) == ReadCost(3.0)


def test_a_query_sums_its_items_then_rounds_once() -> None:
    """GIVEN a Query returning 10 items of 40.8 KB together, and one returning 1500 items of
    64 bytes
    WHEN each is costed strongly consistent
    THEN the first rounds to 44 KB (11 units), the second is 96 KB (24 units) (CAP: "Query")."""
    total_bytes = round(40.8 * KB)  # 41,779
    sizes = [total_bytes // 10] * 9 + [total_bytes - 9 * (total_bytes // 10)]
    ten = [item_of_size(size, f"k{i}") for i, size in enumerate(sizes)]
    assert sum(item_size_bytes(item) for item in ten) == total_bytes
    many = [item_of_size(64, f"{i:04d}") for i in range(1500)]
    assert query_read_cost(ten, STRONG) == ReadCost(11.0)
    assert query_read_cost(many, STRONG) == ReadCost(24.0)


def test_a_query_on_an_index_costs_its_entries_eventually_consistent() -> None:
    """GIVEN an index query returning 8 entries of 2000 bytes each
    WHEN it is costed (index queries are eventually consistent)
    THEN 16,000 bytes round to 16 KB: 0.5 x 4 = 2 units (GSI: "Read Capacity Units")."""
    entries = [item_of_size(2000, f"k{i}") for i in range(8)]
    assert query_read_cost(entries, EVENTUAL) == ReadCost(2.0)


def test_an_empty_query_costs_the_minimum() -> None:
    """GIVEN a Query that returns nothing
    WHEN it is costed
    THEN it still costs the minimum read."""
    assert query_read_cost([], EVENTUAL) == ReadCost(0.5)


# --- global secondary indexes (GSI) -----------------------------------------------------------


def _claimed(
    *, bucket: str = "orders#3", lease_ms: str = "1700000060000", **extra: Any
) -> dict[str, Any]:
    return {
        "pk": {"S": "orders#k-1"},
        "state": {"S": "IN_FLIGHT"},
        "inflight_bucket": {"S": bucket},
        "lease_expires_at_ms": {"N": lease_ms},
        **extra,
    }


def _delivered() -> dict[str, Any]:
    return {"pk": {"S": "orders#k-1"}, "state": {"S": "DELIVERED"}}


def test_a_keys_only_entry_holds_the_table_key_and_the_index_keys() -> None:
    """GIVEN an in-flight item with attributes beyond its keys
    WHEN its KEYS_ONLY entry is built
    THEN it holds the table's primary key and the index key attributes only; its storage adds
    100 bytes of overhead, its write size does not (GSI: "Storage Considerations")."""
    item = _claimed(payload={"B": b"x" * 500})
    entry = index_entry(LEDGER, INFLIGHT, item)
    assert entry == {
        "pk": item["pk"],
        "inflight_bucket": item["inflight_bucket"],
        "lease_expires_at_ms": item["lease_expires_at_ms"],
    }
    expected = (2 + 10) + (15 + 8) + (19 + 6)  # "1700000060000": 9 significant digits -> 6
    assert index_entry_size_bytes(LEDGER, INFLIGHT, item) == expected
    assert index_entry_storage_bytes(LEDGER, INFLIGHT, item) == expected + 100


def test_include_and_all_projections_copy_their_attributes() -> None:
    """GIVEN an INCLUDE index naming "state" and an ALL index
    WHEN entries are built
    THEN INCLUDE adds "state" (not "payload") and ALL copies every attribute."""
    include = IndexSpec(
        "by-bucket", "inflight_bucket", None, Projection.INCLUDE, frozenset({"state"})
    )
    every = IndexSpec("all", "inflight_bucket", projection=Projection.ALL)
    table = TableSpec("pk", indexes=(include, every))
    item = _claimed(payload={"B": b"abc"})
    assert set(index_entry(table, include, item) or {}) == {
        "pk",
        "inflight_bucket",
        "state",
    }
    assert index_entry(table, every, item) == item


def test_an_item_without_the_index_keys_is_not_in_the_index() -> None:
    """GIVEN an item lacking the index's range key attribute
    WHEN its entry is asked
    THEN there is none: a sparse index holds only items with every index key attribute."""
    item = _delivered() | {"inflight_bucket": {"S": "orders#3"}}
    assert index_entry(LEDGER, INFLIGHT, item) is None


@pytest.mark.parametrize(
    ("before", "after", "change", "writes"),
    [
        pytest.param(None, _claimed(), IndexChange.ENTERS, 1, id="new item with index keys"),
        pytest.param(_delivered(), _claimed(), IndexChange.ENTERS, 1, id="update adds index keys"),
        pytest.param(
            _claimed(),
            _claimed(lease_ms="1700000120000"),
            IndexChange.KEY_CHANGES,
            2,
            id="index key value changes",
        ),
        pytest.param(
            _claimed(), _delivered(), IndexChange.LEAVES, 1, id="update removes index keys"
        ),
        pytest.param(_claimed(), None, IndexChange.LEAVES, 1, id="delete of an indexed item"),
        pytest.param(_delivered(), _delivered(), IndexChange.NONE, 0, id="never in the index"),
        pytest.param(None, _delivered(), IndexChange.NONE, 0, id="new item without index keys"),
        pytest.param(
            _claimed(),
            _claimed(attempt={"N": "2"}),
            IndexChange.NONE,
            0,
            id="unprojected attribute changes",
        ),
        pytest.param(
            _claimed(lease_ms="1700000060000"),
            _claimed(lease_ms="1.70000006E+12"),
            IndexChange.NONE,
            0,
            id="same number written differently",
        ),
    ],
)
def test_a_table_write_costs_the_index_writes_aws_lists(
    before: Item | None, after: Item | None, change: IndexChange, writes: int
) -> None:
    """GIVEN the ledger's KEYS_ONLY in-flight index and a write from ``before`` to ``after``
    WHEN the index write is costed
    THEN it is AWS's case: entering or leaving is 1 write, a key value change 2 (delete and
    put), no presence or no projected change 0 (GSI: "Write Capacity Units"). Ledger entries
    are far below 1 KB, so units equal writes."""
    cost = index_write(LEDGER, INFLIGHT, before, after)
    assert (cost.change, cost.writes, cost.units) == (change, writes, writes)
    assert write_cost(LEDGER, before, after).index_writes == writes


def test_a_change_to_a_projected_attribute_alone_costs_one_index_write() -> None:
    """GIVEN an INCLUDE index projecting "state", and an update of "state" only
    WHEN the index write is costed
    THEN it is 1 write (GSI: "only changes the value of projected attributes ... one write")."""
    include = IndexSpec(
        "by-bucket", "inflight_bucket", None, Projection.INCLUDE, frozenset({"state"})
    )
    table = TableSpec("pk", indexes=(include,))
    cost = index_write(table, include, _claimed(), _claimed(state={"S": "STALLED"}))
    assert (cost.change, cost.writes, cost.units) == (IndexChange.PROJECTION_CHANGES, 1, 1)


def test_a_large_entry_costs_more_than_one_unit_per_index_write() -> None:
    """GIVEN an ALL index and a 2.5 KB item whose index key changes
    WHEN the write is costed
    THEN each of the 2 index writes is rounded up on its own: 3 + 3 units (GSI: "Larger index
    entries will require additional write capacity units")."""
    every = IndexSpec("all", "inflight_bucket", projection=Projection.ALL)
    table = TableSpec("pk", indexes=(every,))
    filler = {"f": {"S": "x" * (2 * KB + KB // 2)}}
    before = _claimed(bucket="orders#1", **filler)
    after = _claimed(bucket="orders#2", **filler)
    assert write_cost(table, before, after) == WriteCost(
        table_units=3, index_units=6, index_writes=2
    )


def test_a_ledger_claim_then_delivery_costs_table_and_index_writes() -> None:
    """GIVEN the ledger's lifecycle of one key: claim (enters the index), mark delivered
    (leaves it)
    WHEN each write is costed
    THEN each costs 1 table unit and 1 index unit: the bill is twice what the table alone
    reports."""
    claim = write_cost(LEDGER, None, _claimed())
    mark = write_cost(LEDGER, _claimed(), _delivered())
    assert (claim, mark) == (WriteCost(1, 1, 1), WriteCost(1, 1, 1))
    assert (claim + mark).units == 4


# --- schema -----------------------------------------------------------------------------------


def test_a_table_description_gives_the_billing_schema() -> None:
    """GIVEN a DescribeTable ``Table`` like the ledger's
    WHEN it is read as a billing schema
    THEN it names the same keys and the KEYS_ONLY index."""
    description = {
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": "inflight-index",
                "KeySchema": [
                    {"AttributeName": "inflight_bucket", "KeyType": "HASH"},
                    {"AttributeName": "lease_expires_at_ms", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    }
    assert table_spec_from_description(description) == LEDGER


def test_a_table_with_local_secondary_indexes_is_refused() -> None:
    """GIVEN a table with a local secondary index
    WHEN it is read as a billing schema
    THEN it is refused: its index writes would otherwise go unbilled."""
    description = {
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        "LocalSecondaryIndexes": [{"IndexName": "lsi"}],
    }
    with pytest.raises(ValueError, match="local secondary"):
        table_spec_from_description(description)


# --- properties -------------------------------------------------------------------------------

_names = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
_numbers = st.decimals(allow_nan=False, allow_infinity=False, places=3, max_value=10**9).map(str)
_scalars = st.one_of(
    st.builds(lambda s: {"S": s}, st.text(max_size=40)),
    st.builds(lambda n: {"N": n}, _numbers),
    st.builds(lambda b: {"B": b}, st.binary(max_size=40)),
    st.builds(lambda b: {"BOOL": b}, st.booleans()),
    st.just({"NULL": True}),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.builds(lambda items: {"L": items}, st.lists(inner, max_size=4)),
        st.builds(lambda fields: {"M": fields}, st.dictionaries(_names, inner, max_size=4)),
    ),
    max_leaves=12,
)
_items = st.dictionaries(_names, _values, max_size=6).map(
    lambda attrs: {"pk": {"S": "orders#k"}, **attrs}
)
_index_keys = st.fixed_dictionaries(
    {},
    optional={
        "inflight_bucket": st.sampled_from([{"S": "orders#1"}, {"S": "orders#2"}]),
        "lease_expires_at_ms": st.sampled_from([{"N": "1"}, {"N": "2"}]),
    },
)
_ledger_items = st.builds(lambda item, keys: {**item, **keys}, _items, _index_keys)


@given(st.integers(0, 500 * KB), st.integers(0, 500 * KB))
def test_units_never_fall_as_size_grows(a: int, b: int) -> None:
    """GIVEN any two sizes
    WHEN both are costed as writes and as reads
    THEN the larger never costs less, and every cost is at least the minimum."""
    small, large = sorted((a, b))
    assert 1 <= write_units(small) <= write_units(large)
    for consistency in Consistency:
        assert 0.5 <= read_units(small, consistency) <= read_units(large, consistency)


@given(_items, _names, _values)
def test_adding_an_attribute_never_makes_an_item_cheaper(item: Item, name: str, value: Any) -> None:
    """GIVEN any item and an attribute it does not have
    WHEN the attribute is added
    THEN the item's size grows by exactly the attribute's name and value."""
    if name in item:
        return
    grown = {**item, name: value}
    added = len(name.encode("utf-8")) + attribute_value_size_bytes(value)
    assert item_size_bytes(grown) == item_size_bytes(item) + added
    assert write_units(item_size_bytes(grown)) >= write_units(item_size_bytes(item))


@given(_ledger_items, _ledger_items)
def test_an_update_never_costs_less_than_either_image(before: Item, after: Item) -> None:
    """GIVEN any item before and after a write, on the ledger's schema
    WHEN the write is costed
    THEN the table part is at least what writing either image alone costs, and the index part
    is 0, 1 or 2 index writes of at least one unit each."""
    cost = write_cost(LEDGER, before, after)
    assert cost.table_units >= write_cost(LEDGER, None, after).table_units
    assert cost.table_units >= write_cost(LEDGER, before, None).table_units
    assert cost.index_writes in {0, 1, 2}
    assert cost.index_units >= cost.index_writes
    failed = write_cost(LEDGER, before, after, condition_failed=True)
    assert failed.index_units == 0
    assert failed.table_units <= cost.table_units
