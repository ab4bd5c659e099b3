import warnings

import pytest
import torch

from inseq_mixing.testing import ALL_FAMILIES, DECODER_FAMILIES, SEQ2SEQ_FAMILIES, is_seq2seq, tiny_model
from inseq_mixing.trace import trace_model

warnings.filterwarnings("ignore", message=".*Unused arguments.*")

_MODELS = {}


def get_tiny(family: str):
    if family not in _MODELS:
        _MODELS[family] = tiny_model(family)
    return _MODELS[family]


@pytest.fixture(params=ALL_FAMILIES)
def family(request):
    return request.param


@pytest.fixture(params=SEQ2SEQ_FAMILIES)
def seq2seq_family(request):
    return request.param


@pytest.fixture(params=DECODER_FAMILIES)
def decoder_family(request):
    return request.param


def example_kwargs(family: str, batch: int = 1, seed: int = 0) -> dict:
    """Model kwargs with random ids (no padding)."""
    generator = torch.Generator().manual_seed(seed)
    if is_seq2seq(family):
        source = torch.randint(4, 60, (batch, 7), generator=generator)
        source[:, -1] = 1
        target = torch.randint(4, 60, (batch, 5), generator=generator)
        target[:, 0] = 0
        return {"input_ids": source, "decoder_input_ids": target}
    return {"input_ids": torch.randint(4, 60, (batch, 8), generator=generator)}


def trace_of(model, kwargs: dict, **options):
    """Trace ``model`` on model kwargs as built by :func:`example_kwargs`."""
    return trace_model(
        model,
        kwargs["input_ids"],
        kwargs.get("attention_mask"),
        kwargs.get("decoder_input_ids"),
        kwargs.get("decoder_attention_mask"),
        **options,
    )


def traced_stacks(trace) -> list:
    """``(stack spec, stack trace)`` pairs: the decoder, then the encoder if any."""
    stacks = [(trace.spec.decoder, trace.decoder)]
    if trace.encoder is not None:
        stacks.append((trace.spec.encoder, trace.encoder))
    return stacks
