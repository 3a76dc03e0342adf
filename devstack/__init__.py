"""The dev toolbox that ships with keo: the embedded local stack, fault injection (the fault
proxy, botocore fault hooks, failpoints), and the demo and bench drivers.

Entry points (``cli``, tests) use it; no product package imports it. Re-exported here, each
imported on first use (``keo send`` reads its failpoints without starting a local stack's
module): the local stack's module and the fault injectors. The drivers
(:mod:`devstack.demo`, :mod:`devstack.spark_demo`, :mod:`devstack.bench`) are imported by
their commands only, and :mod:`devstack.settings_doc` runs with ``python -m``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dedupe_store.exports import lazy_exports

if TYPE_CHECKING:
    from devstack import emulators as emulators
    from devstack.emulators import EmulatorError as EmulatorError
    from devstack.emulators import Endpoints as Endpoints
    from devstack.failpoints import FailpointError as FailpointError
    from devstack.failpoints import Failpoints as Failpoints
    from devstack.fault_proxy import (
        FaultProxy as FaultProxy,
    )
    from devstack.fault_proxy import (
        FaultRule as FaultRule,
    )
    from devstack.fault_proxy import (
        FaultSchedule as FaultSchedule,
    )
    from devstack.faults import Fault as Fault
    from devstack.faults import FaultInjector as FaultInjector
    from devstack.faults import FaultKind as FaultKind

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "devstack.emulators": ("EmulatorError", "Endpoints"),
        "devstack.failpoints": ("FailpointError", "Failpoints"),
        "devstack.fault_proxy": ("FaultProxy", "FaultRule", "FaultSchedule"),
        "devstack.faults": ("Fault", "FaultInjector", "FaultKind"),
    },
    submodules=["emulators"],
)
