"""Checks on device values, read back together: one host copy per method call instead of one per check.

A finite check (``torch.isfinite(x).all()`` turned into a Python ``bool``) or ALTI's count of rows with no part
closer to the output than the origin reads a value the device computed: a host–device synchronisation each, which on
a GPU stalls the queue of kernels until that value is ready. Inside :func:`one_read` (``Declaration.run`` opens it
around a method's trace and math), :func:`check` only records the device scalar and what to do with its value; when
the scope ends, the recorded scalars come back in one copy (per device) and each action runs in the order the checks
were made, so the first failing check raises, as it would have at its place. Outside a scope :func:`check` acts at
once.

If the work inside the scope raises, the recorded checks are read first: a non-finite forward pass or score explains
the failure better than what it caused downstream, and is raised instead (chained to the original error).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The checks recorded in the innermost open :func:`one_read` scope (None: act at once).
_PENDING: contextvars.ContextVar[list | None] = contextvars.ContextVar("inseq_mixing_pending_checks", default=None)


def check(value: torch.Tensor, act: Callable[[int], None]) -> None:
    """Call ``act`` with the value of the integer or boolean device scalar ``value`` (as an ``int``: a bool reads 0 or
    1), now or when the open :func:`one_read` scope ends."""
    pending = _PENDING.get()
    if pending is None:
        act(int(value))
    else:
        pending.append((value.detach().reshape(()), act))


@contextlib.contextmanager
def one_read() -> Iterator[None]:
    """Defer every :func:`check` made inside to one read when the scope ends (a nested scope joins the outer one)."""
    if _PENDING.get() is not None:
        yield
        return
    pending: list = []
    token = _PENDING.set(pending)
    try:
        yield
    except Exception as error:
        _PENDING.reset(token)
        token = None
        try:
            settle(pending)
        except Exception as explained:
            raise explained from error
        raise
    finally:
        if token is not None:
            _PENDING.reset(token)
    settle(pending)


def settle(pending: list) -> None:
    """Read the recorded scalars back (one copy per device) and run their actions in order."""
    if not pending:
        return
    import torch  # here: the method declarations import this module, and listing them needs no torch

    by_device: dict[torch.device, list[int]] = {}
    for number, (value, _act) in enumerate(pending):
        by_device.setdefault(value.device, []).append(number)
    values = [0] * len(pending)
    for numbers in by_device.values():
        read = torch.stack([pending[number][0].to(torch.long) for number in numbers]).tolist()
        for number, value in zip(numbers, read, strict=True):
            values[number] = value
    for (_scalar, act), value in zip(pending, values, strict=True):
        act(value)
