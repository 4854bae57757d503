"""Fixtures shared by the tests/ops modules."""

# The running platform slice of the metrics and logging tests, started once per run of the
# package (tests/ops/live_stack.py).
from tests.ops.live_stack import ops, stack  # noqa: F401
