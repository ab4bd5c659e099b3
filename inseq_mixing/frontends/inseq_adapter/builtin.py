"""Inseq's own value zeroing, kept as ``inseq_value_zeroing``, made safe to fail.

With transformers 5 it crashes on most families (it runs on T5) after registering forward hooks (and a
``sys.settrace`` tracer) that it removes only on success: every later call on the model, a plain forward pass
included, would then break. Since this package exposes it under a name, a failed call must leave the model as it was.
"""

import sys
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

#: ``nn.Module`` attributes that hold hooks.
HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


class BuiltinValueZeroingError(RuntimeError):
    """Inseq's built-in value zeroing failed; the model was restored."""


@contextmanager
def restored_on_failure(model: nn.Module) -> Iterator[None]:
    """On an exception, put back every module's hooks and training flag, the attention implementation and the Python
    tracer as they were on entry, then raise :class:`BuiltinValueZeroingError` from the original error."""
    hooks = {
        module: {name: OrderedDict(getattr(module, name)) for name in HOOK_DICTS if hasattr(module, name)}
        for module in model.modules()
    }
    flags = {module: module.training for module in model.modules()}
    implementation = getattr(model.config, "_attn_implementation", None)
    tracer = sys.gettrace()
    try:
        yield
    except Exception as error:
        sys.settrace(tracer)
        for module, saved in hooks.items():
            for name, entries in saved.items():
                current = getattr(module, name)
                current.clear()
                current.update(entries)
            module.training = flags[module]
        if implementation is not None and model.config._attn_implementation != implementation:
            model.set_attn_implementation(implementation)
        raise BuiltinValueZeroingError(
            f"Inseq's built-in value zeroing failed on {type(model).__name__} ({type(error).__name__}: {error}). "
            "The model was restored. inseq-mixing's method='value_zeroing' computes the same scores on every "
            "supported family."
        ) from error


def guard_builtin_value_zeroing(builtin: type) -> None:
    """Wrap the built-in class's ``attribute`` (once) so that a failure restores the model."""
    if getattr(builtin.attribute, "restores_model_on_failure", False):
        return
    unguarded = builtin.attribute

    def attribute(self, *args, **kwargs):
        with restored_on_failure(self.attribution_model.model):
            return unguarded(self, *args, **kwargs)

    attribute.restores_model_on_failure = True
    attribute.__doc__ = unguarded.__doc__
    builtin.attribute = attribute
