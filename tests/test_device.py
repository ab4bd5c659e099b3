"""GPU runs: every registered method on every family gives on CUDA what it gives on the CPU, the dataset runner's
batched path too, and half precision on CUDA stays finite and close to float32. Skipped where no CUDA device is
present (CI has none); run with ``python -m pytest tests/test_device.py`` on a GPU machine."""

import pytest
import torch

import inseq_mixing
from inseq_mixing.frontends.generation import attribute_texts, split_arguments
from inseq_mixing.testing import ALL_FAMILIES, is_seq2seq, load_tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SOURCES = ["the cat sat on the mat", "a dog"]
TARGETS = ["le chat assis sur le tapis", "un chien"]
PROMPTS = ["the cat sat", "a dog"]
TEXTS = ["the cat sat on the mat and the dog sat on it", "a dog sat on a mat"]


def texts(family: str) -> tuple[list[str], list[str]]:
    return (SOURCES, TARGETS) if is_seq2seq(family) else (PROMPTS, TEXTS)


def attribute(model, family: str, source: str, target: str):
    seq = model.attribute(
        source, target, attribute_target=is_seq2seq(family), show_progress=False
    ).sequence_attributions[0]
    return seq.source_attributions, seq.target_attributions


def on(model, device: str, dtype: torch.dtype = torch.float32):
    """The same Inseq model moved to ``device`` and ``dtype`` (Inseq keeps its own record of the device)."""
    model.model.to(device=device, dtype=dtype)
    model.device = device
    return model


def assert_same(actual: torch.Tensor | None, expected: torch.Tensor | None, **tolerance) -> None:
    if expected is None:
        assert actual is None
        return
    torch.testing.assert_close(actual.cpu(), expected.cpu(), equal_nan=True, **tolerance)


@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("method", inseq_mixing.METHODS)
def test_cuda_equals_cpu(method, family):
    model = load_tiny(family, method)
    source, target = (part[0] for part in texts(family))
    on_cpu = attribute(model, family, source, target)
    on_cuda = attribute(on(model, "cuda"), family, source, target)
    for actual, expected in zip(on_cuda, on_cpu, strict=True):
        assert_same(actual, expected, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("family", ["marian", "t5", "gpt2", "llama", "gemma2", "gpt_neox"])
@pytest.mark.parametrize("method", inseq_mixing.METHODS)
def test_padded_batch_on_cuda_equals_cpu(method, family):
    model = load_tiny(family, method)
    sources, targets = texts(family)
    inseq_args, options = split_arguments(model, {})
    on_cpu = attribute_texts(model, sources, targets, inseq_args, options).sequence_attributions
    on_cuda = attribute_texts(on(model, "cuda"), sources, targets, inseq_args, options).sequence_attributions
    for gpu, cpu in zip(on_cuda, on_cpu, strict=True):
        assert_same(gpu.target_attributions, cpu.target_attributions, atol=1e-4, rtol=1e-3)
        assert_same(gpu.source_attributions, cpu.source_attributions, atol=1e-4, rtol=1e-3)


def flat(scores: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
    return torch.cat([part.flatten() for part in scores if part is not None])


def correlation(first: torch.Tensor, second: torch.Tensor) -> float:
    finite = ~(first.isnan() | second.isnan())
    pair = torch.stack([first[finite].double(), second[finite].double()])
    return torch.corrcoef(pair)[0, 1].item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("family", ["marian", "bart", "t5", "gpt2", "llama", "qwen3", "gemma2", "gpt_neox", "olmo2"])
@pytest.mark.parametrize("method", inseq_mixing.METHODS)
def test_half_precision_on_cuda_is_finite_and_follows_float32(method, family, dtype):
    model = on(load_tiny(family, method), "cuda")
    source, target = (part[0] for part in texts(family))
    full = flat(attribute(model, family, source, target))
    half = flat(attribute(on(model, "cuda", dtype), family, source, target))
    assert torch.isfinite(half[~half.isnan()]).all()
    assert torch.equal(half.isnan(), full.isnan())  # the same cells are undefined
    assert correlation(half, full) > 0.98


@pytest.mark.parametrize("family", ["whisper", "wav2vec2", "wav2vec2_stable", "hubert"])
@pytest.mark.parametrize("method", inseq_mixing.METHODS)
def test_speech_on_cuda_equals_cpu(method, family):
    from inseq_mixing.testing import speech_processor, synthetic_audio, tiny_speech

    model, processor = tiny_speech(family), speech_processor(family)
    audio = [synthetic_audio(0.7), synthetic_audio(0.46, seed=1)]
    words = [[("the", 0.1, 0.3), ("cat", 0.32, 0.61)], None]
    targets = ["the cat sat", "a dog"] if family == "whisper" else None

    def run(device):
        attribution = inseq_mixing.load_model(model, method, processor=processor, device=device)
        out = attribution.attribute(audio, targets, words=words, show_progress=False)
        return [seq.source_attributions for seq in out.sequence_attributions]

    on_cpu = run("cpu")
    for actual, expected in zip(run("cuda"), on_cpu, strict=True):
        assert_same(actual, expected, atol=1e-4, rtol=1e-3)
    model.to("cpu")


VISION_ON_DEVICE = ("vit", "deit", "dinov2_with_registers", "beit", "data2vec-vision", "clip", "siglip", "siglip2",
                    "clip_similarity")  # fmt: skip


@pytest.mark.parametrize("family", VISION_ON_DEVICE)
@pytest.mark.parametrize("method", inseq_mixing.METHODS)
def test_vision_on_cuda_equals_cpu(method, family):
    """Every vision family's classifier (pooled read-outs included) and CLIP's image–text similarity."""
    from inseq_mixing.testing import synthetic_image, tiny_clip, tiny_vision, vision_processor

    if family == "clip_similarity":
        (model, processor), texts = tiny_clip(), ["the cat sat", "a dog ran"]
    else:
        model, processor, texts = tiny_vision(family), vision_processor(family), None
    images = [synthetic_image(seed=0), synthetic_image(size=40, seed=1)[:, :24]]  # SigLIP 2: two grids, padded

    def run(device):
        attribution = inseq_mixing.load_model(model, method, processor=processor, device=device)
        out = attribution.attribute(images, texts, show_progress=False)
        return [seq.source_attributions for seq in out.sequence_attributions]

    on_cpu = run("cpu")
    for actual, expected in zip(run("cuda"), on_cpu, strict=True):
        assert_same(actual, expected, atol=1e-4, rtol=1e-3)
    model.to("cpu")
