"""Attention flow (Abnar & Zuidema 2020): equal to a straightforward networkx maximum flow per (node, token) pair on
the authors' graph, built here from the real modules' attention weights; no flow above what the graph can carry."""

import re

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.methods.flow import CAPACITY_SCALE, FlowGraph, solve_flows
from inseq_mixing.testing import load_tiny, tiny_encoder, tiny_model
from inseq_mixing.trace import trace_model


def authors_layer_maps(attentions) -> list[np.ndarray]:
    """Their ``get_adjmat`` preparation: heads averaged, the identity added, rows renormalised."""
    maps = []
    for attention in attentions:
        mean = attention[0].double().mean(0).numpy()
        with_residual = mean + np.eye(mean.shape[-1])
        maps.append(with_residual / with_residual.sum(-1, keepdims=True))
    return maps


def reference_flows(layers: list[np.ndarray], below: list[np.ndarray] | None = None) -> np.ndarray:
    """One networkx Edmonds–Karp maximum flow per (node, input token) pair, the authors' way (``compute_flows``),
    on the layered graph; ``below``: an encoder's layers whose last states ``layers``' extra columns reach (the
    joint encoder–decoder graph). Raw flows ``(L, T, T[+S])``."""
    graph = nx.DiGraph()
    width = layers[0].shape[0]
    for layer, capacity in enumerate(layers, start=1):
        for i in range(width):
            for j in range(capacity.shape[1]):
                if capacity[i, j] > 0:
                    target = ("dec", layer - 1, j) if j < width else ("enc", len(below), j - width)
                    graph.add_edge(("dec", layer, i), target, capacity=float(capacity[i, j]))
    for layer, capacity in enumerate(below or [], start=1):
        for i, j in zip(*np.nonzero(capacity), strict=True):
            graph.add_edge(("enc", layer, i), ("enc", layer - 1, j), capacity=float(capacity[i, j]))
    sinks = [("dec", 0, j) for j in range(width)] + [("enc", 0, s) for s in range(0 if not below else len(below[0]))]
    flows = np.zeros((len(layers), width, len(sinks)))
    for layer in range(1, len(layers) + 1):
        for i in range(width):
            for index, sink in enumerate(sinks):
                if ("dec", layer, i) in graph and sink in graph:
                    flows[layer - 1, i, index] = nx.maximum_flow_value(
                        graph, ("dec", layer, i), sink, flow_func=nx.algorithms.flow.edmonds_karp
                    )
    return flows


def rounding_bound(layers: list) -> float:
    """The solver's error bound: E / 2^30, E the graph's edges (a cut has at most as many)."""
    return sum(int((np.asarray(layer) > 0).sum()) for layer in layers) / (2 * CAPACITY_SCALE)


def run_flow(model, ids, every_layer=True, **extra):
    trace = trace_model(model, ids, torch.ones_like(ids), **extra)
    request = Request(spec=trace.spec, model=model, attention_mask=torch.ones_like(ids),
                      target_ids=None, target_mask=None, predicted_ids=ids, foil_ids=None,
                      positions=torch.ones_like(ids, dtype=torch.bool), tracer=lambda: trace)  # fmt: skip
    declaration = DECLARATIONS["attention_flow"]
    return declaration.run(request, declaration.make_options({"per_layer": every_layer}))


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_flows_equal_networkx_on_the_authors_graph_from_the_real_attention_weights(family):
    model = tiny_encoder("bert", "masked_lm") if family == "bert" else tiny_model(family)
    ids = torch.tensor([[5, 9, 14, 7, 22, 31]])
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    layers = authors_layer_maps(attentions)
    raw = reference_flows(layers)
    ours = solve_flows(FlowGraph(layers=layers), causal=family != "bert")
    np.testing.assert_allclose(ours, raw, atol=rounding_bound(layers), rtol=0)
    maps = run_flow(model, ids)
    expected = raw / raw.sum(-1, keepdims=True)
    np.testing.assert_allclose(maps.target[0].double().numpy(), expected, atol=1e-5, rtol=0)
    assert maps.axis == [f"layer {layer}" for layer in range(len(layers))]
    if family != "bert":  # causal: no flow from a later token
        assert (maps.target[0].triu(1) == 0).all()


