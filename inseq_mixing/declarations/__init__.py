"""The registry of method declarations: one short module per method, each defining ``DECLARATION`` (see
:mod:`.base`). Importable without Inseq: the Inseq adapter, the CLI, the dataset runner and the encoder-only and
speech front ends all read it.

Adding a method is two files: its math under :mod:`inseq_mixing.methods`, and its declaration here (name, options,
``compute``); the module is found by name, the Inseq method class is generated, and the shared tests run on it.
"""

import importlib
import pkgutil

from .base import Declaration, InputSize, Request


def _discover() -> dict[str, Declaration]:
    names = [info.name for info in pkgutil.iter_modules(__path__) if info.name != "base"]
    found = {}
    for name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        declaration = getattr(module, "DECLARATION", None)
        if isinstance(declaration, Declaration):
            found[declaration.name] = declaration
    ranked = sorted(found, key=lambda name: (found[name].rank, name))  # each declaration says where it is listed
    return {name: found[name] for name in ranked}


#: Method name → declaration, in listing order.
DECLARATIONS: dict[str, Declaration] = _discover()


def get_declaration(name: str) -> Declaration:
    """The declaration of method ``name``.

    Raises:
        ValueError: No such method (the message lists them).
    """
    if name not in DECLARATIONS:
        raise ValueError(f"No inseq-mixing method {name!r}; the methods are {list(DECLARATIONS)}.")
    return DECLARATIONS[name]


__all__ = ["DECLARATIONS", "Declaration", "InputSize", "Request", "get_declaration"]
