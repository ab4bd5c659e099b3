"""The packed vision towers of Qwen2-VL, Qwen2.5-VL and Qwen3.5 laid out for the trace: one image at a time, with a
batch axis.

These towers run every image's patches as one ``(patches, width)`` sequence, their attention split into images (and,
in Qwen2.5-VL's windowed blocks, into windows of 2 × 2-patch units reordered to lie side by side) by cumulative
lengths, and their attention modules return no probabilities. :class:`PackedTower` runs the same blocks, through the
model's own modules (norms, the fused ``qkv`` projection, the output projection, the MLP, the family's rotary and
eager attention functions), on one image ``(1, patches, width)`` in the processor's patch order (each 2 × 2 unit's
four patches in a row, the units row by row), a window's split given as a mask, the probabilities returned: what the
model computes for that image, up to the order of floating-point sums. Its input (the first block's, after the patch
embedding and, in Qwen3.5's tower, the learned positions) and its rotary angles are read from the model's own run of
the tower (:func:`tower_recorder`: the model's own forward pass, read while the method runs it, so the tower is not run
twice), which also gives the embeddings the traced run's final states must give through the model's merger (a check of
both the blocks and the order of patches).
"""

import itertools
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.vision_utils import get_vision_position_ids

from .base import FFNSpec, LayerSpec, ModelSpec, PatchMerge, StackSpec, TowerRun, TowerSpec
from .base import attention as attn_spec


class PackedAttention(nn.Module):
    """A packed tower's attention on ``(batch, tokens, width)``: the model's module's projections, its family's rotary
    and attention functions; returns the output and the probabilities."""

    def __init__(self, attention: nn.Module):
        super().__init__()
        self.attention = attention
        family = sys.modules[type(attention).__module__]
        self.rotate, self.eager = family.apply_rotary_pos_emb_vision, family.eager_attention_forward

    def forward(self, hidden: torch.Tensor, position_embeddings: tuple, attention_mask: torch.Tensor | None = None):
        own = self.attention
        batch, tokens = hidden.shape[:2]
        query, key, value = own.qkv(hidden).reshape(batch, tokens, 3, own.num_heads, -1).unbind(2)
        query, key = self.rotate(query, key, *position_embeddings)
        function = ALL_ATTENTION_FUNCTIONS.get_interface(own.config._attn_implementation, self.eager)
        output, probs = function(own, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                 attention_mask, scaling=own.scaling, dropout=0.0, is_causal=False)  # fmt: skip
        return own.proj(output.reshape(batch, tokens, -1)), probs


