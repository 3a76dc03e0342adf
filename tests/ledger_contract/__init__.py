"""The ledger contract: every ``Ledger`` backend must pass these cases (ledger schema v2), a
module for each kind of item the ledger stores, as ``dedupe_store`` splits its code::

    groups          claim groups: opened, positions recorded and settled, taken over, renewed;
                    the stale groups of the in-flight index
    claims          key claims one by one: claimed, taken over, released, marked unverifiable;
                    keys and groups read back, per stream, under a valid stream name
    batched_claims  key claims in batches: inserted, the pending ones judged from their items
    batches         Spark batch records
    runs            replay runs, their executions and task attempts; OPEN runs in the index
    run_stripes     replay runs of many tasks: attempts counted in stripes, every stripe
                    fenced by a supersede and a COMPLETE, readers seeing them summed

and what they stage a ledger with (a fixed "now", a stream, two producers, groups, claims and
run attempts) in ``staging``.

``tests/integration/test_ledger_contract.py`` runs them against DynamoDB (dynalite, moto in
server mode and DynamoDB Local), ``tests/unit/test_fake_ledger_contract.py`` against the
in-memory fake; each supplies its own ``ledger`` fixture and adds the cases only its backend
can stage (a response lost on the wire). Imported with ``from ledger_contract import *`` so
pytest collects them: this package takes in every case of its modules.
"""

from ledger_contract.batched_claims import *  # noqa: F403
from ledger_contract.batches import *  # noqa: F403
from ledger_contract.claims import *  # noqa: F403
from ledger_contract.groups import *  # noqa: F403
from ledger_contract.run_stripes import *  # noqa: F403
from ledger_contract.runs import *  # noqa: F403
