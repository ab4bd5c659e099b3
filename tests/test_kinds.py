"""Kinds as records (issue 53): a fifth kind of model is one record, its front-end class and (if any) its protocol,
registered from outside the package, without editing any of its files; the router, ``inseq.load_model``'s refusal,
dataset-run columns, the explorer and ``evaluate`` then treat it as its own kind."""

import sys
from types import SimpleNamespace

import pytest
import torch

import inseq_mixing
from inseq_mixing.declarations import InputSize
from inseq_mixing.evaluation.protocols import PROTOCOLS, Protocol, register_protocol
from inseq_mixing.evaluation.scores import Evaluation, MethodResult
from inseq_mixing.frontends import identify
from inseq_mixing.frontends.encoder_base import EncoderFrontEnd, per_text
from inseq_mixing.frontends.encoders import EncoderAttributionModel
from inseq_mixing.frontends.kinds import KINDS, Kind, register_kind, unregister_kind
from inseq_mixing.frontends.layout import token_list
from inseq_mixing.frontends.router import inseq_refusal
from inseq_mixing.testing import encoder_tokenizer, tiny_encoder
from inseq_mixing.trace import trace_model

KIND = "bare_text"


class BareTextModel(EncoderAttributionModel):
    """The test kind's front end: the encoder front end, on bare encoders only, each input called a passage."""

    item_name = "passage"


def mass_protocol(model, methods, data, protocol, found, settings) -> Evaluation:
    """The test kind's protocol: the share of each text's first row on its first token, per method."""
    from inseq_mixing.evaluation.metrics import mean_statistic

    evaluation = Evaluation(protocol, draws=settings.draws, seed=settings.seed)
    evaluation.metric_names = ("first_token_share",)
    for method in methods:
        front = inseq_mixing.load_model(model, method, tokenizer=settings.tokenizer)
        out = front.attribute([row["text"] for row in data], show_progress=False)
        shares = [float(seq.source_attributions[0, 0] / seq.source_attributions[:, 0].sum())
                  for seq in out.sequence_attributions]  # fmt: skip
        evaluation.results[method] = MethodResult({"first_token_share": mean_statistic(shares)})
    evaluation.baseline = {"first_token_share": 0.0}
    return evaluation


def explorer_media(front, inputs) -> dict:
    return {}


@pytest.fixture
def fifth_kind():
    module = sys.modules[__name__]
    record = register_kind(Kind(
        KIND, "a bare text", "tokenizer", front_end=f"{module.__name__}:BareTextModel",
        claims=lambda config, class_name: class_name == "BertModel",
        columns=lambda model_type: ("text", "nothing"), explorer_media=f"{module.__name__}:explorer_media",
        commands="`inseq-mixing evaluate --protocol first_token_mass`",
    ))  # fmt: skip
    register_protocol(Protocol(KIND, "first_token_mass", f"{module.__name__}:mass_protocol", ("text",)))
    try:
        yield record
    finally:
        unregister_kind(KIND)
        PROTOCOLS.pop((KIND, "first_token_mass"), None)


def test_a_fifth_kind_registered_from_outside_is_its_own_kind(fifth_kind):
    assert list(KINDS)[-1] == "encoder"  # asked before the fallback, whatever the order of registration
    bare, masked = tiny_encoder("bert", task="bare"), tiny_encoder("bert")
    found = identify(bare)
    assert found.kind == KIND and found.record is fifth_kind and found.run_columns == ("text", "nothing")
    assert identify(masked).kind == "encoder"  # the other encoders stay the encoder kind's
    assert "this is a bare text model (bert)" in inseq_refusal(bare, "alti")

    front = inseq_mixing.load_model(bare, "alti", tokenizer=encoder_tokenizer())
    assert type(front) is BareTextModel and identify(front).kind == KIND
    other = inseq_mixing.load_model(front, "globenc")  # another method keeps the kind's front end
    assert type(other) is BareTextModel and other.method == "globenc"
    expected = EncoderAttributionModel(bare, encoder_tokenizer(), "alti").attribute("the cat sat", show_progress=False)
    got = front.attribute("the cat sat", show_progress=False)
    torch.testing.assert_close(got.sequence_attributions[0].source_attributions,
                               expected.sequence_attributions[0].source_attributions)  # fmt: skip

    rows = [{"text": "the cat sat on the mat"}, {"text": "a dog ran"}]
    result = inseq_mixing.evaluate(bare, ["alti", "attention_rollout"], rows, "first_token_mass",
                                   tokenizer=encoder_tokenizer(), draws=10)  # fmt: skip
    for method in ("alti", "attention_rollout"):  # the kind's protocol ran each method on the kind's front end
        share = float(result.results[method].statistics["first_token_share"].value())
        assert 0 < share < 1 and result.method_summary(method)["n"] == 2
    with pytest.raises(inseq_mixing.evaluation.EvaluationInputError, match="first_token_mass"):
        inseq_mixing.evaluate(bare, ["alti"], rows, "cue", tokenizer=encoder_tokenizer())  # names what it takes

    page = inseq_mixing.explore_model(bare, "the cat sat", methods=["alti"], tokenizer=encoder_tokenizer())
    assert "alti" in page


