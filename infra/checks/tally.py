"""What compose.py and invariants.py share: the pass/fail tally their checks print into, and the
silent run their self-tests use to show that a broken input fails.

Imported by name: both scripts run as `python infra/checks/<script>.py`, which puts this folder
on the import path.
"""

from __future__ import annotations

import os
import sys


class Checks:
    def __init__(self) -> None:
        self.passed, self.failed = 0, 0

    def check(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
            print(f"  ok    {what}")
        else:
            self.failed += 1
            print(f"  FAIL  {what}")

    def guard(self, what: str, fn) -> None:
        try:
            self.check(bool(fn()), what)
        except (AssertionError, KeyError, TypeError, ValueError, IndexError) as e:
            self.check(False, f"{what} ({type(e).__name__}: {e})")


def failures(run, *args) -> int:
    """How many checks `run(*args, checks)` fails, with its output silenced."""
    quiet = Checks()
    stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        run(*args, quiet)
    finally:
        sys.stdout.close()
        sys.stdout = stdout
    return quiet.failed
