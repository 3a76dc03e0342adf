"""The contract's key claims in batches (``dedupe_store.claims``, ``dedupe_store.batch_claims``):
new keys inserted a batch at a time, the keys a batch left pending judged from their items, each
result what a single claim says.
"""

from __future__ import annotations

from dedupe_store.contract import Ledger
from dedupe_store.records import ClaimResult, ClaimStatus, PendingClaim
from ledger_contract.staging import (
    BOB,
    POSITION,
    STREAM,
    T0_MS,
    TTL_S,
    claim,
    claimed,
    in_two_halves,
    open_group,
    request_for,
)


def test_claims_in_a_batch_win_new_keys_and_judge_the_others_as_single_claims_do(
    ledger: Ledger,
) -> None:
    # GIVEN a key alice holds, one she released, one delivered past its TTL (each claimed one
    # at a time: an older producer's items), and thirty keys no one claimed
    later_ms = T0_MS + (TTL_S + 1) * 1000
    held = claimed(ledger, "k-held", now_ms=later_ms)
    released = claim(ledger, "k-released", open_group(ledger, "k-released", now_ms=later_ms))
    assert ledger.release(released).applied
    expired = claimed(ledger, "k-expired")
    ledger.record_positions(expired, {"k-expired": POSITION}, settle=True, now_ms=T0_MS)
    new = [f"k-new-{i:02d}" for i in range(30)]
    keys = [*new[:10], "k-held", *new[10:20], "k-released", "k-expired", *new[20:]]
    # WHEN bob claims all of them in the two halves the producer makes (batches of 25 where
    # the backend runs PartiQL)
    bobs = open_group(ledger, *keys, owner=BOB, now_ms=later_ms)
    results = in_two_halves(ledger, [request_for(k) for k in keys], bobs, now_ms=later_ms)
    # THEN each result is what a single claim would have said, in the keys' order: the new
    # keys won at attempt 1, the released and expired ones won at attempt 2, the held one lost
    # to alice's claim
    by_key = dict(zip(keys, results, strict=True))
    assert all(isinstance(r, ClaimResult) for r in results), results
    won = {
        k: r.claim
        for k, r in by_key.items()
        if isinstance(r, ClaimResult) and r.status is ClaimStatus.WON
    }
    assert sorted(won) == sorted([*new, "k-released", "k-expired"])
    assert {k: (c.attempt, c.group_id) for k, c in won.items() if c is not None} == {
        **dict.fromkeys(new, (1, bobs.group_id)),
        "k-released": (2, bobs.group_id),
        "k-expired": (2, bobs.group_id),
    }
    lost = by_key["k-held"]
    assert isinstance(lost, ClaimResult)
    assert lost.status is ClaimStatus.LOST
    assert lost.claim is not None
    assert lost.claim.group_id == held.group_id
    # AND the items are the ones single claims write: a single claim now loses to bob's
    current = ledger.get_claim(STREAM, "k-new-00")
    assert current == won["k-new-00"]
    again = ledger.claim(request_for("k-new-00"), open_group(ledger, "k-new-00"), now_ms=later_ms)
    assert (again.status, again.claim) == (ClaimStatus.LOST, current)


def test_pending_claims_are_judged_from_their_items_in_order_100_to_a_read(
    ledger: Ledger,
) -> None:
    # GIVEN keys left pending by batched claims: one whose INSERT applied (its item holds the
    # pending claim's token), one alice holds, one she released, one past its TTL, and 130
    # never claimed (more than one read of 100)
    later_ms = T0_MS + (TTL_S + 1) * 1000
    bobs = open_group(ledger, "k-ours", owner=BOB, now_ms=later_ms)
    ours = claim(ledger, "k-ours", bobs, now_ms=later_ms)
    held = claim(ledger, "k-held", open_group(ledger, "k-held", now_ms=later_ms), now_ms=later_ms)
    released = claim(ledger, "k-released", open_group(ledger, "k-released"))
    assert ledger.release(released).applied
    claimed(ledger, "k-expired")
    absent = [f"k-absent-{i:03d}" for i in range(130)]
    keys = [*absent[:60], "k-ours", "k-held", *absent[60:], "k-released", "k-expired"]
    tokens = {"k-ours": ours.write_token}
    pending = [PendingClaim(request_for(k), tokens.get(k) or f"token-{k}") for k in keys]
    # WHEN they are judged together
    verdicts = ledger.judge_claims(pending, now_ms=later_ms)
    # THEN, in order: ours won, alice's lost to her claim, and the released, expired and
    # absent keys handed back to be claimed singly; nothing was written
    by_key = dict(zip(keys, verdicts, strict=True))
    assert by_key.pop("k-ours") == ClaimResult.won(ours)
    assert by_key.pop("k-held") == ClaimResult.lost(held)
    assert by_key == {k: request_for(k) for k in [*absent, "k-released", "k-expired"]}
    assert ledger.get_claim(STREAM, absent[0]) is None
    assert ledger.judge_claims([], now_ms=later_ms) == []
