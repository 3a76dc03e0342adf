"""The reconciler: key mode's stale in-flight claims resolved by read-back, conditional on the
attempt seen (:mod:`producer.reconcile.reconciler`), their stored payloads resent under a group
of its own (:mod:`producer.reconcile.resend`); replay runs left open reported.
"""
