"""Runs: attributing whole datasets into a resumable columnar store (see :func:`attribute_dataset`).

Reading a stored run (:func:`load_run`, :class:`Run`'s tables) imports neither torch nor Inseq: the runner, which
does, is imported when :func:`attribute_dataset` is first used.
"""

from .data import DatasetInputError, Example, read_examples
from .store import Run, RunStoreError, load_run

#: Names of :mod:`.runner` (torch, Inseq), imported on first use.
_RUNNER = ("RunSummary", "attribute_dataset")


def __getattr__(name: str):
    if name in _RUNNER:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DatasetInputError",
    "Example",
    "Run",
    "RunStoreError",
    "RunSummary",
    "attribute_dataset",
    "load_run",
    "read_examples",
]
