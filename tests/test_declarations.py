"""One declaration per method: the registry stands without Inseq, the Inseq classes are generated from it (signature,
documentation, checks), axes are labelled, one chunk default, the layers import one way, and a new measure needs only
its math and its declaration."""

import ast
import inspect
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import inseq
import pytest
import torch

import inseq_mixing
from inseq_mixing.declarations import DECLARATIONS, Declaration, Request, get_declaration
from inseq_mixing.frontends.inseq_adapter.adapter import attribution_class
from inseq_mixing.methods.chunking import DEFAULT_CHUNK_ELEMENTS
from inseq_mixing.methods.options import Chunking, EncoderMaps
from inseq_mixing.methods.results import LayerMaps
from inseq_mixing.methods.rollout import normalize_rows
from inseq_mixing.testing import is_seq2seq, load_tiny, tiny_model, word_tokenizer

PACKAGE = Path(inseq_mixing.__file__).parent


def test_the_registry_and_the_math_stand_without_inseq():
    """In a fresh interpreter where Inseq cannot be imported, the declarations load and compute on a traced model."""
    script = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name == "inseq" or name.startswith("inseq."):
            raise ImportError("inseq is blocked")
sys.meta_path.insert(0, Blocker())
import torch
from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import tiny_model
from inseq_mixing.trace import trace_model
model = tiny_model("gpt2")
ids = torch.tensor([[5, 9, 12, 7]])
mask = torch.ones_like(ids)
request = Request(get_spec(model), model, mask, None, None, torch.roll(ids, -1, 1), None, mask.bool(),
                  lambda: trace_model(model, ids, mask))
options = DECLARATIONS["alti_logit"].options()
scores = DECLARATIONS["alti_logit"].compute(request, options)
total = scores.target.sum(-1) + sum(scores.terms.values())
assert torch.allclose(total, scores.logit, atol=1e-4), (total, scores.logit)
assert "inseq" not in sys.modules
print(sorted(DECLARATIONS))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(sorted(inseq_mixing.METHODS))


@pytest.mark.parametrize("name", list(DECLARATIONS))
def test_the_inseq_class_is_generated_from_the_declaration(name):
    declaration = get_declaration(name)
    model = load_tiny("gpt2", name)
    method = model.attribution_method
    assert type(method).declaration is declaration and method.method_name == name
    signature = inspect.signature(method.method.attribute)
    assert list(signature.parameters) == ["inputs", "additional_forward_args", *declaration.option_names()]
    defaults = {item.name: item.default for item in declaration.option_fields()}
    assert {key: value.default for key, value in list(signature.parameters.items())[2:]} == defaults
    for option in declaration.option_names():  # the documentation lists exactly the real options
        assert f"    {option} (" in type(method).__doc__ and f"    {option} (" in method.method.attribute.__doc__
    assert type(method).__doc__.splitlines()[0] == declaration.summary
    assert method.explains_logit == declaration.explains_logit
    for field in declaration.option_fields():
        assert field.metadata["doc"], f"{name}.{field.name} has no documentation"
        choices = field.metadata.get("choices")
        if choices:
            with pytest.raises(ValueError, match=f"{field.name}='nope'.*{choices[0]}"):
                model.attribute("the cat", "the cat sat", show_progress=False, **{field.name: "nope"})
        if field.type is bool:
            with pytest.raises(TypeError, match="True or False"):
                declaration.check_options({field.name: "yes"})
        if field.type is int:
            with pytest.raises(TypeError, match="positive integer"):
                declaration.check_options({field.name: 0})


def test_globenc_has_no_per_head_form_and_says_so():
    model = load_tiny("marian", "globenc")
    with pytest.raises(ValueError, match=r"Unknown option\(s\) \['per_head'\] for method 'globenc'"):
        model.attribute("the cat", "le chat", show_progress=False, per_head=True)
    assert "per_head" not in DECLARATIONS["globenc"].option_names()
    assert "max_chunk_elements" in type(model.attribution_method).__doc__


def test_one_chunk_default():
    for declaration in DECLARATIONS.values():
        if issubclass(declaration.options, Chunking):
            assert declaration.options().max_chunk_elements == DEFAULT_CHUNK_ELEMENTS
    for path in (PACKAGE / "methods").glob("*.py"):
        if path.name != "chunking.py":
            assert "DEFAULT_CHUNK_ELEMENTS =" not in path.read_text(), f"{path.name} sets its own chunk default"
            assert "max_chunk_elements //" not in path.read_text(), f"{path.name} has its own chunking arithmetic"


