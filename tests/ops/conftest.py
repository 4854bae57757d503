"""Fixtures shared by the tests/ops modules.

- `stack`, `ops`: the running platform slice of the metrics and logging tests, started
  once per run of the package (tests/ops/live_stack.py);
- `platform`: the whole platform as `make up` starts it, once per test module that asks
  for it (tests/ops/launched.py).
"""

from tests.ops.launched import platform  # noqa: F401
from tests.ops.live_stack import ops, stack  # noqa: F401
