"""Runs: attributing whole datasets into a resumable columnar store (see :func:`attribute_dataset`)."""

from .data import DatasetInputError, Example, read_examples
from .runner import RunSummary, attribute_dataset
from .store import Run, RunStoreError, load_run

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
