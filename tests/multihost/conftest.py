"""The multi-host platform (tests/multihost/platform.py), built once for the module, and
the figures its tests measured, printed at the end of the run."""

from __future__ import annotations

import pytest

from tests.multihost.bed import Bed, bed_missing
from tests.multihost.platform import HOSTS, start_platform
from tests.s3_server import s3_missing

FIGURES: list[str] = []


@pytest.fixture(scope="module")
def platform():
    missing = bed_missing() or s3_missing()
    if missing:
        pytest.skip(missing)
    bed = Bed.build(list(HOSTS))
    try:
        started = start_platform(bed)
        started.figures = FIGURES
        yield started
    finally:
        bed.teardown()


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("multi-host figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
