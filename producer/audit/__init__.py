"""The audits: each key in the stream once (:mod:`producer.audit.stream`, ``keo audit``, both
modes), replay mode's rows as a multiset (:mod:`producer.audit.rows`), and what both audits'
findings are made of (:mod:`producer.audit.findings`).
"""
