"""Speech: context mixing over audio words in Whisper and wav2vec 2.0, end to end on a synthesised signal.

Runs offline: the models are small ones built from configs with random weights, the audio a synthetic tone with
noise written to a WAV file, the word intervals made up as a forced aligner would give them. With the hub, swap in
``inseq_mixing.load_model("openai/whisper-base", "value_zeroing")`` and a real recording with its alignment.

    python examples/speech.py [--out out/speech.html]
"""

import argparse
from pathlib import Path

import soundfile

import inseq_mixing
from inseq_mixing.testing import SAMPLING_RATE, speech_processor, synthetic_audio, tiny_speech

WORDS = [("the", 0.10, 0.25), ("knight", 0.28, 0.55), ("rode", 0.58, 0.80)]  # (word, start_s, end_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/speech.html")
    out = Path(parser.parse_args().out)
    out.parent.mkdir(parents=True, exist_ok=True)
    wav = out.with_suffix(".wav")
    soundfile.write(wav, synthetic_audio(0.9), SAMPLING_RATE)

    whisper, processor = tiny_speech("whisper"), speech_processor("whisper")
    html = ""
    # Value zeroing: all frames of a word are zeroed at once; source = the audio's words, silences and padding
    vz = inseq_mixing.load_model(whisper, "value_zeroing", processor=processor)
    result = vz.attribute(str(wav), "the knight rode", words=WORDS, show_progress=False, per_layer=True)
    seq = result.sequence_attributions[0]
    print("units:", [token.token for token in seq.source])
    print("encoder unit map (units, units, layers):", tuple(seq.sequence_scores["encoder_self_scores"].shape))
    html += result.show(display=False, return_html=True)

    # ALTI-logit without word intervals: fixed windows; unit scores + unattributed terms = the logit
    logit = inseq_mixing.load_model(whisper, "alti_logit", processor=processor)
    seq = logit.attribute(str(wav), "the knight rode", window_s=0.3, show_progress=False).sequence_attributions[0]
    total = seq.source_attributions.sum(0) + seq.target_attributions.nan_to_num().sum(0)
    total = total + sum(value for name, value in seq.step_scores.items() if name.startswith("unattributed_"))
    print("ALTI-logit parts add up to the logit:", bool((total - seq.step_scores["logit"]).abs().max() < 1e-4))

    # CTC (wav2vec 2.0): the frames where greedy decoding emits a character are explained, over the words
    ctc = inseq_mixing.load_model(tiny_speech("wav2vec2"), "decompx", processor=speech_processor("wav2vec2"))
    result = ctc.attribute(str(wav), words=WORDS, show_progress=False)
    print("CTC explained frames:", [token.token for token in result.sequence_attributions[0].target])
    html += result.show(display=False, return_html=True)
    out.write_text(html, encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
