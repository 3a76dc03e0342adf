"""In-memory stand-ins for the external systems: the ledger and Kinesis.

Each fake keeps the semantics of the real adapter it replaces (the same conditions, the same
shapes of answers) and adds fault knobs that a model test can drive. Imported as
``fakes.<module>``: ``tests/`` is on ``sys.path`` through its rootdir ``conftest.py``.
"""
