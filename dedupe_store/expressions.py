"""The ledger's UpdateItem/PutItem expressions (schema v2), written once, from named parts.

Built as constant strings (values travel as ``ExpressionAttributeValues``) because the claim
is the hot path: one per message. Building them per call through pynamodb's expression objects
cost about 0.6 ms of CPU each (see docs/performance.md).

The timeline the conditions guard::

    key claim:        absent ── or RELEASED ── or at or past its TTL second ──> CLAIMED #n+1, G
    key take over / release / mark unverifiable: CLAIMED and attempt = seen and group = seen
    group open:       absent ──────────────────────────────────────────────> OPEN epoch 1
    group renew:      OPEN and epoch = held and lease > now + skew ─────────> epoch + 1
    group take over:  OPEN and epoch = seen and lease + skew <= now ────────> epoch + 1
    group record / settle: OPEN and epoch = held ───────────────────────────> OPEN / SETTLED
    run register:     absent or OPEN, the execution not superseded ─────────> OPEN, in the
                                                                             index, + attempt
    stripe announce:  (the same) ───────────────────────────────────────────> + stripe k
    stripe register:  present (announced) and not sealed ───────────────────> + attempt
    stripe seal:      (any) ────────────────────────────────────────────────> sealed
    execution extend: run OPEN, not superseded, lease shorter ──────────────> lease from now
    task register:    no attempt of that id ─────────────────────────────────> + attempt
    attempt renew:    attempt not superseded, lease > now + skew ────────────> lease from now
    run complete:     absent, OPEN or COMPLETE ──────────────────────────────> COMPLETE (once),
                                                                             out of the index
"""

from __future__ import annotations

import functools
from typing import Any

# the attribute DynamoDB's TTL deletes items by (``keo init`` turns it on)
TTL_ATTRIBUTE = "expires_at"
# a run's stripe item, once a supersede or a commit sealed it: no attempt registers on it
SEALED_ATTRIBUTE = "sealed"

NAMES: dict[str, str] = {
    "#pk": "pk",
    "#stream": "stream",
    "#state": "state",
    "#attempt": "attempt",
    "#group": "group",
    "#epoch": "epoch",
    "#owner": "owner",
    "#claimed": "claimed_at_ms",
    "#lease": "lease_expires_at_ms",
    "#bucket": "inflight_bucket",
    "#digest": "payload_digest",
    "#routing": "routing_hash_key",
    "#members": "members",
    "#positions": "positions",
    "#recorded": "recorded_at_ms",
    "#expires": TTL_ATTRIBUTE,
    "#payload": "payload",
    "#token": "write_token",
    "#superseded": "superseded",
    "#completed": "completed_at_ms",
    "#counts": "counts",
    "#top": "top_task_attempt",
    "#sopen": "open",
    "#sattempts": "attempts",
    "#slate": "late",
    "#sealed": SEALED_ATTRIBUTE,
}

# --- conditions, from named parts ------------------------------------------------------------

ITEM_ABSENT = "attribute_not_exists(#pk)"
RELEASED = "#state = :released"
DEDUPE_EXPIRED = "#expires <= :now_s"
CLAIMABLE = f"{ITEM_ABSENT} OR {RELEASED} OR {DEDUPE_EXPIRED}"
KEY_HELD = "#state = :claimed AND #attempt = :seen AND #group = :seen_group"
GROUP_HELD = "#state = :open AND #epoch = :epoch"
LEASE_VALID_PAST_SKEW = "#lease > :now_plus_skew"
LEASE_EXPIRED_FOR_EVERYONE = "#lease <= :now_minus_skew"
RENEWABLE = f"{GROUP_HELD} AND {LEASE_VALID_PAST_SKEW}"
TAKEABLE = f"{GROUP_HELD} AND {LEASE_EXPIRED_FOR_EVERYONE}"

# --- updates ----------------------------------------------------------------------------------

_CLAIM_SET = (
    "#state = :claimed, #attempt = if_not_exists(#attempt, :zero) + :one, #group = :group, "
    "#claimed = :now, #digest = :digest, #routing = :routing, #expires = :expires, "
    "#token = :token"
)
CLAIM = f"SET {_CLAIM_SET} REMOVE #payload"
CLAIM_WITH_PAYLOAD = f"SET {_CLAIM_SET}, #payload = :payload"
TAKE_OVER_KEY = (
    "SET #attempt = :next, #group = :group, #claimed = :now, #expires = :expires, #token = :token"
)
SETTLE_KEY = "SET #state = :target, #token = :token"