class PackedBlock(nn.Module):
    """A packed tower's pre-LN block on ``(batch, tokens, width)``: ``x + attn(norm1(x))``, then ``+ mlp(norm2)``."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block, self.attn = block, PackedAttention(block.attn)

    def forward(self, hidden: torch.Tensor, position_embeddings: tuple, attention_mask: torch.Tensor | None = None):
        hidden = hidden + self.attn(self.block.norm1(hidden), position_embeddings, attention_mask)[0]
        return hidden + self.block.mlp(self.block.norm2(hidden))


class PackedTower(nn.Module):
    """A packed tower's blocks run on one image's first-block input ``(1, patches, width)`` (see the module
    docstring); ``masks``: per block, an additive mask ``(1, 1, patches, patches)`` (a windowed block) or None."""

    def __init__(self, tower: nn.Module):
        super().__init__()
        self.tower = tower
        self.blocks = nn.ModuleList(PackedBlock(block) for block in tower.blocks)

    @property
    def config(self):
        return self.tower.config

    def set_attn_implementation(self, implementation: str) -> None:
        self.tower.set_attn_implementation(implementation)

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple, masks: tuple) -> BaseModelOutput:
        for block, mask in zip(self.blocks, masks, strict=True):
            hidden_states = block(hidden_states, position_embeddings, mask)
        return BaseModelOutput(last_hidden_state=hidden_states)


@dataclass(frozen=True)
class _Read:
    """What the model's own run of the tower gave: the first block's input and rotary angles, each block's
    cumulative lengths (in the model's order of patches), the merger's embeddings (in the processor's order of
    units)."""

    hidden: torch.Tensor
    rotary: tuple
    lengths: list
    embeddings: torch.Tensor


def tower_recorder(tower: nn.Module) -> AbstractContextManager[dict]:
    """While active, the first run of ``tower`` (the model's own forward pass, whatever the method runs) is read into
    the dict yielded: its first block's input and rotary angles, each block's cumulative lengths, its merged
    embeddings. Hooks removed afterwards."""
    return _recording(tower)


@contextmanager
def _recording(tower: nn.Module) -> Iterator[dict]:
    seen = {"lengths": []}

    def before(_module, args, kwargs) -> None:
        if "embeddings" in seen:
            return
        if "hidden" not in seen:
            seen["hidden"] = (args[0] if args else kwargs["hidden_states"]).detach()
            seen["rotary"] = tuple(value.detach() for value in kwargs["position_embeddings"])
        seen["lengths"].append(kwargs["cu_seqlens"])

    def after(_module, _args, output) -> None:
        seen.setdefault("embeddings", output.pooler_output.detach())

    hooks = [block.register_forward_pre_hook(before, with_kwargs=True) for block in tower.blocks]
    hooks.append(tower.register_forward_hook(after))
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def _read_tower(tower: nn.Module, pixel_values: torch.Tensor, grid_thw: torch.Tensor, seen: dict | None) -> _Read:
    """What the model's run of the tower gave: ``seen`` (:func:`tower_recorder`) where it read a whole run of these
    images, else a run of the tower's own."""
    if not seen or "embeddings" not in seen or len(seen["lengths"]) != len(tower.blocks):
        with _recording(tower) as seen, torch.no_grad():
            tower(pixel_values, grid_thw=grid_thw)
    if len(seen["hidden"]) != len(pixel_values):
        raise ValueError(f"The vision tower ran on {len(seen['hidden'])} patches, and the model's input holds "
                         f"{len(pixel_values)}: leave tower=False.")  # fmt: skip
    return _Read(seen["hidden"], seen["rotary"], seen["lengths"], seen["embeddings"])


def tower_runs(view: PackedTower, kwargs: dict, order: Callable[[torch.Tensor], torch.Tensor] | None,
               seen: dict | None = None) -> list:  # fmt: skip
    """One :class:`TowerRun` per image of the model's keyword inputs ``kwargs`` (``pixel_values``,
    ``image_grid_thw``): the model's run of the tower read (``seen``: what :func:`tower_recorder` read of the model's
    own forward pass, else a run here), then each image's first-block input, rotary angles and window masks put in the
    processor's order of patches; ``order`` maps the model's order to the processor's (patch ``order[q]`` is at
    position ``q``; None: the same).

    Raises:
        ValueError: An image has more than one frame (a video's; the front end explains images).
    """
    grid = kwargs["image_grid_thw"]
    if (grid[:, 0] != 1).any():
        raise ValueError("tower=True reads images of one frame each; a video's frames are not explained here.")
    read = _read_tower(view.tower, kwargs["pixel_values"], grid, seen)
    total, device = len(read.hidden), read.hidden.device
    where = torch.arange(total, device=device) if order is None else order(grid).to(device)
    back = torch.empty_like(where)
    back[where] = torch.arange(total, device=where.device)  # the model's position of each patch

    positions = torch.arange(total, device=device)
    segments = [torch.bucketize(positions, lengths.to(device, torch.long)[1:], right=True)[back]
                for lengths in read.lengths]  # fmt: skip
    every_hidden, rotary = read.hidden[back], tuple(part[back] for part in read.rotary)  # the processor's order
    sizes = (grid[:, 1] * grid[:, 2]).tolist()
    merge = view.tower.spatial_merge_size
    runs = []
    for image, (start, size) in enumerate(zip(itertools.accumulate([0, *sizes[:-1]]), sizes, strict=True)):
        rows = slice(start, start + size)
        hidden = every_hidden[rows][None]
        masks = []
        for segment in segments:
            own = segment[rows]
            if (own == own[0]).all():
                masks.append(None)  # the whole image: no mask
            else:
                same = own[:, None] == own[None, :]
                mask = torch.zeros(same.shape, dtype=hidden.dtype, device=hidden.device)
                masks.append(mask.masked_fill_(~same, torch.finfo(hidden.dtype).min)[None, None])
        cells = get_vision_position_ids(grid[image : image + 1], merge).tolist()  # the model's (row, column)
        labels = [f"r{row}c{column}" for row, column in cells]
        inputs = {"hidden_states": hidden, "position_embeddings": tuple(part[rows] for part in rotary),
                  "masks": tuple(masks)}  # fmt: skip
        mask = torch.ones(1, size, dtype=torch.long, device=hidden.device)
        units = slice(start // merge**2, (start + size) // merge**2)
        runs.append(TowerRun(inputs, mask, labels, read.embeddings[units], view.tower.merger))
    return runs


def packed_tower_spec(tower: nn.Module, ffn: Callable[[nn.Module], FFNSpec], merge: PatchMerge,
                      order: Callable[[torch.Tensor], torch.Tensor] | None = None) -> TowerSpec:  # fmt: skip
    """A packed tower as its image tokens read it: every block (``ffn`` gives each block's FFN spec), then the
    merger ``merge`` folding each unit's patches; ``order`` as in :func:`tower_runs`."""
    view = PackedTower(tower)
    heads = tower.blocks[0].attn.num_heads
    width = tower.blocks[0].attn.qkv.in_features
    layers = [
        LayerSpec(
            module=packed,
            self_attn=attn_spec(
                packed.attn,
                block.attn.qkv,
                block.attn.proj,
                (heads, heads, width // heads),
                block.norm1,
                True,
                value_slice=slice(2 * width, 3 * width),
            ),
            ffn=ffn(block),
        )  # fmt: skip
        for packed, block in zip(view.blocks, tower.blocks, strict=True)
    ]
    spec = ModelSpec(family=tower.config.model_type, causal=False, decoder=StackSpec(layers=layers))
    return TowerSpec(module=view, spec=spec, layers=len(layers), first_feature=0, tokens=0, merge=merge,
                     runs=lambda kwargs, seen=None: tower_runs(view, kwargs, order, seen),
                     recorder=lambda: tower_recorder(tower))  # fmt: skip
