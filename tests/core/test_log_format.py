"""make up's terminal: one readable line per event, naming the process it came from."""

from __future__ import annotations

import logging
import re

from apps.core.logging import JsonFormatter, TextFormatter


def test_a_text_line_names_the_process_level_logger_and_context(monkeypatch):
    monkeypatch.setenv("GANTRY_PROCESS_NAME", "worker-h100-1")
    record = logging.LogRecord(
        "apps.jobs", logging.INFO, __file__, 1, "attempt %d ended", (2,), None
    )
    record.job_id = "j-1"
    line = TextFormatter().format(record)
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d worker-h100-1 +INFO +apps\.jobs: attempt 2 ended  \[.*job_id=j-1.*\]", line
    ), line
    assert "\n" not in line and JsonFormatter().format(record).startswith("{")
