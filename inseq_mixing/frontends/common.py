"""What every front end shares: the model object's device and name, its layout helpers, its argument checks.

No math, and no decision on what kind a model is (that is :mod:`.router`'s).
"""

import torch
from torch import nn

from ..methods.blocks import upcast


class FrontEndModel:
    """What the encoder and speech front ends share: a Hugging Face ``model``, its device and name."""

    model: nn.Module

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
