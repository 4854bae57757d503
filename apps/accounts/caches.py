"""The accounts rows that the hot paths remember per process (see core.memo)."""

from apps.core.memo import ProcessMemo

key_cache = ProcessMemo()  # API keys by digest
project_memo = ProcessMemo()  # project rows by (org id, id or name)
