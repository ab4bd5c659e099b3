"""GPT-OSS: the Llama layout with attention biases, learned attention sinks, alternating sliding-window and full
layers, and a mixture of experts whose experts apply a clamped gate of their own.

Sinks: each head's softmax runs over the keys and one learned logit with no value, which is dropped after the
softmax; a row's probabilities over the tokens then sum to less than 1, the rest going to the sink. The recorded
probabilities are these rows: parts of the attention output (ALTI, DecompX, the norms, value zeroing) read them as
they are (the sink adds nothing to the output); AttnLRP's softmax rule runs through the model's own softmax, the
sink's logit absorbing its share. Attention rollout keeps each layer's share of the sink out of its rows (the spec's
``attention_sinks``): its rows then sum to less than 1 and ``sink_share`` says where the rest went; attention flow
renormalises each layer's rows over the tokens and does not show it (see docs/supported-models.md).

Experts: ``gate_up_proj`` interleaves gate and linear outputs (``gate₀, up₀, ...``) and is stored ``(experts, in,
out)``, with biases; each expert computes ``(clamp(up, ±l) + 1) ⊙ g σ(α g)`` with ``g = min(gate, l)``: the spec writes
the gate as :class:`ClampedSwish` and the linear branch as :class:`SymmetricClamp` plus 1, which the methods
linearise at the traced pass like any activation (our extension, as for every mixture of experts).
"""

import dataclasses

import torch
from torch import nn

from . import llama
from .base import FirstOutput, LayerSpec, ModelSpec, MoESpec, check_experts

FAMILY = "GPT-OSS (attention sinks, mixture of clamped experts)"
MODEL_TYPES = {"gpt_oss"}


class ClampedSwish(nn.Module):
    """GPT-OSS's gate activation ``g σ(α g)`` with ``g = min(x, limit)``."""

    def __init__(self, alpha: float, limit: float):
        super().__init__()
        self.alpha, self.limit = alpha, limit

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.clamp(max=self.limit)
        return hidden * torch.sigmoid(hidden * self.alpha)


class SymmetricClamp(nn.Module):
    """``clamp(x, -limit, limit)``: GPT-OSS's map on the experts' linear branch (before its offset of 1)."""

    def __init__(self, limit: float):
        super().__init__()
        self.limit = limit

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.clamp(min=-self.limit, max=self.limit)


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    mlp = layer.mlp
    experts = mlp.experts
    check_experts(mlp, own_gate=True)
    return LayerSpec(
        module=layer,
        self_attn=llama.attention_spec(layer, config, layer.self_attn.v_proj),
        ffn=MoESpec(
            forward=FirstOutput(mlp),
            norm=layer.post_attention_layernorm,
            pre_norm=True,
            router=mlp.router,
            experts=experts,
            activation=ClampedSwish(experts.alpha, experts.limit),
            linear_activation=SymmetricClamp(experts.limit),
            linear_offset=1.0,
        ),
    )


def build(model: nn.Module) -> ModelSpec:
    return dataclasses.replace(llama.build(model, layer_spec), attention_sinks=True)
