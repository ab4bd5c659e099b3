"""Opt-in compiled kernels: ``compile=True``, one option for every method that declares it.

A method's hot per-chunk steps (value zeroing's FFN and distance on the corrupted rows; the ALTI family's part
scorers) are plain functions that the math calls through :func:`kernel`. Inside :func:`compiling` (which
:meth:`~inseq_mixing.declarations.Declaration.run` enters when the options say ``compile=True``) :func:`kernel` returns
the function compiled once per process by ``torch.compile`` with dynamic shapes, so that chains of elementwise
operations run as fused kernels instead of one pass over memory each; outside, the function itself. The first call
compiles (seconds on a CPU; ``benchmarks/bench_floor.py --compile`` reports how long), later calls of any layer,
chunk or batch shape reuse it. Results equal the eager ones up to float rounding. Compiling needs what
``torch.compile``'s inductor needs: a C++ compiler on a CPU, Triton on a GPU. Importable without torch.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("inseq_mixing_compile", default=False)
_COMPILED: dict[Callable, Callable] = {}


@contextlib.contextmanager
def compiling(enabled: bool) -> Iterator[None]:
    """Within the block, :func:`kernel` gives compiled functions if ``enabled``."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def kernel(function: Callable) -> Callable:
    """``function``, compiled (once per process, dynamic shapes) when inside ``compiling(True)``."""
    if not _ENABLED.get():
        return function
    compiled = _COMPILED.get(function)
    if compiled is None:
        import torch

        compiled = _COMPILED[function] = torch.compile(function, dynamic=True)
    return compiled
