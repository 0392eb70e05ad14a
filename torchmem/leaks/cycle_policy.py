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
reached the same way) and the type of the cycle member nearest to it. Within a group the
policy counts **copies dropped separately**, decided from what repeats and which way the
references go, not from whether the garbage happens to be connected:

* each copy's cycle is traced *upwards* (``cycles.find_cycle_holders``): to the topmost
  cycles of the garbage that reach it, those no other garbage refers to;
* copies that share such a top were dropped together: a ``BootStrapper`` of ten metric
  copies (a ``Metric``, in a cycle itself) is one top above all its copies, so they count
  once; a container in no cycle (a ``MetricTracker``, a ``ModuleList``, a plain list) is
  freed by reference counting and leaves its copies with no common top: they count like a
  loop's, from ``cycle_repeats`` on;
* a block no tensor in the garbage uses (its holder unknown: memory an autograd graph keeps
  from C++) is not counted: nothing tells whether it was dropped apart from the others;
* copies with no common top were dropped one by one: ten copies left by a loop are ten,
  even though every copy refers to the same class, module, function or shared default,
  and even when that class is garbage too (a script's own class once ``run`` releases the
  script's globals, a class defined inside a test). Those shared objects are *below* every
  copy: references go from the copy to them, so they join nothing.

A group counts as leaked when it left ``cycle_repeats`` (default 8) or more separate copies
in one entry of the check: a loop that drops a cycle per iteration. Each entry is judged on
its own: a reused check (``@torchmem.leak_check()`` on ``evaluate()``) collects at every
exit, so one cycle per call (a metric built by each call) never piles up, and it is not a
leak on the second call any more than on the first.

Other cycle-held blocks are reported, with a note saying why they were not counted.
``cycles="always"`` counts every cycle-held block (the strict reading), and
``cycles="never"`` reports cycles without ever counting them.

Why 8 and not 2. Within one entry only the count can tell a loop that drops a new cycle
every step from code that builds several objects of one kind, each in a cycle of its own,
in a container that is not itself in a cycle (a plain list freed by reference counting),
and drops them together when it returns: both leave separate copies from one stack at the
end. When they became garbage is what differs, and a collection at the end cannot see
that. A training loop runs far more than 8 steps; a test rarely builds 8 objects of one
kind from one line.

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
    "leave cycle_repeats separately dropped cycles in one entry), 'always' "
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


def _separate_copies(held_by: list[frozenset]) -> int:
    """How many of the holders share no top with another (union-find over their tops)."""
    parent: dict = {}

    def root(item):
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    for tops in held_by:
        items = list(tops)
        for item in items:
            parent.setdefault(item, item)
        for item in items[1:]:
            a, b = root(items[0]), root(item)
            if a != b:
                parent[a] = b
    return len({root(item) for item in parent})


def judge(held: list[tuple[int, tuple, frozenset]], *, policy: str, repeats: int) -> dict[int, CycleVerdict]:
    """Verdicts for the cycle-held blocks of one entry.

    ``held`` lists ``(index, key, tops)``: the finding's index, its group key
    ``(context id, holder type)`` and the topmost garbage cycles above the cycle that held
    it (``CycleHolder.dropped_with``; a unique token when the holder is unknown). Returns
    ``{index: CycleVerdict}``.
    """
    tops_by_key: dict[tuple, dict] = defaultdict(dict)
    for _, key, tops in held:
        tops_by_key[key][tops] = None
    copies = {key: _separate_copies(list(tops)) for key, tops in tops_by_key.items()}
    verdicts = {}
    for index, key, _ in held:
        holder = key[1]
        count = copies[key]
        if policy == ALWAYS:
            verdicts[index] = CycleVerdict(True, "counted: cycles='always' counts every cycle-held block")
        elif policy == NEVER:
            verdicts[index] = CycleVerdict(False, "not counted: cycles='never' reports cycle garbage without counting it")
        elif not holder:
            # No tensor using the block was found in the garbage (memory an autograd graph keeps
            # from C++): nothing says which cycle held it, so nothing says it was dropped apart
            # from the other blocks of its line. 40 gradients of one backward() are not 40 copies.
            verdicts[index] = CycleVerdict(
                False,
                "not counted: held by garbage in which no tensor using it was found, so whether it was dropped "
                "apart from the other blocks of this allocation stack cannot be told (cycles='always' counts it)",
            )
        elif count >= repeats:
            verdicts[index] = CycleVerdict(
                True,
                f"counted: {count} separate cycles held by {holder}, each dropped on its own, were left by this "
                f"allocation stack in this entry (cycles='repeating' counts {repeats} or more: garbage that piles "
                "up until gc runs)",
            )
        else:
            verdicts[index] = CycleVerdict(
                False,
                f"not counted: {count} separate cycle{'s' if count != 1 else ''} held by {holder} from this "
                f"allocation stack (an object that lives in a reference cycle; cycles='repeating' counts {repeats} "
                "or more separately dropped ones from one stack and holder type)",
            )
    return verdicts
