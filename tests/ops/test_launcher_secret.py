"""The launcher's secret key is made once and kept: a restart of `make up` keeps every
org's webhook secret and every signed result link valid."""

from __future__ import annotations

import stat

from tests.ops.live_stack import stack_py


def test_the_secret_key_is_generated_once_and_kept_private(tmp_path):
    path = tmp_path / ".data" / "secret_key"
    first = stack_py.kept_secret_key(path)
    assert len(first) >= 48
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stack_py.kept_secret_key(path) == first  # the next run, the same key
    path.write_text("")
    assert stack_py.kept_secret_key(path) not in ("", first)  # an emptied file: a new one