@pytest.mark.parametrize(
    ("family", "method", "options", "count", "example"),
    [
        ("gpt2", "value_zeroing", {"per_layer": True}, 2, "layer 1"),
        ("gpt2", "value_zeroing", {}, 0, None),
        ("gpt2", "alti", {"per_head": True}, 2 * 5, "layer 0 residual"),
        ("marian", "alti", {"per_head": True}, 2 * 2 * 5, "cross-attention layer 1 head 3"),
        ("marian", "alti_logit", {"per_head": True}, 2 * 2 * 4, "self-attention layer 0 head 0"),
        ("llama", "decompx", {"per_head": True}, 2 * 4, "layer 1 head 3"),
        ("marian", "attention_norm", {"per_layer": True}, 2, "layer 0"),
        ("marian", "attention_rollout", {"per_layer": True}, 2, "layer 1"),
        ("marian", "alti", {}, 0, None),
    ],
)
def test_extra_axes_are_labelled(family, method, options, count, example):
    model = load_tiny(family, method)
    kwargs = {"attribute_target": True} if is_seq2seq(family) else {}
    target = "le chat assis" if is_seq2seq(family) else "the cat sat on"
    out = model.attribute("the cat", target, show_progress=False, **kwargs, **options)
    scores = out.sequence_attributions[0].target_attributions
    if not count:
        assert "score_axis" not in out.info and scores.ndim == 2
        return
    assert len(out.info["score_axis"]) == scores.shape[-1] == count and example in out.info["score_axis"]


# ----- the layers import one way -----

INSEQ_FREE = ("specs", "trace.py", "methods", "declarations")


def imports_of(path: Path) -> list[tuple[str, int]]:
    """``(module, level)`` of every import in a file (relative imports keep their level)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


def test_layers_import_one_way():
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        top = relative.parts[0]
        modules = imports_of(path)
        if top in INSEQ_FREE:
            assert not [m for m, level in modules if level == 0 and m.split(".")[0] == "inseq"], f"{relative}"
        if top not in ("__init__.py", "cli.py", "testing.py"):  # the root, the CLI and the helpers sit on top
            upward = [m for m, level in modules if (level == 0 and m == "inseq_mixing") or level > len(relative.parts)]
            assert not upward, f"{relative} imports the package root"
    demo = [m for m, _ in imports_of(PACKAGE / "demo" / "__init__.py")]
    assert not [m for m in demo if m.endswith("cli")], "demo must not import the CLI (the CLI imports the demo)"


# ----- a new measure is two pieces: its math and its declaration -----


def mean_attention(trace) -> LayerMaps:
    """The math of a toy measure: each layer's head-averaged attention (decoder-only models)."""
    maps = torch.stack([layer.self_attn.probs.float().mean(1) for layer in trace.decoder.layers], dim=1)
    return LayerMaps(target=normalize_rows(maps))


@dataclass(frozen=True)
class MeanAttentionOptions(EncoderMaps):
    pass


def test_a_new_measure_is_its_math_and_its_declaration():
    def compute(request: Request, options) -> LayerMaps:
        maps = mean_attention(request.trace)
        maps.axis = [f"layer {index}" for index in range(maps.target.shape[1])]
        return maps

    declaration = Declaration("mean_attention_example", "Head-averaged attention (an example).", "For the test.",
                              MeanAttentionOptions, compute)  # fmt: skip
    generated = attribution_class(declaration)  # registered in Inseq, as for every module of the registry
    tokenizer = word_tokenizer(seq2seq=False)
    model = inseq.load_model(tiny_model("gpt2"), "mean_attention_example", tokenizer=tokenizer)
    out = model.attribute(["the cat sat", "a dog"], ["the cat sat on the mat", "a dog sat"], show_progress=False)
    for seq, (prompt, text) in zip(out.sequence_attributions, [("the cat sat", "the cat sat on the mat"),
                                                               ("a dog", "a dog sat")], strict=True):  # fmt: skip
        alone = model.attribute(prompt, text, show_progress=False).sequence_attributions[0]
        torch.testing.assert_close(seq.target_attributions, alone.target_attributions, equal_nan=True)
        assert seq.target_attributions[-1, :-1].isnan().all()  # causal cells are marked
    assert out.info["score_axis"] == ["layer 0", "layer 1"] and generated.__doc__.startswith("Head-averaged")


def test_a_span_run_of_a_request_that_has_traced_reuses_its_trace():
    """A request whose trace was read before the span run (a method without a span computation of its own runs on a
    replaced request: the spans' positions) traces once: the replaced request keeps the trace, and its scores are
    those of a request that never traced before."""
    from inseq_mixing.methods.spans import SpanRows
    from inseq_mixing.specs import get_spec
    from inseq_mixing.trace import trace_model

    model = tiny_model("gpt2")
    ids = torch.tensor([[5, 9, 12, 7, 30, 8]])
    mask = torch.ones_like(ids)
    calls = []

    def tracer():
        calls.append(1)
        return trace_model(model, ids, mask)

    members = torch.zeros(1, 1, 6)
    members[0, 0, 3:] = 1
    declaration = next(d for d in DECLARATIONS.values() if d.compute_span is None)
    found = []
    for read_first in (True, False):
        calls.clear()
        request = Request(get_spec(model), model, mask, None, None, torch.roll(ids, -1, 1), None, mask.bool(),
                          tracer)  # fmt: skip
        if read_first:
            assert request.trace is not None
        found.append(declaration.run_spans(request, declaration.options(), SpanRows(members)))
        assert calls == [1], declaration.name
    torch.testing.assert_close(found[0].target, found[1].target)
