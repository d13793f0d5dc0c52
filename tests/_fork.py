"""Forked children for the kill tests: a child shares this process's imports, so it starts at once, and it can kill
itself at an exact point of a write (a hooked fsync or rename)."""

from __future__ import annotations

import os
import signal
import traceback

TIMEOUT = 120  # seconds a forked child may run before SIGALRM ends it: a hang fails the test, never blocks the suite


def fork(child) -> int:
    """Run ``child()`` in a forked process and return its pid. The child ends with os._exit(3) after ``child``
    (never returning into pytest), or by SIGALRM after TIMEOUT."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(TIMEOUT)
            child()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(3)
    return pid


def exit_code(pid: int) -> int:
    """Wait for child ``pid``; its exit status, or minus the signal that ended it."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
