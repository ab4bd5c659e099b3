"""What every front end shares: the model object's device and name, its layout helpers, its argument checks.

No math, and no decision on what kind a model is (that is :mod:`.router`'s).
"""

import torch
from torch import nn

from ..methods.blocks import upcast


class FrontEndModel:
    """What the encoder and speech front ends share: a Hugging Face ``model``, its device and name, and the hooks a
    dataset run calls (:mod:`inseq_mixing.runs.runner` calls these and never asks which front end it holds):

    - :meth:`run_arguments`: a run's keyword arguments split into the front end's own and the method's options;
    - :meth:`check_rows`: every row checked before any work, errors naming the row;
    - :meth:`attribute_rows`: one batch attributed, with the text each row's target is stored under.

    A new front end fills these (and its ``attribute``) and a dataset run takes it unchanged.
    """

    model: nn.Module

    #: Keyword arguments of ``attribute`` a dataset run passes on besides the method's options.
    RUN_ARGUMENTS: tuple[str, ...] = ()

    def run_arguments(self, kwargs: dict, max_new_tokens: int | None = None) -> tuple[dict, dict]:
        """``kwargs`` split into this front end's own arguments (:data:`RUN_ARGUMENTS`) and the method's options,
        both checked (an unknown name raises ``ValueError`` listing the known ones); ``max_new_tokens`` caps what the
        front end generates, where it generates."""
        own = {name: kwargs[name] for name in self.RUN_ARGUMENTS if name in kwargs}
        options = {name: value for name, value in kwargs.items() if name not in self.RUN_ARGUMENTS}
        try:
            self.check_options(options)
        except ValueError as error:
            if not self.RUN_ARGUMENTS:
                raise
            raise ValueError(f"{error} A dataset run of this model also takes {list(self.RUN_ARGUMENTS)}.") from None
        return own, options

    def check_options(self, options: dict) -> None:
        """Refuse options the method does not take (``ValueError`` naming them)."""
        raise NotImplementedError

    def check_rows(self, sources: list, targets: list, words: list, own: dict, names: list[str]) -> None:
        """Refuse, before any work, a row this front end cannot explain (``ValueError`` naming it by ``names``):
        ``targets`` are the rows' target texts (None: the model's own prediction), ``words`` their word intervals
        (None where not given), ``own`` this front end's arguments (:meth:`run_arguments`)."""
        raise NotImplementedError

    def attribute_rows(self, sources: list, targets: list, words: list, own: dict, options: dict) -> list:
        """One batch of rows (as :meth:`check_rows` takes them) attributed in one call: per row, its Inseq sequence
        output and the text its target is stored under (the given one, or what the model predicted)."""
        raise NotImplementedError

    def row_targets(self, targets: list, names: list[str] | None = None) -> list:
        """The rows' target texts as this front end's targets (:meth:`split_target`), errors naming the row."""
        split = []
        for index, text in enumerate(targets):
            try:
                split.append(None if text is None else self.split_target(text))
            except ValueError as error:
                name = names[index] if names is not None else f"Row {index}"
                raise ValueError(f"{name}: {error}") from None
        return split

    def split_target(self, text: str):
        """A target text as the front end's target."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def model_name(self) -> str:
        return getattr(self.model.config, "name_or_path", "") or type(self.model).__name__


def tokens_first(rows: torch.Tensor) -> torch.Tensor:
    """``([slots,] explained, tokens)`` → Inseq's ``(tokens, explained[, slots])``."""
    rows = upcast(rows.detach()).cpu()
    return rows.permute(2, 1, 0).contiguous() if rows.ndim == 3 else rows.T.contiguous()


def plain(values):
    """NumPy and torch values as Python ones, so that every check reads them alike: arrays and tensors as (nested)
    lists, their scalars (``np.int64(2)``, ``torch.tensor(2)``) as ``int`` / ``float`` / ``str``."""
    if isinstance(values, str) or values is None:
        return values
    if hasattr(values, "tolist"):  # numpy arrays and scalars, torch tensors, pandas series
        return values.tolist()
    if isinstance(values, list | tuple):
        return [plain(value) for value in values]
    return values


def check_batch_size(batch_size) -> None:
    """Refuse a batch size that is not a positive integer, naming it."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}.")
