"""Read-outs of encoder-only models, as data: for each family, the attribute paths of each head's steps.

A masked-LM head is the transform (dense, activation, norm) and the unembedding; a sequence classifier reads its first
token through a pooler or a classification head (dense, tanh / GELU / ReLU) into the classifier; a token classifier is
one linear map per position. Each family's spec file gives its table (:data:`HeadPaths`); :func:`head_spec` resolves it
on a model, from the model class's task.
"""

from collections.abc import Callable

from torch import nn

from .base import HeadSpec, UnsupportedModelError

#: task → steps: dotted attribute paths on the model (modules, or module attributes holding a function), or functions.
HeadPaths = dict[str, tuple[str | Callable, ...]]

#: The class-name endings of the encoder model classes, by task.
TASK_SUFFIXES = {
    "masked_lm": "ForMaskedLM",
    "sequence_classification": "ForSequenceClassification",
    "token_classification": "ForTokenClassification",
    "ctc": "ForCTC",
}
#: Further class-name endings of a task: an image classifier reads its [CLS] token as a sequence classifier does.
TASK_ALIASES = {"ForImageClassification": "sequence_classification"}


def model_task(model: nn.Module) -> str | None:
    """The head task of an encoder model (:data:`~.base.HEAD_TASKS`), or None for a bare encoder (``BertModel``).

    Raises:
        UnsupportedModelError: A head this package does not explain (question answering, multiple choice, ...).
    """
    name = type(model).__name__
    for task, suffix in TASK_SUFFIXES.items():
        if name.endswith(suffix):
            return task
    for suffix, task in TASK_ALIASES.items():
        if name.endswith(suffix):
            return task
    if getattr(model, "base_model", model) is model:
        return None
    raise UnsupportedModelError(
        f"{name} has a head inseq-mixing does not explain: load the model as ...ForMaskedLM, "
        "...ForSequenceClassification, ...ForTokenClassification, or the bare encoder (...Model)."
    )


def _resolve(model: nn.Module, step: str | Callable):
    if not isinstance(step, str):
        return step
    value = model
    for name in step.split("."):
        value = getattr(value, name)
    return value


def head_spec(model: nn.Module, paths: HeadPaths) -> HeadSpec | None:
    """The :class:`~.base.HeadSpec` of ``model`` from its family's ``paths``, or None for a bare encoder."""
    task = model_task(model)
    if task is None:
        return None
    if task not in paths:
        raise UnsupportedModelError(f"{type(model).__name__}: inseq-mixing has no {task} head for this family.")
    return HeadSpec(task=task, steps=tuple(_resolve(model, step) for step in paths[task]))


def pooled_head_spec(pooling: tuple[int | str, ...], pool_from: int, steps: tuple) -> HeadSpec:
    """An image classifier's pooled read-out (see :class:`~.base.HeadSpec`): ``pooling`` of positions and
    ``"mean"`` (the mean from position ``pool_from`` on), then ``steps``."""
    return HeadSpec(task="sequence_classification", steps=tuple(steps), pooling=tuple(pooling), pool_from=pool_from)