RENEW = "SET #epoch = :next_epoch, #lease = :lease, #token = :token"
TAKE_OVER_GROUP = "SET #epoch = :next_epoch, #owner = :owner, #lease = :lease, #token = :token"
RECORD = "SET #positions = :positions, #recorded = :now, #token = :token"
SETTLE = f"SET #state = :settled, {RECORD.removeprefix('SET ')} REMOVE #bucket"

# replay-mode runs. The run item holds each execution as flat attributes
# "exec:<id>:started|lease|superseded|attempts|open|late|stripes" (#x... below, named per
# call), never its attempts: a task's attempts are on an item of their own, so every write
# costs the same small item whatever the number of tasks.
RUN_OPEN_OR_NEW = f"({ITEM_ABSENT} OR #state = :open)"
EXECUTION_REGISTRABLE = f"{RUN_OPEN_OR_NEW} AND attribute_not_exists(#xsuperseded)"
# An OPEN run is in the in-flight index (partitions of its own, :bucket), sorted by the lease
# its first attempt registered with. Written once: renewals and later registrations never move
# the entry (no index write). Leases only grow, so the run's latest lease is never earlier than
# that first one: "sort value < now" finds every run whose leases have all ended (and some still
# running, which a reader drops after reading each execution's lease).
# An execution's lease is its first attempt's; later attempts take it as their bound, and
# extend it (EXTEND_EXECUTION) when it runs short. "open" sums the tags of attempts not
# finished: ADD is not idempotent, and a repeated request only leaves it off zero.
# Its expiry moves with its leases (each registration and extension sets it from the lease it
# writes): the item must outlive the records of its latest execution by the stream's retention.
_OPEN_EXECUTION = (
    "SET #state = if_not_exists(#state, :open), #stream = :stream, #bucket = :bucket, "
    "#lease = if_not_exists(#lease, :first_lease), #expires = :expires, "
    "#xstarted = if_not_exists(#xstarted, :now), #xlease = if_not_exists(#xlease, :first_lease), "
    "#token = :token"
)
REGISTER_EXECUTION = f"{_OPEN_EXECUTION} ADD #xattempts :one, #xopen :tag"
# Not conditional on the lease running: an execution's lease bounds what a replay reads only
# once the replay superseded it, and that stops it growing; a task registering late in a long
# batch (a retry once lost executors are back) extends it even when it ran out.
EXECUTION_EXTENDABLE = "#state = :open AND attribute_not_exists(#xsuperseded) AND #xlease < :lease"
EXTEND_EXECUTION = "SET #xlease = :lease, #expires = :expires, #token = :token"
# A registration sets the expiry from its own lease, so it can move it back under a lease a
# renewal took without writing the item (dedupe_store.runs): that renewal moves it on again.
RUN_KEEPABLE = "#state = :open AND attribute_not_exists(#xsuperseded) AND #expires < :expires"
KEEP_RUN = "SET #expires = :expires, #token = :token"
FINISH_ATTEMPT = "SET #token = :token ADD #xopen :minus_tag"
# ... with the tags of rows whose put may land after it finished (a string set: a repeated
# request adds the same tags again)
FINISH_ATTEMPT_LATE = f"{FINISH_ATTEMPT}, #xlate :late"
EXECUTION_EXISTS = "attribute_exists(#xopen)"
# A task past the first TASKS_PER_STRIPE of its execution (dedupe_store.run_stripes) counts
# its attempt on a stripe item "__keo__/runpart/...", not on the run item: the run item takes
# the execution's stripe k once (opening the execution as REGISTER_EXECUTION does, counting
# nothing), the stripe item the attempts. A seal (a supersede, a COMPLETE) refuses every later
# registration on the stripe; it is unconditional, so sealing a stripe announced but not yet
# written creates it sealed, and the announcer's write is refused.
ANNOUNCE_STRIPE = f"{_OPEN_EXECUTION} ADD #xattempts :zero, #xopen :zero, #xstripes :stripe"
STRIPE_UNSEALED = "attribute_not_exists(#sealed)"
STRIPE_REGISTRABLE = f"attribute_exists(#pk) AND {STRIPE_UNSEALED}"
REGISTER_IN_STRIPE = (
    "SET #stream = :stream, #expires = :expires, #token = :token ADD #sattempts :one, #sopen :tag"
)
RENEW_IN_STRIPE = "SET #expires = :expires, #token = :token"
STRIPE_EXISTS = "attribute_exists(#pk)"
FINISH_IN_STRIPE = "SET #token = :token ADD #sopen :minus_tag"
FINISH_IN_STRIPE_LATE = f"{FINISH_IN_STRIPE}, #slate :late"
STRIPE_COUNTED = "attribute_exists(#sopen)"
ANY_ITEM = f"{ITEM_ABSENT} OR attribute_exists(#pk)"
# a supersede's seal keeps the stripe's expiry (the run's, for a stripe it creates); a
# COMPLETE's gives it the run's: the retention from the commit
SEAL_STRIPE = (
    "SET #sealed = :true, #stream = :stream, #expires = if_not_exists(#expires, :expires), "
    "#token = :token"
)
SEAL_COMPLETE_STRIPE = (
    "SET #sealed = :true, #stream = :stream, #expires = :expires, #token = :token"
)
# a task item "__keo__/task/...": the attempts of one task in one execution, a map each
# ("attempt:<id>", #me), so that registering one never rewrites the others. Registration
# order is the order of these writes to one item: the item a registration returns holds
# exactly the attempts registered before it. "top" is the highest task attempt registered:
#
#   10 registers, then 11 ── 11 sees 10: earlier, recovered against (never the fast path)
#   11 registers, then 10 ── refused (top 11 > 10): 10 is outranked, puts nothing; 11 had
#                            nothing earlier and took the fast path, so 10's rows are its
#
# so every attempt that registers does so after every attempt it could repeat.
TASK_REGISTRABLE = "attribute_not_exists(#me) AND (attribute_not_exists(#top) OR #top <= :n)"
REGISTER_TASK_ATTEMPT = (
    "SET #stream = :stream, #me = :attempt, #top = :n, "
    "#expires = if_not_exists(#expires, :expires), #token = :token"
)
ATTEMPT_RENEWABLE = "#me.#superseded = :false AND #me.#lease > :now_plus_skew"
RENEW_ATTEMPT = "SET #me.#lease = :lease, #token = :token"
RUN_COMPLETABLE = f"{ITEM_ABSENT} OR #state = :open OR #state = :complete"
# COMPLETE leaves the in-flight index, and lives the stream's retention from now (later than
# any expiry written before: a re-run must find it while the rows it put are in the stream)
COMPLETE_RUN = (
    "SET #state = :complete, #stream = :stream, #completed = if_not_exists(#completed, :now), "
    "#counts = if_not_exists(#counts, :counts), #expires = :expires, "
    "#token = :token REMOVE #bucket, #lease"
)


