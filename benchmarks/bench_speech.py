"""Time and memory of every method on a Whisper-base-sized model over a 30 s utterance of 80 aligned words, each as a
multiple of one plain forward pass measured in the same process.

The model has Whisper-base's shape with random weights (d_model 512, 6 + 6 layers, 8 heads, FFN 2048, 80 mel bins,
1,500 encoder frames, vocabulary 51,865; nothing is downloaded). The audio is synthetic (30 s of tones and noise), the
alignment 80 words of 0.3 s with a 0.05 s silence after every fifth word (96 units with the silences), the decoder
teacher-forced on an 80-word transcript (81 decoder tokens). Each method runs in its own process (one untimed call
first) so that its peak resident memory is its own: ``peak MiB`` is the growth of the process's peak RSS over the
method's two calls, above what the loaded model, the inputs and a forward pass reached (on CUDA:
``torch.cuda.max_memory_allocated`` over the two calls).

Usage:
    python benchmarks/bench_speech.py [--methods alti alti_logit decompx value_zeroing ...] [--device cuda]
        [--seconds 30] [--words 80]
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
import transformers

import inseq_mixing
from inseq_mixing.testing import WORDS, SpeechProcessor, randomize_weights, synthetic_audio, word_tokenizer

DEFAULT_METHODS = ["alti", "alti_logit", "decompx", "decompx+units", "attn_lrp", "value_zeroing", "attention_rollout",
                   "globenc"]  # fmt: skip
#: Rows that run a method with options: ``decompx+units`` decomposes over the audio units from the first block.
VARIANTS = {"decompx+units": ("decompx", {"unit_components": True})}


def whisper_base(device: str) -> torch.nn.Module:
    config = transformers.WhisperConfig(
        vocab_size=51865, num_mel_bins=80, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_source_positions=1500,
        max_target_positions=448, pad_token_id=0, eos_token_id=1, decoder_start_token_id=3, begin_suppress_tokens=None,
        suppress_tokens=None, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config)
    randomize_weights(model, 0)
    return model.eval().to(device)


def alignment(words: int, seconds: float) -> tuple[list, str]:
    intervals, start = [], 0.2
    for index in range(words):
        intervals.append((WORDS[index % len(WORDS)], round(start, 3), round(start + 0.3, 3)))
        start += 0.3 + (0.05 if index % 5 == 4 else 0.0)
    if start > seconds:
        raise SystemExit(f"{words} words do not fit in {seconds} s")
    return intervals, " ".join(word for word, _, _ in intervals)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(name: str, device: str, seconds: float, words: int) -> dict:
    method, options = VARIANTS.get(name, (name, {}))
    model = whisper_base(device)
    processor = SpeechProcessor(transformers.WhisperFeatureExtractor(feature_size=80), word_tokenizer(seq2seq=False))
    audio = synthetic_audio(seconds)
    intervals, transcript = alignment(words, seconds)
    attribution = inseq_mixing.load_model(model, method, processor=processor)
    features = processor.feature_extractor(audio, sampling_rate=16_000, return_tensors="pt").input_features.to(device)
    ids = torch.tensor([[3, *processor.tokenizer(transcript, add_special_tokens=False).input_ids]], device=device)

    def forward():
        with torch.no_grad():
            model(input_features=features, decoder_input_ids=ids[:, :-1])

    def attribute():
        return attribution.attribute(audio, transcript, words=intervals, show_progress=False, **options)

    forward()
    start = time.perf_counter()
    forward()
    forward_s = time.perf_counter() - start
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = peak_rss_mib()  # the model, the inputs and a forward pass
    out = attribute()  # untimed first call
    units = len(out.sequence_attributions[0].source)
    start = time.perf_counter()
    attribute()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds_taken = time.perf_counter() - start
    memory = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else peak_rss_mib() - before
    return {"method": name, "units": units, "forward_s": forward_s, "method_s": seconds_taken,
            "ratio": seconds_taken / forward_s, "peak_mib": memory}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--words", type=int, default=80)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.device, args.seconds, args.words)))
        return
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# Whisper-base-sized, {args.seconds:.0f} s, {args.words} words, {args.device} ({name}), torch "
          f"{torch.__version__}, transformers {transformers.__version__}")  # fmt: skip
    print("| method | units | forward (s) | method (s) | × forward | peak MiB |")
    print("|---|---|---|---|---|---|")
    for method in args.methods:
        command = [sys.executable, __file__, "--one", method, "--device", args.device, "--seconds", str(args.seconds),
                   "--words", str(args.words)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            print(f"| {method} | failed: {done.stderr.strip().splitlines()[-1]} |||||")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {method} | {row['units']} | {row['forward_s']:.3f} | {row['method_s']:.2f} | {row['ratio']:.1f} | "
              f"{row['peak_mib']:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
