"""Models dispatched with ``device_map`` (accelerate's hooks, weights offloaded to disk and loaded for each forward
pass): every method gives the scores of the same model on one device, and the model is left dispatched as it was
(its offloaded weights back on the ``meta`` device, its hooks in place). Issue 52, item 4, on the CPU; a GPU's layers
on several devices are not tested here."""

import functools

import inseq
import pytest
import torch

import inseq_mixing
from inseq_mixing.declarations import DECLARATIONS
from inseq_mixing.specs import UnsupportedModelError, get_spec
from inseq_mixing.testing import encoder_tokenizer, is_seq2seq, tiny_encoder, tiny_model, word_tokenizer

#: (family, placement): ``"half"``: every other block on disk, the rest on the CPU; ``"disk"``: every weight on disk
#: (``device_map="auto"`` with too little CPU memory for any of them). Not Marian: dispatched that way, its own forward
#: pass fails (accelerate looks for its sinusoidal position table, which is not saved, among the offloaded weights).
#: Falcon-H1, Qwen3-Next and Zamba 2: hybrids whose mixers (Mamba-2 beside attention; Gated DeltaNet, gated attention;
#: Mamba-2 after a shared attention block with adapters) are frozen from their modules' weights, offloaded ones among
#: them.
CASES = [
    ("gpt2", "half"),
    ("llama", "half"),
    ("bert", "half"),
    ("bart", "disk"),
    ("qwen2_moe", "disk"),
    ("falcon_h1", "half"),
    ("qwen3_next", "disk"),
    ("zamba2", "half"),
]


def device_map(model, placement: str) -> dict:
    """A ``device_map`` putting every other block on disk and everything else on the CPU."""
    blocks = sorted(name for name, module in model.named_modules()
                    if any(module is block for block in get_spec(model).block_modules()))  # fmt: skip
    offloaded = blocks[::2]
    mapping = {name: "disk" for name in offloaded}
    for name, module in model.named_modules():
        inside = any(name == block or name.startswith(f"{block}.") for block in offloaded)
        if not inside and (list(module.parameters(recurse=False)) or list(module.buffers(recurse=False))):
            mapping[name] = "cpu"
    return mapping


