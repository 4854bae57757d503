"""Operating-system process helpers that need no Django (the launcher imports them before
any settings exist)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def signal_on_parent_death(signum: int) -> bool:
    """Ask the kernel to send `signum` to this process when its parent exits, even by
    SIGKILL, so that no child outlives the process that supervises it (Linux only; a
    `preexec_fn` of a child, or a process's first step). True if it was arranged."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
