"""Moving payloads between the ranks of a process group, with bounded waits and clear errors.

Everything goes through torch.distributed's own object collectives (``all_gather_object``,
``gather_object``) on the group the caller names (default: the whole job). A payload is
``bytes`` (``payload.encode``), so what crosses the wire is exactly what ``docs/distributed.md``
measures.

Bounded waits. A collective waits for the slowest rank, up to the process group's timeout
(``init_process_group(timeout=...)``; PyTorch's default is 30 minutes for Gloo, 10 for
NCCL). A rank that *died* is noticed at once on Gloo (its sockets close), and every other
rank gets a ``CollectiveError``. With ``timeout=`` seconds on a Gloo group, a
``monitored_barrier`` runs first: ranks that do not arrive within it are named in the error
on rank 0, and every rank fails within about ``timeout``. NCCL has no monitored barrier;
there the group's own timeout bounds the wait.
"""

from __future__ import annotations

import re
from datetime import timedelta

import torchmem
from torchmem.distributed.errors import CollectiveError

__all__ = ["GroupInfo", "group_info", "all_gather_bytes", "gather_bytes", "OWN_TAG"]

# What torchmem's own exchanges allocate (the object collectives' staging tensors) is charged to
# this tag, not to the user's tags or "untagged".
OWN_TAG = "torchmem.distributed"

_RANKS_IN_MESSAGE = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


class GroupInfo:
    """The process group a collective runs on: this rank's position, the size, the backend."""

    def __init__(self, group, rank: int, size: int, global_rank: int, backend: str):
        self.group = group
        self.rank = rank
        self.size = size
        self.global_rank = global_rank
        self.backend = backend

    def global_rank_of(self, group_rank: int) -> int:
        import torch.distributed as dist

        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)


def group_info(group, what: str) -> GroupInfo:
    """Checks that a process group is there; raises what to do when it is not."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(f"{what}: this PyTorch build has no torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError(
            f"{what}: no process group in this process; call torch.distributed.init_process_group(...) "
            "on every rank first (for a single process, use the torchmem function of the same name)"
        )
    try:
        rank = dist.get_rank(group)
        size = dist.get_world_size(group)
        backend = str(dist.get_backend(group))
    except (RuntimeError, ValueError) as error:  # e.g. a destroyed or foreign group
        raise RuntimeError(f"{what}: the process group cannot be used ({error})") from error
    if rank < 0:
        raise RuntimeError(f"{what}: this rank is not a member of the group it was given")
    return GroupInfo(group, rank, size, dist.get_rank(), backend)


def _bound(info: GroupInfo, timeout: float | None, what: str) -> None:
    """With a timeout on a Gloo group: wait for every rank at most ``timeout`` seconds."""
    if timeout is None or "gloo" not in info.backend:
        return
    import torch.distributed as dist

    try:
        dist.monitored_barrier(group=info.group, timeout=timedelta(seconds=timeout), wait_all_ranks=True)
    except Exception as error:  # noqa: BLE001 - gloo raises RuntimeError or DistBackendError
        found = _RANKS_IN_MESSAGE.search(str(error))
        ranks = tuple(int(rank) for rank in found.group(1).replace(" ", "").split(",") if rank) if found else ()
        who = (
            f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))} did not arrive"
            if ranks
            else "not every rank arrived (rank 0 names them in its error)"
        )
        raise CollectiveError(
            f"{what}: {who} within {timeout:g} s. A rank crashed, hangs, or does not run this "
            f"collective at this point of the program. ({_one_line(error)})",
            ranks,
        ) from error


def all_gather_bytes(info: GroupInfo, payload: bytes, *, what: str, timeout: float | None) -> list[bytes]:
    """Every rank's payload, on every rank (index = rank in the group)."""
    import torch.distributed as dist

    with torchmem.tag(OWN_TAG):
        _bound(info, timeout, what)
        gathered: list = [None] * info.size
        try:
            dist.all_gather_object(gathered, payload, group=info.group)
        except Exception as error:  # noqa: BLE001
            raise _failed(what, error) from error
    return gathered


def gather_bytes(info: GroupInfo, payload: bytes, dst: int, *, what: str, timeout: float | None) -> list[bytes] | None:
    """Every rank's payload on group rank ``dst`` (None elsewhere)."""
    import torch.distributed as dist

    with torchmem.tag(OWN_TAG):
        _bound(info, timeout, what)
        gathered: list | None = [None] * info.size if info.rank == dst else None
        try:
            dist.gather_object(payload, gathered, dst=info.global_rank_of(dst), group=info.group)
        except Exception as error:  # noqa: BLE001
            raise _failed(what, error) from error
    return gathered


def _failed(what: str, error: BaseException) -> CollectiveError:
    return CollectiveError(
        f"{what}: the exchange between ranks failed ({_one_line(error)}). Another rank crashed, was "
        "killed, destroyed its process group, or timed out; its own output says which."
    )


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."

