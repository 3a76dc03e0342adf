"""Key mode (``dedupe=key``): a ledger claim per message key, in claim groups under a lease.

The chunk's protocol (:mod:`producer.key.delivery`: open, claim, put, wait, settle), what a
chunk holds (:mod:`producer.key.claims`), waiting on and reading back held claims
(:mod:`producer.key.waiting`, :mod:`producer.key.readback`), taking claims over
(:mod:`producer.key.takeover`) and their pure decisions (:mod:`producer.key.decisions`);
:class:`producer.key.producer.ExactlyOnceProducer` drives them. Never imports
:mod:`producer.replay` (an import contract).
"""