def s(value: str) -> dict[str, str]:
    return {"S": value}


def n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def b(value: bytes) -> dict[str, bytes]:
    return {"B": value}


@functools.cache
def names_in(*expressions: str) -> dict[str, str]:
    """Only the names an expression uses: DynamoDB refuses unused ones."""
    text = " ".join(expressions)
    return {alias: name for alias, name in NAMES.items() if alias in _tokens(text)}


def _tokens(text: str) -> set[str]:
    out: set[str] = set()
    # a document path ("#me.#lease") names each of its parts
    for raw in text.replace(",", " ").replace("(", " ").replace(")", " ").replace(".", " ").split():
        if raw.startswith("#"):
            out.add(raw)
    return out


def update_kwargs(
    table: str,
    pk: str,
    update: str,
    condition: str,
    values: dict[str, Any],
    *,
    returns: str = "ALL_NEW",
    names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``names``: placeholders for attribute names known only at run time (a run's
    executions, a task's attempts); those the expressions do not use are left out."""
    if names:
        used = _tokens(f"{update} {condition}")
        names = {alias: name for alias, name in names.items() if alias in used}
    return {
        "TableName": table,
        "Key": {"pk": s(pk)},
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": {**names_in(update, condition), **(names or {})},
        "ExpressionAttributeValues": values,
        "ReturnValues": returns,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
