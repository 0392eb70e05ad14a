"""Who holds a block: from the tensors whose storage lies in it up to a named root.

A leak report is only useful if it says *what* keeps memory alive. Given engine blocks
(device, address, size), this module

1. finds the Python objects that use each block (``locate_tensors``): tensors and untyped
   storages whose storage starts inside it, the ``.grad`` of leaf tensors, and tensors saved
   in autograd graphs (reached from the tensors that own the graphs);
2. searches **down** from the roots it already knows, at no cost in heap passes: objects
   the check was told to allow (``AllowedRoot``: a pytest test's parametrize values and
   fixtures) and the locals of live frames; most holders are found here;
3. walks referrers **up** from the rest, breadth first and for all blocks at once, until
   it meets a **named root**: a module global (``module.name``), a class attribute
   (``module.Class.name``), a live frame's local (``function():name`` with file:line) or an
   allowed root. Roots inside the test runner's machinery (pytest's frames and globals)
   are kept only as a last resort: behind them there is usually the user's object that
   really keeps the memory (the module-level list a ``@pytest.mark.parametrize`` was given);
4. explains what the walk cannot see: numpy arrays viewing a tensor (untracked by the
   collector, so invisible to ``gc.get_referrers``: found from the tracked containers that
   hold them), TorchScript modules, autograd graphs and other C++ holders, and never says
   that no Python object refers to a tensor when its reference count says otherwise;
5. for blocks kept only by garbage (``find_cycle_holders``), finds the reference cycle
   that holds them and names the types in it.

Cost: this runs only for blocks that survived the check's collection. Step 2 visits a
bounded number of objects; each level of step 3 is one pass over the heap
(``gc.get_referrers``), shared by all blocks. While the collector is frozen
(``torchmem.leaks.collector``) the tensors are looked for among the objects made during
the check first.

The parts, one concern each: ``search`` (``find_owners``, the order of the steps),
``roots`` (what counts as a name), ``downward`` and ``upward`` (the two walks), ``closed``
(step 2 alone, without step 1's pass over the heap, when reference counts prove that nothing
outside the walk from the roots holds the blocks),
``numpy_views`` (holders the collector does not track); ``torchmem.leaks.cycles`` finds
the cycles of step 5.
"""

from torchmem.leaks.cycles import CycleHolder, find_cycle_holders
from torchmem.leaks.owners.roots import AllowedRoot, warm_up
from torchmem.leaks.owners.search import (
    DEFAULT_MAX_DEPTH, DEFAULT_MAX_OWNERS, DEFAULT_NODE_BUDGET, DEFAULT_TIME_BUDGET, OwnerSearch, find_owners,
)
from torchmem.leaks.paths import Owner, edge_labels, render_path
from torchmem.leaks.tensors import BlockIndex, BlockKey, device_key, locate_tensors

__all__ = [
    "Owner", "AllowedRoot", "CycleHolder", "OwnerSearch", "BlockIndex", "BlockKey", "device_key",
    "locate_tensors", "find_owners", "find_cycle_holders", "edge_labels", "render_path", "warm_up",
    "DEFAULT_MAX_DEPTH", "DEFAULT_TIME_BUDGET", "DEFAULT_MAX_OWNERS", "DEFAULT_NODE_BUDGET",
]
