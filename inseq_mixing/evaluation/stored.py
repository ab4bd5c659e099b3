"""Evaluating a stored run (the store of :func:`~inseq_mixing.attribute_dataset`) without attributing again.

The faithfulness protocol needs only the attributions and the model: each stored example's scores rank its context
tokens, and the model is read on the texts with the top of the ranking removed or kept (AOPC, as
:func:`~.evaluate.evaluate` computes it from the model: generation models replace tokens, every generated token
scored; encoder-only models delete them, each explained entry scored; speech models silence units, every explained
entry scored, the audio read again from the file the row names and cut into the units the run cut it into). The
run's method and rows are the store's; the model is the one the run names (or the one given), refused if its weights
are not the run's. The evidence, cue and alignment protocols (and the speech study's cue and blankout) explain
targets built from annotation columns the store does not hold: those are evaluated from the model.
"""

from dataclasses import replace
from types import SimpleNamespace

from ..frontends import as_front_end, identify
from ..frontends.audio import DEFAULT_WINDOW_S, AudioError, read_audio
from .compare import score_comparison
from .comparison import Comparison
from .encoders import encoder_faithfulness
from .faithfulness import DEFAULT_FRACTIONS
from .items import EvaluationInputError
from .scores import Evaluation, faithfulness_baseline, faithfulness_result
from .speech_faithfulness import explanations, speech_faithfulness


def evaluate_run(
    run,
    protocol: str = "faithfulness",
    *,
    model=None,
    tokenizer=None,
    processor=None,
    device: str | None = None,
    draws: int = 1000,
    seed: int = 0,
    examples: int = 2,
    random_draws: int = 3,
    show_progress: bool = False,
) -> Evaluation:
    """Evaluate the method of a stored run on its stored attributions (nothing is attributed again).

    Args:
        run: A run folder, or a run loaded with :func:`~inseq_mixing.load_run` (every valid shard is read).
        protocol: ``"faithfulness"`` (the only protocol a store holds what it needs for).
        model: The run's model (default: the name or folder its manifest records); refused if its weights are not
            the ones the run was made with.
        tokenizer: The model's tokenizer, for a model object.
        processor: A speech model object's processor.
        device: Where the model reads the perturbed texts.
        draws: Bootstrap resamples of the statistics.
        seed: Seed of the resampling and of the random rankings.
        examples: How many stored examples to keep for the report.
        random_draws: Random rankings per explained token (the baseline).
        show_progress: Show a progress bar.

    Returns:
        An :class:`~.scores.Evaluation` with one method, the run's.

    Raises:
        EvaluationInputError: Another protocol, an empty run, a model whose weights are not the run's, or a speech
            run whose audio files cannot be read or no longer give the stored units.
    """
    from ..runs import Run, load_run
    from ..runs.runner import weights_fingerprint

    run = run if isinstance(run, Run) else load_run(run)
    if protocol != "faithfulness":
        raise EvaluationInputError(
            f"A stored run is evaluated with the faithfulness protocol, not {protocol!r}: the {protocol} protocol "
            "explains targets built from annotation columns the store does not hold; evaluate it from the model."
        )
    if not len(run):
        raise EvaluationInputError(f"The run in {run.store.root} holds no example yet: run attribute_dataset first.")
    method = run.manifest["method"]
    model = run.manifest["model"]["name"] if model is None else model
    found = identify(model)
    front = as_front_end(model, method, found, tokenizer=tokenizer, processor=processor, device=device)
    if weights_fingerprint(front.model) != run.manifest["model"]["weights_sha"]:
        raise EvaluationInputError(
            f"The model's weights are not the ones the run in {run.store.root} was made with: pass model= (and "
            "tokenizer=) for the run's own model."
        )
    ids = run.ids()
    sequences = [run[example_id] for example_id in ids]
    if found.is_speech:
        explained = [(sequence, *_stored_audio(front, run, example_id, sequence)) for example_id, sequence in
                     zip(ids, sequences, strict=True)]  # fmt: skip
        tokens = speech_faithfulness(front, explained, DEFAULT_FRACTIONS, random_draws, seed)
    elif found.is_vision:
        from .vision import image_faithfulness

        explained = [(_stored_image(run, example_id), sequence, _stored_label(front, run, example_id))
                     for example_id, sequence in zip(ids, sequences, strict=True)]  # fmt: skip
        tokens = image_faithfulness(front, explained, DEFAULT_FRACTIONS, random_draws, seed)
    elif found.is_encoder:
        explained = [SimpleNamespace(seq=sequence) for sequence in sequences]
        tokens = encoder_faithfulness(front, explained, DEFAULT_FRACTIONS, random_draws, seed)
    else:
        from inseq.data import FeatureAttributionOutput

        comparison = Comparison(outputs={method: FeatureAttributionOutput(sequence_attributions=sequences)})
        score_comparison(comparison, front.model, front.tokenizer, DEFAULT_FRACTIONS, random_draws, show_progress)
        tokens = comparison.tokens
    evaluation = Evaluation(protocol, draws=draws, seed=seed)
    evaluation.results[method] = faithfulness_result(tokens)
    evaluation.baseline = faithfulness_baseline(tokens)
    evaluation.examples[method] = explanations(sequences[:examples])
    if found.is_vision:  # the report draws the scores over each image
        evaluation.examples[method] = [replace(shown, image=image) for shown, (image, *_) in
                                       zip(evaluation.examples[method], explained, strict=False)]  # fmt: skip
    return evaluation


def _stored_audio(front, run, example_id: str, sequence) -> tuple:
    """A speech example's signal, read again from the file its row names, and its units as the run cut them (its
    word intervals, or windows of the run's ``window_s``), checked against the stored units."""
    inputs = run.inputs(example_id)
    name = f"Example {example_id!r}"
    try:
        signal = front.check_length(read_audio(inputs["source_text"], front.sampling_rate, name), name)
        options = run.manifest["options"]
        rule = front.declaration.word_frames(options)  # the run's convention gave its words their frames
        units = front.units(signal, inputs["words"], options.get("window_s", DEFAULT_WINDOW_S), name, rule)
    except AudioError as error:
        raise EvaluationInputError(
            f"{error} The faithfulness of a speech run reads its audio files again: evaluate it where they are (the "
            "paths are the run's data's, relative ones from the folder the run was made in)."
        ) from None
    stored = [token.token for token in sequence.source]
    if [unit.label for unit in units] != stored:
        raise EvaluationInputError(
            f"{name}: its audio {inputs['source_text']!r} no longer gives the units the run stored ({stored}): the "
            "file changed since the run, or the run was stored before its word intervals were kept; run it again."
        )
    return signal, units


def _stored_image(run, example_id: str):
    """An image example, read again from the file its row names."""
    from ..frontends.vision import ImageError, read_image

    path = run.inputs(example_id)["source_text"]
    try:
        return read_image(path, f"Example {example_id!r}")
    except ImageError as error:
        raise EvaluationInputError(
            f"{error} The faithfulness of an image run reads its image files again: evaluate it where they are (the "
            "paths are the run's data's, relative ones from the folder the run was made in)."
        ) from None


def _stored_label(front, run, example_id: str):
    """The label an image example's scores are read for: the stored target when it is one of the model's labels (the
    row's, or a logit method's prediction), else None, the model's prediction (a map method stores the explained
    token, [CLS])."""
    text = run.inputs(example_id)["target_text"]
    try:
        front.output_index(text)
    except (ValueError, TypeError):
        return None
    return text
