"""Gemma (v1): the Llama layout with RMSNorms of gain ``1 + weight`` and embeddings scaled by ``sqrt(d_model)``.

The embedding scale is inside the embedding module, so the recorded input of the first block already carries it.
"""

from torch import nn
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

from . import llama
from .base import UNIT_OFFSET_RMS_NORMS, ModelSpec

FAMILY = "Gemma"
MODEL_TYPES = {"gemma"}

UNIT_OFFSET_RMS_NORMS.add(GemmaRMSNorm)


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model)
