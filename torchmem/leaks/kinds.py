"""The kinds of leak-check findings, in the order a report lists them.

Their own module so that the report (``report``) and its text rendering (``render``) both use
them without importing each other.
"""

from __future__ import annotations

REACHABLE = "reachable"  # still held after gc.collect(): owners name the holders
CYCLE = "cycle"  # freed only by gc.collect(): a reference cycle held it
PENDING = "pending"  # freed, waiting for other streams' events
ALLOWED = "allowed"  # expected to survive (tag, expect_alive, returned, warm-up, ...)
KINDS = (REACHABLE, CYCLE, PENDING, ALLOWED)
LEAKED_KINDS = (REACHABLE, CYCLE)  # only these count as leaked
