"""Replay mode (``dedupe=replay``): what a failure-free run would have written, however often
Spark retries or replays its tasks, with no ledger write per message.

An attempt registers on its run (:mod:`producer.replay.producer`), recovers what earlier
attempts may have put by reading their windows back (:mod:`producer.replay.readback`), and
puts the rest under its own lease; what is earlier and what is left are pure decisions
(:mod:`producer.replay.plan`). Never imports :mod:`producer.key` (an import contract).
"""
