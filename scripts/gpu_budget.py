"""The clock of `scripts/gpu_check.py`: its budget, deadlines and watchdog.

`Budget.limit(deadline)` interrupts a block at its deadline with a timer
(`SIGALRM`), raising `OutOfTime` in the main thread. That exception reaches
Python code only: a backend call waiting in native code, or a library that
swallows the exception, keeps running. `start_watchdog` covers that: a
thread ends the process a grace period after the running case's deadline
(`Budget.cut_off_at`), or at the budget's hard end, and `faulthandler`
ends it just before the budget where even that thread cannot run (native
code holding the GIL).
"""

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback

# Seconds a case may run past its deadline before the watchdog cuts it off
# (an XLA or cuDNN call started before the deadline may need them to return).
GRACE_S = (5.0, 20.0)
# At a section's deadline before the budget's end, the share of the later
# sections' time a case may take past it, where that is more than GRACE_S:
# cutting it off ends the whole check, so those sections lose everything.
SPLIT_GRACE_SHARE = 0.25


class OutOfTime(BaseException):
    """A section's deadline passed (a `BaseException`, so that no
    `except Exception` on the kernel swallows it)."""


class Budget:
    """`seconds` from `start` (a `time.monotonic()`): `end` is where the
    work stops, less a reserve for writing the files; `hard_end` is where
    the watchdog ends the process whatever runs."""

    def __init__(self, seconds, start):
        self.seconds = seconds
        self.start = start
        self.reserve = min(5.0, 0.05 * seconds)
        self.end = start + seconds - self.reserve
        self.blocking_end = start + seconds - 0.6 * self.reserve
        self.grace = min(max(GRACE_S[0], 0.1 * seconds), GRACE_S[1])

    def cut_off_at(self, deadline):
        """When the watchdog ends a case still running at `deadline`:
        `grace` after it, or at a section's deadline a quarter of the time
        left after it where that is longer (a long first XLA compilation or
        cuDNN autotuning still returns, and the later sections run shorter
        rather than not at all); never after `hard_end`."""
        grace = max(self.grace, SPLIT_GRACE_SHARE * (self.end - deadline))
        return min(deadline + grace, self.blocking_end)

    def left(self, deadline=None):
        return min(deadline or self.end, self.end) - time.monotonic()

    @contextlib.contextmanager
    def limit(self, deadline):
        """Raises `OutOfTime` in the block when `deadline` passes, and again
        every half second after it (a library's bare `except:` may swallow
        one)."""
        left = self.left(deadline)
        if left <= 0:
            raise OutOfTime()

        def expired(signum, frame):
            raise OutOfTime()

        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, left, 0.5)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def start_watchdog(budget, running, cut_off, fault_file):
    """Starts the watchdog thread and arms `faulthandler` as its backstop.

    Args:
        budget: The `Budget`.
        running: Callable returning `(section, case name, deadline)` of the
            case that runs, or None between cases.
        cut_off: Callable `(running, stack)` that records the case cut off
            (None: the budget's end) and the main thread's stack (a string)
            and writes the results; the process then exits with status 0.
        fault_file: An open file for `faulthandler`'s dump of every thread's
            stack if it ends the process (exit status 1).
    """
    backstop = budget.start + budget.seconds - 0.2 * budget.reserve
    faulthandler.dump_traceback_later(
        max(backstop - time.monotonic(), 0.1), exit=True, file=fault_file
    )

    def watch():
        main = threading.main_thread().ident
        while True:
            time.sleep(0.2)
            case = running()
            limit = budget.blocking_end if case is None else budget.cut_off_at(case[2])
            if time.monotonic() >= limit:
                break
        stack = "".join(traceback.format_stack(sys._current_frames().get(main)))
        cut_off(case, stack)
        sys.stdout.flush()
        os._exit(0)

    threading.Thread(target=watch, name="watchdog", daemon=True).start()