def test_with_attention_sinks_a_row_is_normalised_to_the_share_that_reaches_the_tokens():
    """GPT-OSS's learned sinks take part of every attention row (the rows sum to less than 1) and pass nothing on: the
    capacities are ``0.5 · mean_h A + 0.5 · I`` from the real attention weights, not renormalised; each node's flows,
    normalised, are scaled to its maximum flow to all the input tokens at once (networkx, a super-sink behind them),
    and the rest is ``sink_share``: a row plus its share is 1, and the share is not nothing; a model without sinks
    reports none."""
    model = tiny_model("gpt_oss")
    ids = torch.tensor([[5, 9, 14, 7, 22, 31]])
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    layers = [0.5 * attention[0].double().mean(0).numpy() + 0.5 * np.eye(ids.shape[1]) for attention in attentions]
    assert all((layer.sum(-1) < 1 - 1e-3).any() for layer in layers)  # the sinks took part of the rows
    raw, reached = reference_flows(layers), reference_reach(layers)
    maps = run_flow(model, ids)
    expected = raw / raw.sum(-1, keepdims=True) * reached[..., None]
    np.testing.assert_allclose(maps.target[0].double().numpy(), expected, atol=1e-5, rtol=0)
    share = maps.positions["sink_share"][0].T.double().numpy()  # (layers, positions)
    np.testing.assert_allclose(share, 1 - reached, atol=1e-5, rtol=0)
    np.testing.assert_allclose(maps.target[0].sum(-1).double().numpy() + share, 1, atol=1e-5, rtol=0)
    assert share.min() > 1e-3
    assert "sink_share" not in run_flow(tiny_model("llama"), ids).positions


def reference_reach(layers: list[np.ndarray]) -> np.ndarray:
    """Each node's networkx maximum flow to every input token at once (a super-sink behind them) ``(L, T)``."""
    graph = nx.DiGraph()
    width = layers[0].shape[0]
    for layer, capacity in enumerate(layers, start=1):
        for i, j in zip(*np.nonzero(capacity), strict=True):
            graph.add_edge(("dec", layer, i), ("dec", layer - 1, j), capacity=float(capacity[i, j]))
    for j in range(width):
        graph.add_edge(("dec", 0, j), "every token", capacity=2.0)
    return np.array([[nx.maximum_flow_value(graph, ("dec", layer, i), "every token") for i in range(width)]
                     for layer in range(1, len(layers) + 1)])  # fmt: skip


def test_encoder_decoder_flows_follow_the_joint_graph():
    """Our extension: decoder nodes reach the decoder's layer below through the self-attention (scaled by the
    cross-attention's residual share) and the encoder's last states through the cross-attention."""
    model = tiny_model("marian")
    ids, target = torch.tensor([[5, 9, 14, 7, 1]]), torch.tensor([[0, 8, 12]])
    with torch.no_grad():
        out = model(input_ids=ids, decoder_input_ids=target, output_attentions=True)
    encoder = authors_layer_maps(out.encoder_attentions)
    joint = []
    for self_attention, cross_attention in zip(out.decoder_attentions, out.cross_attentions, strict=True):
        self_map = authors_layer_maps([self_attention])[0]
        cross = cross_attention[0].double().mean(0).numpy() * 0.5
        joint.append(np.concatenate([0.5 * self_map, cross], axis=-1))  # residual share 0.5 scales the self map
    raw = reference_flows(joint, below=encoder)
    maps = run_flow(model, ids, decoder_input_ids=target)
    expected = raw / raw.sum(-1, keepdims=True)
    width = target.shape[1]
    np.testing.assert_allclose(maps.target[0].double().numpy(), expected[..., :width], atol=1e-5, rtol=0)
    np.testing.assert_allclose(maps.source[0].double().numpy(), expected[..., width:], atol=1e-5, rtol=0)
    encoder_raw = reference_flows(encoder)[-1]
    np.testing.assert_allclose(maps.encoder[0].double().numpy(), encoder_raw / encoder_raw.sum(-1, keepdims=True),
                               atol=1e-5, rtol=0)  # fmt: skip


