"""The dev toolbox that ships with keo: the embedded local stack, fault injection (the fault
proxy, botocore fault hooks, failpoints), and the demo and bench drivers.

Entry points (``cli``, tests) use it; no product package imports it.
"""