def test_without_the_record_the_model_is_the_encoder_kind_again(fifth_kind):
    unregister_kind(KIND)
    bare = tiny_encoder("bert", task="bare")
    assert identify(bare).kind == "encoder"
    assert type(inseq_mixing.load_model(bare, "alti", tokenizer=encoder_tokenizer())) is EncoderAttributionModel


class TokenIdsModel(EncoderFrontEnd):
    """A modality written on the encoder base alone (issue 53): inputs are lists of token ids, no tokenizer. It fills
    the base's public hooks and nothing else; every check, foil, layout and gradient baseline is the base's."""

    item_name = "id list"

    def __init__(self, model, method):
        super().__init__(model, method)

    def for_method(self, method):
        return type(self)(self.model, method)

    def model_task(self):
        return "sequence_classification"

    def attribute(self, id_lists, targets=None, foils=None, **options):
        return self.attribute_inputs(list(id_lists), targets, foils, batch_size=8, show_progress=False,
                                     method_options=options)  # fmt: skip

    def items(self, id_lists, targets, foils):
        targets, foils = per_text(targets, len(id_lists), "targets"), per_text(foils, len(id_lists), "foils")
        return [SimpleNamespace(ids=ids, target=target, foil=foil, name=f"List {index}")
                for index, (ids, target, foil) in enumerate(zip(id_lists, targets, foils, strict=True))]  # fmt: skip

    def input_sizes(self, items, settings=None):
        return [InputSize(len(item.ids)) for item in items]

    def prepare(self, items, settings=None):
        ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(item.ids) for item in items], batch_first=True)
        mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(item.ids), dtype=torch.long) for item in items],
                                               batch_first=True)  # fmt: skip
        inputs = {"input_ids": ids, "attention_mask": mask}
        names = [item.name for item in items]
        explained = self.explained_cells(inputs, [None] * len(items), names)
        trace = trace_model(self.model, ids, mask, spec=self.spec)
        return self.finish_batch(names, inputs, explained, [item.target for item in items],
                                 [item.foil for item in items], trace)  # fmt: skip

    def explained_positions(self, ids, mask, chosen, name):
        return [0]

    def row_tokens(self, batch, row, cells):
        ids = batch.inputs["input_ids"][row, cells].tolist()
        return token_list([f"#{idx}" for idx in ids], ids)

    def input_embeddings(self, batch):
        return self.model.get_input_embeddings()(batch.inputs["input_ids"]).detach()

    def explained_logit(self, batch, row, cell, target, foil):
        text = EncoderAttributionModel(self.model, encoder_tokenizer(), "alti_logit")
        return text.explained_logit(batch, row, cell, target, foil)


@pytest.mark.parametrize("method", ["alti_logit", "alti", "integrated_gradients"])
def test_a_modality_on_the_encoder_base_alone_gives_the_text_front_end_s_scores(method):
    """The base knows no tokenizer: a front end of token-id lists, written on it from here, gives the text front end's
    scores and labels for the same tokens (logit method with a foil, map method, Captum's baseline)."""
    model, tokenizer = tiny_encoder("bert", task="sequence_classification"), encoder_tokenizer()
    texts = ["the cat sat on the mat", "a dog ran"]
    foils = None if method == "alti" else ["positive", 0]
    options = {"n_steps": 8} if method == "integrated_gradients" else {}
    text_front = EncoderAttributionModel(model, tokenizer, method)
    expected = text_front.attribute(texts, foils=foils, show_progress=False, **options)
    got = TokenIdsModel(model, method).attribute(tokenizer(texts)["input_ids"], foils=foils, **options)
    assert got.info["attributed_fn"] == expected.info["attributed_fn"]
    for mine, theirs in zip(got.sequence_attributions, expected.sequence_attributions, strict=True):
        torch.testing.assert_close(mine.source_attributions, theirs.source_attributions)
        assert [token.token for token in mine.target] == [token.token for token in theirs.target]
        assert mine.step_scores.keys() == theirs.step_scores.keys()
    with pytest.raises(ValueError, match="List 1: Unknown label 'nope'"):  # the base's checks name the input
        TokenIdsModel(model, method).attribute(tokenizer(texts)["input_ids"], targets=[0, "nope"], **options)