@st.composite
def layered_graphs(draw):
    layers, width = draw(st.integers(1, 3)), draw(st.integers(2, 5))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    maps = []
    for _ in range(layers):
        weights = torch.rand(width, width, generator=generator, dtype=torch.float64)
        weights[torch.rand(width, width, generator=generator) < 0.3] = 0  # sparse: cuts that bind
        weights += torch.eye(width, dtype=torch.float64)
        maps.append(weights / weights.sum(-1, keepdim=True))
    return maps


@given(layered_graphs())
def test_flows_are_maximum_flows_within_capacity(layers):
    """For any layered graph: the solver's flows equal networkx's (within the rounding bound), never exceed what
    leaves the node (1) or what enters the token's node, and are at least the best single path's bottleneck."""
    arrays = [layer.numpy() for layer in layers]
    ours = solve_flows(FlowGraph(layers=arrays), causal=False)
    np.testing.assert_allclose(ours, reference_flows(arrays), atol=rounding_bound(arrays), rtol=0)
    bound = rounding_bound(arrays)
    widest = np.eye(arrays[0].shape[0])  # widest[i, j]: best bottleneck from a node to input j, layer by layer
    for layer, capacity in enumerate(arrays):
        widest = np.max(np.minimum(capacity[:, :, None], widest[None, :, :]), axis=1)
        assert (ours[layer] <= 1 + bound).all() and (ours[layer] >= widest - bound).all()
        assert (ours[layer] <= capacity.sum(0)[None, :] + bound).all() if layer == 0 else True
        assert (ours[layer] >= -bound).all()


def test_attention_flow_is_an_inseq_method():
    model = load_tiny("gpt2", "attention_flow")
    out = model.attribute("the cat", "the cat sat on", show_progress=False, per_layer=True)
    scores = out.sequence_attributions[0].target_attributions
    assert scores.shape[-1] == 2 and out.info["score_axis"] == ["layer 0", "layer 1"]
    column_sums = scores.nansum(0)
    torch.testing.assert_close(column_sums, torch.ones_like(column_sums), atol=1e-5, rtol=0)


def test_too_many_flows_are_refused_before_solving():
    model = load_tiny("gpt2", "attention_flow")
    positions = 4  # the traced positions: the text's 5 tokens but the last, which predicts nothing explained
    for every_layer, layers in ((True, 2), (False, 1)):  # every layer's flows, or the last layer's alone

        def attribute(max_flows, every_layer=every_layer):
            model.attribute("the cat", "the cat sat on the", show_progress=False, max_flows=max_flows,
                            per_layer=every_layer)  # fmt: skip

        with pytest.raises(ValueError, match=r"needs (\d+) maximum flows.*max_flows=1:.*attention_rollout") as refused:
            attribute(1)
        needed = int(re.search(r"needs (\d+)", str(refused.value))[1])
        assert needed == layers * positions * positions  # layers × positions × tokens
        with pytest.raises(ValueError, match=f"max_flows={needed - 1}"):
            attribute(needed - 1)
        attribute(needed)


def test_the_last_layer_alone_is_every_layers_last():
    """Solving only the last layer's flows (the default) gives what every layer's flows give there."""
    model = tiny_model("marian")
    ids, target = torch.tensor([[5, 9, 14, 7, 1]]), torch.tensor([[0, 8, 12]])
    last = run_flow(model, ids, every_layer=False, decoder_input_ids=target)
    every = run_flow(model, ids, every_layer=True, decoder_input_ids=target)
    torch.testing.assert_close(last.target, every.target[:, -1], rtol=0, atol=0)
    torch.testing.assert_close(last.source, every.source[:, -1], rtol=0, atol=0)
    torch.testing.assert_close(last.encoder, every.encoder, rtol=0, atol=0)
