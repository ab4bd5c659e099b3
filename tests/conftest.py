import contextlib
import os
import shutil
import warnings
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, settings

from inseq_mixing.testing import ALL_FAMILIES, DECODER_FAMILIES, MOE_FAMILIES, SEQ2SEQ_FAMILIES, is_seq2seq, tiny_model
from inseq_mixing.trace import ModelTrace, trace_model

warnings.filterwarnings("ignore", message=".*Unused arguments.*")

# Hypothesis profiles of every property test. The default draws the same small set of examples on every run (the
# README's test command is reproducible: a failure seen once is seen again); ``HYPOTHESIS_PROFILE=random`` draws new
# examples each run, ``HYPOTHESIS_PROFILE=thorough`` ten times more of them. ``ci`` is the default under its old name.
settings.register_profile(
    "random", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("default", parent=settings.get_profile("random"), derandomize=True)
settings.register_profile("ci", parent=settings.get_profile("default"))
settings.register_profile("thorough", parent=settings.get_profile("random"), max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "default")

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


def next_tokens(kwargs: dict) -> torch.Tensor:
    """The token following each decoder position (the last position gets an arbitrary token)."""
    ids = kwargs.get("decoder_input_ids", kwargs["input_ids"])
    return torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], 9)], dim=1)


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


