"""The producer's and the reconciler's decisions: every case of producer/key/decisions.py, on values
built by hand (no ledger, no stream). Expected outcomes are written out as tables, never
recomputed with the logic under test."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupe_store.records import Group, GroupUpdate, KeyClaim, Position
from dedupe_store.states import GroupState, KeyState
from producer.key.decisions import (
    FenceVerdict,
    LostClaim,
    LostClaimJudgement,
    ReadBackAction,
    Resolution,
    after_fence,
    due_for_read_back,
    groups_to_renew,
    judge_lost_claim,
    read_back_action,
)
from producer.protocol import LeasePolicy

STREAM = "orders"
KEY = "order-42"
OTHER_KEY = "order-43"
DIGEST = "sha256:aaaa"
OTHER_DIGEST = "sha256:bbbb"
GROUP_ID = "g-holder"

# the design's defaults: 2 s connect + 5 s read, 5 s skew, 60 s lease; a 15 s signature window
PUT_TIMEOUT_MS = 7_000
SKEW_MS = 5_000
LEASE_MS = 60_000
SIGNATURE_WINDOW_MS = 15_000
CLAIMED_AT_MS = 1_700_000_000_000
LEASE_END_MS = CLAIMED_AT_MS + LEASE_MS

UNFENCED = LeasePolicy(lease_ms=LEASE_MS, put_timeout_ms=PUT_TIMEOUT_MS, skew_ms=SKEW_MS)
FENCED = LeasePolicy(
    lease_ms=LEASE_MS,
    put_timeout_ms=PUT_TIMEOUT_MS,
    skew_ms=SKEW_MS,
    signature_window_ms=SIGNATURE_WINDOW_MS,
)
# the last millisecond a put may leave: the lease must outlast the window (fenced) or the
# put's timeout (unfenced), plus the skew
LAST_SEND_MS = {
    "fenced": LEASE_END_MS - SIGNATURE_WINDOW_MS - SKEW_MS,
    "unfenced": LEASE_END_MS - PUT_TIMEOUT_MS - SKEW_MS,
}
POLICIES = {"fenced": FENCED, "unfenced": UNFENCED}

POSITION = Position(
    "shardId-000000000001", "49590338271490256608559692538361571095921575989136588818"
)
OTHER_POSITION = Position(
    "shardId-000000000002", "49590338271490256608559692540925702759324208523137515522"
)


def key_claim(state: KeyState = KeyState.CLAIMED, digest: str = DIGEST) -> KeyClaim:
    return KeyClaim(
        stream=STREAM,
        key=KEY,
        state=state,
        attempt=1,
        group_id=GROUP_ID,
        claimed_at_ms=CLAIMED_AT_MS,
        payload_digest=digest,
        routing_hash_key="170141183460469231731687303715884105728",
        expires_at_s=CLAIMED_AT_MS // 1000 + 86_400,
    )


def group(
    state: GroupState = GroupState.OPEN,
    *,
    positions: dict[int, Position] | None = None,
    members: tuple[str, ...] = (KEY, OTHER_KEY),
    epoch: int = 1,
    lease_expires_at_ms: int = LEASE_END_MS,
) -> Group:
    return Group(
        stream=STREAM,
        group_id=GROUP_ID,
        state=state,
        epoch=epoch,
        owner="producer-b",
        claimed_at_ms=CLAIMED_AT_MS,
        lease_expires_at_ms=lease_expires_at_ms,
        members=members,
        positions=dict(positions or {}),
    )


# the holders a lost claim can name; "open-no-position" records the *other* member only
HOLDERS: dict[str, Group | None] = {
    "none": None,
    "open-no-position": group(positions={1: OTHER_POSITION}),
    "open-position": group(positions={0: POSITION, 1: OTHER_POSITION}),
    "settled-position": group(GroupState.SETTLED, positions={0: POSITION}),
}


# --- judge_lost_claim ---------------------------------------------------------------------------


def test_a_lost_claim_whose_key_item_is_gone_has_vanished() -> None:
    # GIVEN a claim lost to a key item that is gone by the time it is read
    # WHEN the loss is judged
    judged = judge_lost_claim(KEY, DIGEST, None, None)
    # THEN the key is free again: it is sent again, with no position
    assert judged == LostClaimJudgement(LostClaim.VANISHED, None)


@pytest.mark.parametrize("holder", HOLDERS.values(), ids=HOLDERS.keys())
def test_a_vanished_key_item_wins_over_whatever_its_group_says(holder: Group | None) -> None:
    # GIVEN a key item that is gone, whatever the group read alongside it
    # WHEN the loss is judged
    judged = judge_lost_claim(KEY, DIGEST, None, holder)
    # THEN it has vanished, and no position is carried
    assert judged == LostClaimJudgement(LostClaim.VANISHED, None)


DELIVERED_AT = LostClaimJudgement(LostClaim.DELIVERED, POSITION)
CONFLICT = LostClaimJudgement(LostClaim.CONFLICT, None)
CONFLICT_AT = LostClaimJudgement(LostClaim.CONFLICT, POSITION)
UNVERIFIABLE = LostClaimJudgement(LostClaim.UNVERIFIABLE, None)
RELEASED = LostClaimJudgement(LostClaim.RELEASED, None)
WAIT = LostClaimJudgement(LostClaim.WAIT, None)

# (key state, same digest?, holder) -> judgement: the full product, written out
LOST_CLAIM_TABLE: list[tuple[KeyState, bool, str, LostClaimJudgement]] = [
    # CLAIMED, same data: delivered once the holder's group records it, else wait
    (KeyState.CLAIMED, True, "none", WAIT),
    (KeyState.CLAIMED, True, "open-no-position", WAIT),
    (KeyState.CLAIMED, True, "open-position", DELIVERED_AT),
    (KeyState.CLAIMED, True, "settled-position", DELIVERED_AT),
    # CLAIMED, other data: a conflict, with where the other data landed if known
    (KeyState.CLAIMED, False, "none", CONFLICT),
    (KeyState.CLAIMED, False, "open-no-position", CONFLICT),
    (KeyState.CLAIMED, False, "open-position", CONFLICT_AT),
    (KeyState.CLAIMED, False, "settled-position", CONFLICT_AT),
    # RELEASED, same data: a later call claims it, whatever the group says
    (KeyState.RELEASED, True, "none", RELEASED),
    (KeyState.RELEASED, True, "open-no-position", RELEASED),
    (KeyState.RELEASED, True, "open-position", RELEASED),
    (KeyState.RELEASED, True, "settled-position", RELEASED),
    # RELEASED, other data: the digest is checked first
    (KeyState.RELEASED, False, "none", CONFLICT),
    (KeyState.RELEASED, False, "open-no-position", CONFLICT),
    (KeyState.RELEASED, False, "open-position", CONFLICT_AT),
    (KeyState.RELEASED, False, "settled-position", CONFLICT_AT),
    # UNVERIFIABLE, same data: unverifiable, whatever the group says
    (KeyState.UNVERIFIABLE, True, "none", UNVERIFIABLE),
    (KeyState.UNVERIFIABLE, True, "open-no-position", UNVERIFIABLE),
    (KeyState.UNVERIFIABLE, True, "open-position", UNVERIFIABLE),
    (KeyState.UNVERIFIABLE, True, "settled-position", UNVERIFIABLE),
    # UNVERIFIABLE, other data: the digest is checked first
    (KeyState.UNVERIFIABLE, False, "none", CONFLICT),
    (KeyState.UNVERIFIABLE, False, "open-no-position", CONFLICT),
    (KeyState.UNVERIFIABLE, False, "open-position", CONFLICT_AT),
    (KeyState.UNVERIFIABLE, False, "settled-position", CONFLICT_AT),
]


@pytest.mark.parametrize(
    ("state", "same_digest", "holder_kind", "expected"),
    LOST_CLAIM_TABLE,
    ids=[
        f"{state.value.lower()}-{'same' if same else 'other'}-data-{holder}"
        for state, same, holder, _ in LOST_CLAIM_TABLE
    ],
)
def test_a_lost_claim_is_judged_by_its_data_then_its_state_then_its_holder(
    state: KeyState, same_digest: bool, holder_kind: str, expected: LostClaimJudgement
) -> None:
    # GIVEN a claim lost to a key item in `state`, holding our data or other data, whose
    # group (the holder) is gone, records only another member, or records our key
    current = key_claim(state, DIGEST if same_digest else OTHER_DIGEST)
    holder = HOLDERS[holder_kind]
    # WHEN the loss is judged
    judged = judge_lost_claim(KEY, DIGEST, current, holder)
    # THEN the verdict and the position carried are the table's
    assert judged == expected


def test_the_table_covers_every_key_state_digest_and_holder() -> None:
    # GIVEN the lost-claim table above
    # WHEN its cases are listed
    cases = {(state, same, holder) for state, same, holder, _ in LOST_CLAIM_TABLE}
    # THEN it is the full product, so no branch of judge_lost_claim goes untested
    assert len(LOST_CLAIM_TABLE) == len(cases) == len(KeyState) * 2 * len(HOLDERS)


def test_a_holder_that_records_positions_but_not_for_our_key_is_waited_on() -> None:
    # GIVEN a holder group that does not list our key at all, with positions for its members
    holder = group(members=(OTHER_KEY, "order-44"), positions={0: POSITION, 1: OTHER_POSITION})
    # WHEN a claim lost to a CLAIMED item with our data is judged
    judged = judge_lost_claim(KEY, DIGEST, key_claim(), holder)
    # THEN another member's position is not taken for ours: the holder is waited on
    assert judged == WAIT


def test_a_delivered_key_carries_the_position_of_its_own_member_index() -> None:
    # GIVEN a holder where our key is the second member, both members recorded
    holder = group(members=(OTHER_KEY, KEY), positions={0: OTHER_POSITION, 1: POSITION})
    # WHEN the loss is judged
    judged = judge_lost_claim(KEY, DIGEST, key_claim(), holder)
    # THEN the duplicate reports where our key landed, not its neighbour
    assert judged == DELIVERED_AT


# --- read_back_action ---------------------------------------------------------------------------

# (resolution, ours, can_resend) -> action: the full product, written out
READ_BACK_TABLE: list[tuple[Resolution, bool, bool, ReadBackAction]] = [
    (Resolution.FOUND, True, True, ReadBackAction.RECORD),
    (Resolution.FOUND, True, False, ReadBackAction.RECORD),
    (Resolution.FOUND, False, True, ReadBackAction.DUPLICATE),
    (Resolution.FOUND, False, False, ReadBackAction.DUPLICATE),
    (Resolution.NOT_FOUND, True, True, ReadBackAction.RESEND),
    (Resolution.NOT_FOUND, True, False, ReadBackAction.RELEASE),
    (Resolution.NOT_FOUND, False, True, ReadBackAction.RESEND),
    (Resolution.NOT_FOUND, False, False, ReadBackAction.RELEASE),
    (Resolution.PENDING, True, True, ReadBackAction.WAIT),
    (Resolution.PENDING, True, False, ReadBackAction.WAIT),
    (Resolution.PENDING, False, True, ReadBackAction.WAIT),
    (Resolution.PENDING, False, False, ReadBackAction.WAIT),
    (Resolution.UNVERIFIABLE, True, True, ReadBackAction.UNVERIFIABLE),
    (Resolution.UNVERIFIABLE, True, False, ReadBackAction.UNVERIFIABLE),
    (Resolution.UNVERIFIABLE, False, True, ReadBackAction.UNVERIFIABLE),
    (Resolution.UNVERIFIABLE, False, False, ReadBackAction.UNVERIFIABLE),
    (Resolution.CONFLICT, True, True, ReadBackAction.CONFLICT),
    (Resolution.CONFLICT, True, False, ReadBackAction.CONFLICT),
    (Resolution.CONFLICT, False, True, ReadBackAction.CONFLICT),
    (Resolution.CONFLICT, False, False, ReadBackAction.CONFLICT),
]


@pytest.mark.parametrize(
    ("resolution", "ours", "can_resend", "expected"),
    READ_BACK_TABLE,
    ids=[
        f"{resolution.value.lower()}-{'ours' if ours else 'theirs'}-"
        f"{'with' if can_resend else 'without'}-data"
        for resolution, ours, can_resend, _ in READ_BACK_TABLE
    ],
)
def test_a_read_back_resolution_maps_to_one_action(
    resolution: Resolution, ours: bool, can_resend: bool, expected: ReadBackAction
) -> None:
    # GIVEN a read-back's resolution of a claim, whether its group is ours, whether the
    # message's data is at hand
    # WHEN the action is decided
    action = read_back_action(resolution, ours=ours, can_resend=can_resend)
    # THEN it is the table's
    assert action is expected


def test_the_read_back_table_covers_every_resolution() -> None:
    # GIVEN the read-back table above
    # WHEN its cases are listed
    cases = {(resolution, ours, can) for resolution, ours, can, _ in READ_BACK_TABLE}
    # THEN it is the full product of every resolution, ours and can_resend
    assert len(READ_BACK_TABLE) == len(cases) == len(Resolution) * 2 * 2


@given(
    resolution=st.sampled_from(Resolution),
    ours=st.booleans(),
    can_resend=st.booleans(),
)
def test_a_read_back_sends_again_or_releases_only_a_put_that_cannot_land(
    resolution: Resolution, ours: bool, can_resend: bool
) -> None:
    # GIVEN any read-back resolution
    # WHEN the action is decided
    action = read_back_action(resolution, ours=ours, can_resend=can_resend)
    # THEN a key is sent again or released only when its put is not found and cannot land,
    # a resend needs the data, and only our own group records a position
    if action in {ReadBackAction.RESEND, ReadBackAction.RELEASE}:
        assert resolution is Resolution.NOT_FOUND
    if action is ReadBackAction.RESEND:
        assert can_resend
    if action is ReadBackAction.RECORD:
        assert ours
        assert resolution is Resolution.FOUND


# --- after_fence --------------------------------------------------------------------------------

AFTER_FENCE_TABLE: list[tuple[str, GroupUpdate | None, tuple[FenceVerdict, Position | None]]] = [
    ("write-failed", None, (FenceVerdict.WAIT, None)),
    (
        "fenced",
        GroupUpdate(applied=True, current=group(epoch=2, lease_expires_at_ms=CLAIMED_AT_MS)),
        (FenceVerdict.TAKE_OVER, None),
    ),
    (
        "fenced-but-the-holder-recorded-the-key-since",
        GroupUpdate(applied=True, current=group(epoch=2, positions={0: POSITION})),
        (FenceVerdict.DELIVERED, POSITION),
    ),
    ("lost-group-gone", GroupUpdate(applied=False, current=None), (FenceVerdict.TAKE_OVER, None)),
    (
        "lost-holder-recorded-the-key",
        GroupUpdate(applied=False, current=group(positions={0: POSITION})),
        (FenceVerdict.DELIVERED, POSITION),
    ),
    (
        "lost-holder-settled-with-the-key",
        GroupUpdate(applied=False, current=group(GroupState.SETTLED, positions={0: POSITION})),
        (FenceVerdict.DELIVERED, POSITION),
    ),
    (
        "lost-holder-renewed-without-the-key",
        GroupUpdate(
            applied=False,
            current=group(
                epoch=2,
                positions={1: OTHER_POSITION},
                lease_expires_at_ms=LEASE_END_MS + LEASE_MS,
            ),
        ),
        (FenceVerdict.WAIT, None),
    ),
    (
        "lost-holder-settled-without-the-key",
        GroupUpdate(
            applied=False, current=group(GroupState.SETTLED, positions={1: OTHER_POSITION})
        ),
        (FenceVerdict.WAIT, None),
    ),
]


@pytest.mark.parametrize(
    ("update", "expected"),
    [(update, expected) for _, update, expected in AFTER_FENCE_TABLE],
    ids=[case for case, _, _ in AFTER_FENCE_TABLE],
)
def test_a_key_is_taken_from_an_expired_group_only_once_the_fence_holds(
    update: GroupUpdate | None, expected: tuple[FenceVerdict, Position | None]
) -> None:
    # GIVEN the answer to our fence of another party's expired group (epoch + 1): failed,
    # applied, or lost to a renewal, a settle, a record, or a deletion
    # WHEN the key's fate is decided
    verdict = after_fence(KEY, update)
    # THEN it is taken over only when fenced (or the group is gone); a key the holder
    # recorded is a duplicate at its position; otherwise it is waited on again
    assert verdict == expected


# --- groups_to_renew ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", POLICIES.keys())
@pytest.mark.parametrize(
    ("offset_ms", "renew"),
    [(-1, False), (0, False), (1, True)],
    ids=["1ms-before-the-last-ms", "at-the-last-ms", "1ms-after-the-last-ms"],
)
def test_a_group_is_renewed_once_a_put_sent_now_could_outlive_its_lease(
    mode: str, offset_ms: int, renew: bool
) -> None:
    # GIVEN one group whose lease ends at LEASE_END_MS, under a fenced or unfenced policy
    lease = POLICIES[mode]
    now_ms = LAST_SEND_MS[mode] + offset_ms
    # WHEN the producer asks which groups to renew before a put
    to_renew = groups_to_renew({"g1": LEASE_END_MS}, now_ms, lease)
    # THEN the group is renewed only once the last millisecond a put may leave has passed
    assert to_renew == ({"g1"} if renew else set())


def test_the_fenced_and_unfenced_boundaries_differ() -> None:
    # GIVEN the two policies (the window, 15 s, is longer than the put timeout, 7 s)
    # WHEN a put is about to leave between the fenced and the unfenced last milliseconds
    now_ms = LAST_SEND_MS["fenced"] + 1
    # THEN the fenced producer renews first, the unfenced one still sends
    assert groups_to_renew({"g1": LEASE_END_MS}, now_ms, FENCED) == {"g1"}
    assert groups_to_renew({"g1": LEASE_END_MS}, now_ms, UNFENCED) == set()


@pytest.mark.parametrize("mode", POLICIES.keys())
def test_no_groups_means_nothing_to_renew(mode: str) -> None:
    # GIVEN no groups
    # WHEN the producer asks which to renew
    # THEN none
    assert groups_to_renew({}, LEASE_END_MS, POLICIES[mode]) == set()


@pytest.mark.parametrize("mode", POLICIES.keys())
def test_only_the_groups_short_of_lease_are_renewed(mode: str) -> None:
    # GIVEN several groups: one long past its lease, one just short, one exactly at the
    # boundary, one with plenty left
    now_ms = LAST_SEND_MS[mode]
    lease_ends = {
        "expired": now_ms - 1_000,
        "1ms-short": LEASE_END_MS - 1,
        "at-boundary": LEASE_END_MS,
        "plenty-left": LEASE_END_MS + LEASE_MS,
    }
    # WHEN the producer asks which to renew
    to_renew = groups_to_renew(lease_ends, now_ms, POLICIES[mode])
    # THEN exactly the expired and the short ones
    assert to_renew == {"expired", "1ms-short"}


@given(
    lease_ends=st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.integers(CLAIMED_AT_MS - LEASE_MS, CLAIMED_AT_MS + 3 * LEASE_MS),
        max_size=20,
    ),
    now_ms=st.integers(CLAIMED_AT_MS, CLAIMED_AT_MS + 2 * LEASE_MS),
    mode=st.sampled_from(sorted(POLICIES)),
)
def test_a_group_is_renewed_whenever_one_whose_lease_ends_later_is(
    lease_ends: dict[str, int], now_ms: int, mode: str
) -> None:
    # GIVEN any groups and any time
    # WHEN the producer asks which to renew
    to_renew = groups_to_renew(lease_ends, now_ms, POLICIES[mode])
    # THEN only known groups are named, and a group whose lease ends no later than a renewed
    # one's is renewed too
    assert to_renew <= set(lease_ends)
    for renewed in to_renew:
        for group_id, end_ms in lease_ends.items():
            if end_ms <= lease_ends[renewed]:
                assert group_id in to_renew


# --- due_for_read_back --------------------------------------------------------------------------

EXPIRED_FOR_EVERYONE_MS = LEASE_END_MS + SKEW_MS
LEASE_RUNNING_MS = CLAIMED_AT_MS + 1_000

DUE_TABLE: list[tuple[str, bool, bool, int, Group | None, bool]] = [
    # (case, ours, first_look, now_ms, holder, due)
    ("ours-first-look", True, True, LEASE_RUNNING_MS, group(), True),
    ("ours-first-look-holder-gone", True, True, LEASE_RUNNING_MS, None, True),
    ("ours-later-look-lease-running", True, False, LEASE_RUNNING_MS, group(), False),
    ("theirs-first-look-lease-running", False, True, LEASE_RUNNING_MS, group(), False),
    ("theirs-lease-expired-for-everyone", False, False, EXPIRED_FOR_EVERYONE_MS, group(), True),
    (
        "theirs-1ms-before-expired-for-everyone",
        False,
        False,
        EXPIRED_FOR_EVERYONE_MS - 1,
        group(),
        False,
    ),
    ("theirs-at-lease-end-within-skew", False, False, LEASE_END_MS, group(), False),
    (
        "theirs-holder-settled-lease-running",
        False,
        False,
        LEASE_RUNNING_MS,
        group(GroupState.SETTLED, positions={1: OTHER_POSITION}),
        True,
    ),
    ("theirs-holder-gone-lease-running", False, False, LEASE_RUNNING_MS, None, False),
    ("theirs-holder-gone-lease-expired", False, False, EXPIRED_FOR_EVERYONE_MS, None, True),
]


@pytest.mark.parametrize("mode", POLICIES.keys())
@pytest.mark.parametrize(
    ("ours", "first_look", "now_ms", "holder", "due"),
    [case[1:] for case in DUE_TABLE],
    ids=[case[0] for case in DUE_TABLE],
)
def test_a_held_claim_is_read_back_when_ours_at_once_or_once_its_holder_is_done(
    mode: str, ours: bool, first_look: bool, now_ms: int, holder: Group | None, due: bool
) -> None:
    # GIVEN a held claim whose lease ends at LEASE_END_MS: ours or another party's, seen for
    # the first time or not, its holder group open, settled or gone
    # WHEN the waiter asks whether to read it back now
    is_due = due_for_read_back(
        ours=ours,
        first_look=first_look,
        lease_expires_at_ms=LEASE_END_MS,
        holder=holder,
        now_ms=now_ms,
        lease=POLICIES[mode],
    )
    # THEN an ambiguous put of ours is read back at once; any other only once no clock can
    # think its lease is running, or once its holder settled
    assert is_due is due


# --- properties of judge_lost_claim -------------------------------------------------------------


@st.composite
def holders(draw: st.DrawFn) -> Group | None:
    if draw(st.booleans()):
        return None
    members = tuple(draw(st.lists(st.sampled_from([KEY, OTHER_KEY, "order-44"]), max_size=4)))
    recorded = draw(st.sets(st.integers(0, max(len(members) - 1, 0)))) if members else set()
    positions = {i: Position("shardId-000000000001", str(1000 + i)) for i in recorded}
    return group(draw(st.sampled_from(GroupState)), members=members, positions=positions)


@given(
    current=st.one_of(
        st.none(),
        st.builds(
            key_claim,
            state=st.sampled_from(KeyState),
            digest=st.sampled_from([DIGEST, OTHER_DIGEST]),
        ),
    ),
    holder=holders(),
)
def test_a_lost_claim_is_never_delivered_without_its_holders_position(
    current: KeyClaim | None, holder: Group | None
) -> None:
    # GIVEN any key item (or none) and any holder group (or none)
    # WHEN the loss is judged
    judged = judge_lost_claim(KEY, DIGEST, current, holder)
    # THEN a delivery always names the position its holder records for our key, a conflict
    # is exactly other data, and a position is only ever the holder's for our key
    if judged.verdict is LostClaim.DELIVERED:
        assert holder is not None
        assert judged.position is not None
        assert judged.position == holder.position_of(KEY)
    if current is not None:
        assert (judged.verdict is LostClaim.CONFLICT) is (current.payload_digest != DIGEST)
    if judged.position is not None:
        assert holder is not None
        assert judged.position == holder.position_of(KEY)
