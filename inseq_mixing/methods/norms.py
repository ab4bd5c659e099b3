r"""Layer norms with their statistics frozen at the forward pass: affine maps that can be applied to parts of a sum.

With the statistics of the real input :math:`z` frozen, a LayerNorm is the linear map
:math:`A(x) = \gamma \odot (x - \bar x) / \sigma_z` plus the shift :math:`\beta`, and an RMSNorm is
:math:`A(x) = \gamma \odot x / \mathrm{rms}(z)`; a layer scale (DINOv2) is :math:`A(x) = \gamma \odot x` already.
So :math:`\mathrm{LN}(z) = \sum_k A(x_k) + \beta` for any split
:math:`z = \sum_k x_k`. The transpose :math:`A^\top` carries a direction in the norm's output space (e.g. an
unembedding row) back to its input space.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ..specs.base import NormParams, norm_params
from .blocks import upcast


@dataclass
class FrozenNorm:
    """One norm's affine map at fixed statistics, for every position of a batch.

    Attributes:
        params: What the norm computes.
        inv_scale: ``1 / σ`` (LayerNorm) or ``1 / rms`` (RMSNorm) of the real input, ``(batch, positions, 1)``.
    """

    params: NormParams
    inv_scale: torch.Tensor

    @property
    def shift(self) -> torch.Tensor | None:
        """The shift :math:`\\beta` (None for RMSNorm or a norm without bias)."""
        return None if self.params.bias is None else upcast(self.params.bias)

    def _gain(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.params.weight is None else tensor * upcast(self.params.weight)

    def linear(self, parts: torch.Tensor, positions: slice = slice(None), in_place: bool = False) -> torch.Tensor:
        """:math:`A(x)` for parts ``(batch, positions, *, d_model)`` of the inputs at ``positions`` (the gain and the
        scale applied as one per-position factor: two passes over the parts); ``in_place``: written over ``parts``
        (which nothing else may read), the same values without a new tensor."""
        scale = self.inv_scale[:, positions]
        factor = self._gain(scale.reshape(*scale.shape[:2], *[1] * (parts.dim() - 2)))
        if self.params.kind == "layer":
            mean = parts.mean(-1, keepdim=True)
            return (parts.sub_(mean) if in_place else parts - mean).mul_(factor)
        return parts.mul_(factor) if in_place else parts * factor

    def gain(self, width: int) -> torch.Tensor:
        """The gain ``γ`` ``(width,)`` (ones for a norm without one)."""
        return self._gain(self.inv_scale.new_ones(width))

    def factor(self) -> torch.Tensor:
        """An RMSNorm's map as one factor per position and channel ``(batch, positions, d_model)``: its gain over
        the position's RMS.

        Raises:
            ValueError: A LayerNorm (its map centres too).
        """
        if self.params.kind == "layer":
            raise ValueError("A LayerNorm's map is not a factor per channel: it centres its input too.")
        return self._gain(self.inv_scale)

    def unscaled(self, parts: torch.Tensor) -> torch.Tensor:
        r""":math:`A(x)` without its per-position scale (the gain after the centring, a LayerNorm's; the same map at
        every position), for parts ``(..., d_model)``: :math:`A_i(x) = s_i\, \mathrm{unscaled}(x)`, with
        :math:`s_i` the position's :attr:`inv_scale`."""
        if self.params.kind == "layer":
            parts = parts - parts.mean(-1, keepdim=True)
        return self._gain(parts)

    def dot_linear(self, parts: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        r""":math:`A(x) \cdot v` for parts ``(batch, positions, *, d_model)`` of the inputs at every position, without
        forming :math:`A(x)`: :math:`s\, x \cdot c(\gamma \odot v)` (scale :math:`s`, gain :math:`\gamma`, :math:`c`
        centring the vector for a LayerNorm, whose mean subtraction is symmetric), one pass over the parts."""
        vector = self._gain(upcast(vector))
        if self.params.kind == "layer":
            vector = vector - vector.mean()
        scale = self.inv_scale.reshape(*self.inv_scale.shape[:2], *[1] * (parts.dim() - 3))
        return (parts @ vector) * scale

    def transpose(self, direction: torch.Tensor) -> torch.Tensor:
        """:math:`A^\\top g` for one direction per position, ``(batch, positions, d_model)``."""
        carried = self._gain(direction) * self.inv_scale
        if self.params.kind == "layer":
            carried = carried - carried.mean(-1, keepdim=True)
        return carried


def freeze_norm(norm: nn.Module, norm_input: torch.Tensor, eps: float | None = None) -> FrozenNorm:
    """Freeze ``norm`` at the statistics of its recorded input ``(batch, positions, d_model)`` (a LayerNorm's ``eps``
    may be replaced, e.g. by 0 for a convention that leaves it out)."""
    params = norm_params(norm)
    if params.kind == "layer":
        variance = upcast(norm_input).var(-1, unbiased=False, keepdim=True)
        return FrozenNorm(params=params, inv_scale=torch.rsqrt(variance + (params.eps if eps is None else eps)))
    if params.kind == "scale":  # a layer scale has no statistics: its map is its own
        return FrozenNorm(params=params, inv_scale=upcast(norm_input).new_ones(*norm_input.shape[:2], 1))
    # RMSNorms of T5 and Llama-style models take their statistics in float32 whatever the model's precision.
    variance = norm_input.float().pow(2).mean(-1, keepdim=True)
    return FrozenNorm(params=params, inv_scale=upcast(torch.rsqrt(variance + params.eps)).to(upcast(norm_input).dtype))
