"""CLIP's image tower (``clip_vision_model``, and the one inside ``CLIPModel`` / ``CLIPForImageClassification``).

The patch embedding, [CLS] and the position embeddings go through ``pre_layrnorm`` before the first block (a norm per
token: nothing mixes there); decompositions start at the first block's input, after it. Pre-LN blocks:
``layer_norm1``, ``self_attn`` (``q_proj`` / ``k_proj`` / ``v_proj``, softmax, ``out_proj``), residual;
``layer_norm2``, ``mlp`` (``fc1``, activation, ``fc2``), residual; no final norm on the tokens.

Read-outs:

- ``CLIPModel``: the image–text similarity ``s · cos(P · LN(h_[CLS]), t)``: ``post_layernorm`` on [CLS], the
  ``visual_projection`` ``P``, the division by the projected vector's norm (an RMS norm of gain ``1/√d`` and no
  epsilon, frozen at the forward pass as every norm is), and the dot product with each explained text's normalised
  embedding ``t`` times ``s = exp(logit_scale)`` (:class:`TextRows`, filled by the vision front end for each batch:
  the text tower is not explained). Frozen, the read-out is linear in [CLS]'s final state, so the logit methods are
  complete on the similarity; the frozen norm of the image embedding is **our extension** (as the final norms of
  every text model).
- ``CLIPForImageClassification``: the mean of the patches' final states (no norm) through one linear ``classifier``: a
  pooled read-out (:class:`~.base.HeadSpec`).
- ``CLIPVisionModel``, ``CLIPVisionModelWithProjection``: bare encoders (the map methods).
"""

import torch
from torch import nn

from .base import FFNSpec, HeadSpec, LayerSpec, ModelSpec, StackSpec, UnsupportedModelError
from .base import attention as attn_spec
from .encoder_heads import pooled_head_spec

FAMILY = "CLIP image tower (vision)"
KIND = "vision"
MODEL_TYPES = {"clip", "clip_vision_model"}


class UnitNorm(nn.Module):
    """``z / ‖z‖`` as an RMS norm (gain ``1/√d``, no epsilon), so that the methods freeze it as they freeze a norm.
    Its gain is made on the device and in the precision of ``like`` (the projection before it) at every use: this
    module is not the model's, so moving the model does not move it."""

    def __init__(self, like: nn.Parameter):
        super().__init__()
        self.like = [like]  # in a list: the model's parameter, not this module's
        self.variance_epsilon = 0.0

    @property
    def weight(self) -> torch.Tensor:
        like = self.like[0]
        return torch.full((like.shape[0],), like.shape[0] ** -0.5, device=like.device, dtype=like.dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden / hidden.norm(dim=-1, keepdim=True)


class TextRows(nn.Module):
    """The last step of an image–text similarity read-out: a linear map whose rows are the explained texts'
    normalised embeddings times the model's logit scale (and whose bias is the model's logit bias, SigLIP's); set
    for each batch by the front end (:meth:`set_texts`)."""

    def __init__(self, width: int, scale: nn.Parameter, bias: nn.Parameter | None = None):
        super().__init__()
        self.scale, self.logit_bias = scale, bias
        self.register_buffer("weight", torch.zeros(0, width), persistent=False)
        self.bias = None

    def set_texts(self, embeddings: torch.Tensor) -> None:
        """The texts of a batch: their embeddings ``(texts, width)`` (normalised here) are the rows."""
        with torch.no_grad():
            rows = embeddings / embeddings.norm(dim=-1, keepdim=True)
            self.weight = (rows * self.scale.exp()).detach()
            if self.logit_bias is not None:
                self.bias = self.logit_bias.detach().reshape(1).expand(len(rows)).clone()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.weight.to(hidden.dtype), self.bias)


def tower(model: nn.Module) -> nn.Module:
    """The image tower (the model itself for ``CLIPVisionModel``)."""
    return getattr(model, "vision_model", model)


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    """A CLIP / SigLIP encoder block (the same layout)."""
    attention, mlp = layer.self_attn, layer.mlp
    heads = (config.num_attention_heads, config.num_attention_heads, config.hidden_size // config.num_attention_heads)
    return LayerSpec(
        module=layer,
        self_attn=attn_spec(attention, attention.v_proj, attention.out_proj, heads, layer.layer_norm1, True),
        ffn=FFNSpec(
            forward=mlp,
            norm=layer.layer_norm2,
            pre_norm=True,
            w_in=mlp.fc1,
            w_out=mlp.fc2,
            activation=mlp.activation_fn,
        ),  # fmt: skip
    )


def build(model: nn.Module) -> ModelSpec:
    name, vision = type(model).__name__, tower(model)
    if name == "CLIPModel":
        width = model.visual_projection.out_features
        rows = TextRows(width, model.logit_scale)
        unit = UnitNorm(model.visual_projection.weight)
        head = HeadSpec("sequence_classification", (vision.post_layernorm, model.visual_projection, unit, rows))
    elif name == "CLIPForImageClassification":
        head = pooled_head_spec(("mean",), 1, (model.classifier,))
    elif name in ("CLIPVisionModel", "CLIPVisionModelWithProjection"):
        head = None
    else:
        raise UnsupportedModelError(
            f"{name}: inseq-mixing explains CLIP's image tower: load CLIPModel (image–text similarity), "
            "CLIPForImageClassification, or CLIPVisionModel (bare)."
        )
    config = vision.config
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(layers=[layer_spec(layer, config) for layer in vision.encoder.layers]),
        causal=False,
        head=head,
    )
