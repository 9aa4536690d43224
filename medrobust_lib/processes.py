"""Operating-system processes: whether a process id still names a running process (orphaned
temporary marts, orphaned runs). The worker pools live in :mod:`medrobust_lib.runtime`."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0 is sent, nothing is delivered). A
    process of another user (``PermissionError``) counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
