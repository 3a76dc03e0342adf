"""The dev toolbox that ships with keo: the embedded local stack, fault injection (the fault
proxy, botocore fault hooks, failpoints), and the demo and bench drivers.

Entry points (``cli``, tests) use it; no product package imports it. Re-exported here: the
local stack's module and the fault injectors. The drivers (:mod:`devstack.demo`,
:mod:`devstack.spark_demo`, :mod:`devstack.bench`) are imported by their commands only, and
:mod:`devstack.settings_doc` runs with ``python -m``, so this package does not import them.
"""

from __future__ import annotations

from devstack import emulators
from devstack.emulators import EmulatorError, Endpoints
from devstack.failpoints import FailpointError, Failpoints
from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from devstack.faults import Fault, FaultInjector, FaultKind

__all__ = [
    "EmulatorError",
    "Endpoints",
    "FailpointError",
    "Failpoints",
    "Fault",
    "FaultInjector",
    "FaultKind",
    "FaultProxy",
    "FaultRule",
    "FaultSchedule",
    "emulators",
]
