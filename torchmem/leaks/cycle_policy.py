"""When memory held by a reference cycle counts as a leak.

An object that lives in a reference cycle is not a leak: every torchmetrics ``Metric``
is in one by design (``Metric.__init__`` wraps ``self.update`` with ``functools.wraps``,
whose ``__wrapped__.__self__`` points back), and a test that builds one metric leaves one
cycle that the next collection reclaims. What Composer's bug showed (a trainer that
deep-copied its metrics every batch) is cycle garbage that **repeats**: the same code
leaves a new cycle every step, and memory grows until the collector runs, which for
objects in its oldest generation can be very late.

So, with ``cycles="repeating"`` (the default), cycle-held blocks are grouped by
*(allocation stack, holder type)*: the block's captured Python stack (the same line
reached the same way) and the type of the cycle member nearest to it. Within a group,
cycles are counted by *island*: garbage connected to other garbage is one island (a
``MetricCollection``, a ``BootStrapper`` or a ``MetricTracker`` holding many metric
copies, each in a cycle of its own, leaves one), garbage dropped separately is one each
(Composer's copies, one dict of copies per batch). A group counts as leaked when

* it left ``cycle_repeats`` (default 8) or more separate islands in one entry of the
  check (a loop that drops a cycle per iteration), or
* it also left cycle garbage in the previous (non-warm-up) entry of the same check (a
  reused check around one step: ``@torchmem.leak_check()`` on ``train_step``).

Other cycle-held blocks are reported, with a note saying why they were not counted.
``cycles="always"`` counts every cycle-held block (the strict reading), and
``cycles="never"`` reports cycles without ever counting them.

Why 8 and not 2. Within one entry only the count can tell a loop that drops a new cycle
every step from code that builds several objects of one kind, each in a cycle of its own,
in a container that is not itself in a cycle, and drops them together when it returns
(a ``MetricTracker`` after five ``increment()`` calls, a ``MetricCollection`` of three
metrics of one class): both leave separate islands from one stack at the end. When they
became garbage is what differs, and a collection at the end cannot see that. A training
loop runs far more than 8 steps; a test rarely builds 8 objects of one kind from one
line. A reused check (one entry per step) needs no count: a cycle the previous entry
left too is counted at once.

Without stack capture every block has the same (empty) stack, so groups are by holder
type alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

__all__ = [
    "REPEATING", "ALWAYS", "NEVER", "POLICIES", "DEFAULT_REPEATS", "CycleVerdict",
    "normalize_policy", "normalize_repeats", "judge",
]

REPEATING = "repeating"
ALWAYS = "always"
NEVER = "never"
POLICIES = (REPEATING, ALWAYS, NEVER)
DEFAULT_REPEATS = 8

# What the options mean, for error messages and help texts.
POLICY_HELP = (
    "'repeating' (default: cycle garbage counts when one allocation stack and holder type "
    "leave cycle_repeats cycles in one entry, or cycles in consecutive entries), 'always' "
    "(every cycle-held block counts) or 'never' (cycles are reported, never counted)"
)


def normalize_policy(value, what: str = "torchmem.leak_check: cycles") -> str:
    """``value`` as one of ``POLICIES``; a clear error otherwise."""
    if isinstance(value, str) and value.strip().lower() in POLICIES:
        return value.strip().lower()
    raise ValueError(f"{what} must be {POLICY_HELP}; got {value!r}")


def normalize_repeats(value, what: str = "torchmem.leak_check: cycle_repeats") -> int:
    """``value`` (an int, or its text from a command line or ini file) as an int >= 2."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if number is None or number < 2:
        raise ValueError(
            f"{what} must be an int >= 2 (distinct cycles from one allocation stack and holder type "
            f"that make cycle garbage count as leaked); got {value!r}"
        )
    return number


@dataclass(frozen=True)
class CycleVerdict:
    """Whether one cycle-held block counts as leaked, and the note that says why."""

    counted: bool
    note: str


def judge(
    held: list[tuple[int, tuple, int]], *, policy: str, repeats: int, previous: frozenset
) -> tuple[dict[int, CycleVerdict], frozenset]:
    """Verdicts for cycle-held blocks.

    ``held`` lists ``(index, key, island)``: the finding's index, its group key
    ``(context id, holder type)`` and the id of the garbage island that held it. ``previous``: the
    keys the check's previous entry left. Returns ``{index: CycleVerdict}`` and the keys
    of this entry (the ``previous`` of the next).
    """
    cycles: dict[tuple, set] = defaultdict(set)
    for _, key, cycle_id in held:
        cycles[key].add(cycle_id)
    verdicts = {}
    for index, key, _ in held:
        holder = key[1] or "an unknown object"
        count = len(cycles[key])
        if policy == ALWAYS:
            verdicts[index] = CycleVerdict(True, "counted: cycles='always' counts every cycle-held block")
        elif policy == NEVER:
            verdicts[index] = CycleVerdict(False, "not counted: cycles='never' reports cycle garbage without counting it")
        elif count >= repeats:
            verdicts[index] = CycleVerdict(
                True,
                f"counted: {count} separate cycles held by {holder}, not connected to each other, were left by "
                f"this allocation stack in this entry (cycles='repeating' counts {repeats} or more: garbage that "
                "piles up until gc runs)",
            )
        elif key in previous:
            verdicts[index] = CycleVerdict(
                True,
                f"counted: this allocation stack also left a cycle held by {holder} in the previous entry of "
                "this check (cycles='repeating': garbage that piles up step after step)",
            )
        else:
            verdicts[index] = CycleVerdict(
                False,
                f"not counted: {count} separate cycle{'s' if count != 1 else ''} held by {holder} from this "
                f"allocation stack (an object that lives in a reference cycle; cycles='repeating' counts {repeats} "
                "or more separate ones from one stack and holder type, or one in consecutive entries of a reused "
                "check)",
            )
    return verdicts, frozenset(cycles)