def pad_batch(rows: list[torch.Tensor], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad id rows into one batch (left padding for decoder-only models) and its mask."""
    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for idx, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[idx, span], mask[idx, span] = row, 1
    return ids, mask


@dataclass
class PaddedCase:
    """A padded batch of sentences of different lengths, traced together and one by one.

    Attributes:
        batched: Trace of the padded batch.
        alone: Trace of each sentence alone.
        spans: For each sentence, its ``(source, decoder)`` position slices inside the batch (decoder-only: the
            source slice is the decoder slice).
        ids: Each sentence's decoder ids alone.
    """

    batched: ModelTrace
    alone: list[ModelTrace]
    spans: list[tuple[slice, slice]]
    ids: list[torch.Tensor]

    def outside(self, index: int) -> torch.Tensor:
        """``(positions,)`` mask of the batch's decoder positions that are padding for sentence ``index``."""
        mask = torch.ones(self.batched.decoder.mask.shape[1], dtype=torch.bool)
        mask[self.spans[index][1]] = False
        return mask

    def next_ids(self) -> torch.Tensor:
        """:func:`next_tokens` of each sentence, laid out like the batch (padding positions get token 5)."""
        ids = torch.full(self.batched.decoder.mask.shape, 5)
        for idx, (_, target) in enumerate(self.spans):
            ids[idx, target] = next_tokens({"input_ids": self.ids[idx][None]})[0]
        return ids


def padded_case(model, family: str, lengths=((6, 5), (3, 2)), seed: int = 3) -> PaddedCase:
    """Right-padded sources and targets for encoder–decoders, left-padded sequences for decoder-only models."""
    gen = torch.Generator().manual_seed(seed)
    sources = [torch.randint(4, 60, (s,), generator=gen) for s, _ in lengths]
    targets = [torch.cat([torch.tensor([0]), torch.randint(4, 60, (t - 1,), generator=gen)]) for _, t in lengths]
    if is_seq2seq(family):
        src, src_mask = pad_batch(sources, left=False)
        tgt, tgt_mask = pad_batch(targets, left=False)
        batched = trace_model(model, src, src_mask, tgt, tgt_mask)
        alone = [trace_model(model, s[None], decoder_input_ids=t[None]) for s, t in zip(sources, targets, strict=True)]
        spans = [(slice(0, s), slice(0, t)) for s, t in lengths]
        return PaddedCase(batched, alone, spans, targets)
    ids, mask = pad_batch(sources, left=True)
    width = ids.shape[1]
    spans = [(slice(width - s, width),) * 2 for s, _ in lengths]
    return PaddedCase(trace_model(model, ids, mask), [trace_model(model, s[None]) for s in sources], spans, sources)


# ----- a real browser (the explorer's and the guide's tests): Playwright driving Debian's chromium -----


@pytest.fixture(scope="session")
def playwright():
    if os.environ.get("INSEQ_MIXING_REQUIRE_BROWSER"):  # CI: a missing driver fails, it does not skip
        from playwright import sync_api
    else:
        sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as running:
        yield running


@pytest.fixture(scope="session")
def browser(playwright):
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("INSEQ_MIXING_REQUIRE_BROWSER"):
            pytest.fail("No chromium found, but INSEQ_MIXING_REQUIRE_BROWSER is set (CI installs it).")
        pytest.skip("chromium is not installed here (.ci/run installs it)")
    launched = playwright.chromium.launch(executable_path=found, args=["--no-sandbox"])
    yield launched
    launched.close()


@pytest.fixture
def page(browser):
    """A 1,280 px wide page; the test fails if the page's script raised."""
    opened = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    opened.close()
    assert errors == [], errors


# ----- the quick subset (``python -m pytest -q -m quick``, the README's test command) -----

#: The tests of the quick subset: together they touch every generation, encoder, speech and vision family, the
#: vision-language front end and every method once (``tests/test_quick.py`` checks it), with the properties that matter
#: most (completeness, padding and batch invariance, causality, rows summing to 1), the Inseq path, dataset runs, the
#: layers, the kinds and the README's and guide's snippets. The full suite (``python -m pytest -q``) is what CI runs.
QUICK = (  # fnmatch patterns of ``file::test[parameters]``
    "test_method_invariants.py::test_every_declared_method_on_every_family_pads_and_is_causal[[]*-{}]",
    "test_method_invariants.py::test_every_logit_method_is_complete_with_its_unattributed_terms[[]*-{}]",
    "test_method_invariants.py::test_padded_batch_equals_each_sentence_alone*",
    "test_encoders.py::test_logit_methods_add_up_to_the_models_own_logit*",
    "test_encoders.py::test_bfloat16_runs_and_nan_weights_are_refused_on_every_family*",
    "test_speech.py::test_logit_methods_add_up_to_the_models_own_logit*",
    "test_speech.py::test_a_batch_of_different_lengths_equals_each_utterance_alone*",
    "test_vision.py::test_logit_methods_add_up_to_the_models_own_logit*",
    "test_vision.py::test_map_rows_sum_to_one_and_cover_every_token*",
    "test_vision.py::test_a_batch_equals_each_image_alone*",
    "test_vlm.py::test_the_front_end_explains_the_greedy_answer_and_adds_up_to_the_models_own_logits*",
    "test_runs.py::test_stored_examples_equal_model_attribute*",
    "test_spans.py::test_hops_against_a_token_by_token_recursion*",
    "test_layers.py::*",
    "test_kinds.py::*",
    "test_quick.py::*",
    "test_readme.py::*",
    "test_docs.py::*",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: the representative subset of the README's test command (-m quick)")


#: Mixtures of experts the quick subset runs every method on (a plain one, latent attention, sinks); the others share
#: their layouts, and the quick subset runs their logit methods' completeness only (the full suite runs everything).
QUICK_MIXTURES = ("mixtral", "deepseek_v3", "gpt_oss")
QUICK_ON_EVERY_MIXTURE = "test_every_logit_method_is_complete_with_its_unattributed_terms"


def quick_for_its_family(item) -> bool:
    """Whether a quick test stays quick for its family (see :data:`QUICK_MIXTURES`)."""
    family = getattr(getattr(item, "callspec", None), "params", {}).get("family")
    return family not in MOE_FAMILIES or family in QUICK_MIXTURES or item.originalname == QUICK_ON_EVERY_MIXTURE


def pytest_collection_modifyitems(config, items):
    from fnmatch import fnmatchcase

    for item in items:
        if any(fnmatchcase(f"{item.path.name}::{item.name}", pattern) for pattern in QUICK) and quick_for_its_family(
            item
        ):
            item.add_marker(pytest.mark.quick)


@contextlib.contextmanager
def forward_hooks(*pairs, with_kwargs: bool = False):
    """Forward hooks ``(module, hook)`` registered for the block's duration, removed whatever happens."""
    handles = [module.register_forward_hook(hook, with_kwargs=with_kwargs) for module, hook in pairs]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class Killed(RuntimeError):
    """What a test raises to kill a dataset run mid-way (:func:`assert_a_killed_run_resumes`)."""


def assert_a_killed_run_resumes(run, folder, rows: int, monkeypatch) -> None:
    """``run(out)`` (a dataset run of ``rows`` rows into ``out``), killed after its first shard, resumes in ``folder /
    "out"`` to the rows of an uninterrupted run in ``folder / "whole"``, bit for bit (the kill checked to have landed
    mid-run)."""
    import pandas as pd

    from inseq_mixing.runs import load_run
    from inseq_mixing.runs.store import RunStore

    if not (folder / "whole").exists():
        run(folder / "whole")
    write_shard, written = RunStore.write_shard, []

    def killed(self, batch, rows_, writer=None):
        if written:
            raise Killed
        written.append(batch)
        write_shard(self, batch, rows_, writer)

    monkeypatch.setattr(RunStore, "write_shard", killed)
    with pytest.raises(Killed):
        run(folder / "out")
    assert len(written) == 1 and len(load_run(folder / "out")) < rows  # the kill landed mid-run
    monkeypatch.setattr(RunStore, "write_shard", write_shard)
    run(folder / "out")
    resumed, whole = load_run(folder / "out"), load_run(folder / "whole")
    assert resumed.complete and resumed.ids() == whole.ids()
    order = ["id", "side", "generated_index", "context_index"]
    frames = [run_.to_pandas().sort_values(order).reset_index(drop=True) for run_ in (resumed, whole)]
    pd.testing.assert_frame_equal(frames[0], frames[1], check_exact=True)