@functools.cache
def models(family: str, placement: str, root):
    folder = root / f"{family}-{placement}"
    base = tiny_encoder(family) if family == "bert" else tiny_model(family)
    base.save_pretrained(folder / "model")
    if placement == "half":
        where = {"device_map": device_map(base, placement)}
    else:
        size = sum(parameter.numel() * parameter.element_size() for parameter in base.parameters())
        where = {"device_map": "auto", "max_memory": {"cpu": size // 3}}
    kernels = getattr(base.config, "_experts_implementation", None)  # the tiny model's experts' (eager loops)
    where.update({"experts_implementation": kernels} if kernels is not None else {})
    dispatched = type(base).from_pretrained(folder / "model", offload_folder=folder / "offload",
                                            attn_implementation="eager", **where).eval()  # fmt: skip
    ids = torch.tensor([[5, 6, 7, 1]])
    with torch.no_grad():  # accelerate's first forward pass offloads a tied embedding's copies once and for all
        dispatched(input_ids=ids, **({"decoder_input_ids": ids[:, :2]} if is_seq2seq(family) else {}))
    return base, dispatched


def attribute(model, family: str, method: str):
    if family == "bert":
        front = inseq_mixing.load_model(model, method, tokenizer=encoder_tokenizer())
        return front.attribute("the [MASK] sat on the mat", show_progress=False).sequence_attributions[0]
    tokenizer = word_tokenizer(seq2seq=is_seq2seq(family))
    front = inseq.load_model(model, method, tokenizer=tokenizer)
    if is_seq2seq(family):
        out = front.attribute("the cat sat", "le chat assis", attribute_target=True, show_progress=False)
    else:
        out = front.attribute("the cat sat", "the cat sat on the mat", show_progress=False)
    return out.sequence_attributions[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("dispatch")


@pytest.mark.parametrize("method", list(DECLARATIONS))
@pytest.mark.parametrize(("family", "placement"), CASES)
def test_a_dispatched_model_gives_the_scores_of_the_model_on_one_device(folder, family, placement, method):
    base, dispatched = models(family, placement, folder)
    before = offload_state(dispatched)
    assert before[0]  # weights really are on disk between forward passes
    try:
        DECLARATIONS[method].check_model(get_spec(base))
    except UnsupportedModelError:  # a method that refuses the family (value zeroing, Zamba 2) refuses both alike
        for model in (base, dispatched):
            with pytest.raises(UnsupportedModelError):
                attribute(model, family, method)
        assert offload_state(dispatched) == before
        return
    expected, got = attribute(base, family, method), attribute(dispatched, family, method)
    for name in ("source_attributions", "target_attributions"):
        if getattr(expected, name) is not None:
            torch.testing.assert_close(getattr(got, name), getattr(expected, name), atol=1e-6, rtol=1e-5,
                                       equal_nan=True, msg=name)  # fmt: skip
    for key, value in expected.step_scores.items():
        torch.testing.assert_close(got.step_scores[key], value, atol=1e-6, rtol=1e-5, msg=key)
    assert offload_state(dispatched) == before  # left dispatched as it was


def test_the_maps_a_spec_adds_beside_an_offloaded_block_live_where_the_block_runs(folder):
    """A block without an FFN (Zamba 2's, Mamba's) gets empty FFN maps from its spec, placed like one of its weights:
    for an offloaded block (its weights on ``meta`` between forward passes) they go to its hook's execution device,
    not to ``meta`` (an input times an empty ``meta`` weight is uninitialised memory, not zeros)."""
    _, dispatched = models("zamba2", "half", folder)
    layer = get_spec(dispatched).decoder.layers[0]
    assert layer.module.mamba_decoder.mamba.out_proj.weight.device.type == "meta"  # offloaded
    assert {layer.ffn.w_in.weight.device.type, layer.ffn.w_out.weight.device.type} == {"cpu"}


def offload_state(model) -> tuple[list[str], list[str]]:
    """The parameters on the ``meta`` device, and the modules whose hooks offload their weights."""
    meta = [name for name, parameter in model.named_parameters() if parameter.device.type == "meta"]
    hooks = [name for name, module in model.named_modules() if getattr(getattr(module, "_hf_hook", None), "offload",
                                                                        False)]  # fmt: skip
    return meta, hooks


def test_a_failure_inside_a_method_leaves_a_dispatched_model_offloaded(folder, monkeypatch):
    from inseq_mixing.methods import alti_logit

    _, dispatched = models("gpt2", "half", folder)
    before = offload_state(dispatched)
    model = inseq.load_model(dispatched, "alti_logit", tokenizer=word_tokenizer(seq2seq=False))

    def fail(*args, **kwargs):
        assert not offload_state(dispatched)[0]  # inside the method: every weight loaded
        raise FloatingPointError("a failure inside the method")

    monkeypatch.setattr(alti_logit, "sweep_logit", fail)
    with pytest.raises(FloatingPointError, match="inside the method"):
        model.attribute("the cat sat", "the cat sat on the mat", show_progress=False)
    assert offload_state(dispatched) == before


@pytest.mark.parametrize("method", ["alti_logit", "decompx"])
def test_a_dataset_run_of_a_dispatched_model_stores_the_scores_of_the_model_on_one_device(folder, tmp_path, method):
    from inseq_mixing.runs import attribute_dataset, load_run

    base, dispatched = models("gpt2", "half", folder)
    before = offload_state(dispatched)
    rows = [{"id": "a", "source": "the cat sat", "target": "the cat sat on the mat"},
            {"id": "b", "source": "the dog", "target": "the dog sat on"}]  # fmt: skip
    runs = {}
    for name, model in (("base", base), ("dispatched", dispatched)):
        attribute_dataset(model, method, rows, tmp_path / name, tokenizer=word_tokenizer(seq2seq=False),
                          batch_size=2, show_progress=False, id_column="id")  # fmt: skip
        runs[name] = load_run(tmp_path / name)
    # the same weights fingerprint: the offloaded weights were read, not the meta placeholders
    assert runs["dispatched"].manifest["model"]["weights_sha"] == runs["base"].manifest["model"]["weights_sha"]
    for row in rows:
        expected, got = runs["base"][row["id"]], runs["dispatched"][row["id"]]
        torch.testing.assert_close(
            got.target_attributions, expected.target_attributions, atol=1e-6, rtol=1e-5, equal_nan=True
        )
    assert offload_state(dispatched) == before


def test_the_weights_fingerprint_reads_every_offloaded_weight(folder, monkeypatch):
    from inseq_mixing.runs.runner import weights_fingerprint

    base, dispatched = models("bart", "disk", folder)
    offloaded = offload_state(dispatched)[0]
    assert offloaded
    assert weights_fingerprint(dispatched) == weights_fingerprint(base)
    store = next(module._hf_hook.weights_map.dataset for module in dispatched.modules()
                 if getattr(getattr(module, "_hf_hook", None), "weights_map", None) is not None)  # fmt: skip
    read = type(store).__getitem__
    changed = offloaded[-1]  # one weight on disk read back changed: another fingerprint
    monkeypatch.setattr(type(store), "__getitem__",
                        lambda self, key: read(self, key) + (key == changed))  # fmt: skip
    assert weights_fingerprint(dispatched) != weights_fingerprint(base)
