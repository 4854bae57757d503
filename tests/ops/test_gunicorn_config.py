"""The API's gunicorn settings (config/gunicorn.py)."""

from __future__ import annotations

import gc
import importlib

from apps.core import metrics


def test_a_worker_that_loaded_the_app_freezes_what_start_up_made(monkeypatch, tmp_path):
    # Importing the settings module picks a metrics directory for the processes it serves.
    monkeypatch.setenv(metrics.MULTIPROC_ENV, str(tmp_path))
    settings = importlib.import_module("config.gunicorn")
    gc.unfreeze()
    try:
        settings.post_worker_init(worker=None)
        assert gc.get_freeze_count() > 0  # out of every pass of the collector from now on
    finally:
        gc.unfreeze()
