#!/usr/bin/env python3
"""Check an exported llama decoder folder (see convert_gguf.py); exits 1 on a failure.

    check_model.py FOLDER [--expect " Paris"]
    check_model.py FOLDER --gguf MODEL.gguf [--tolerance 0.05] [--logits-only]

- onnxruntime's logits equal a float64 numpy forward over the weights read
  back from the ONNX initializers (tolerance 1e-3 x max(1, max |logit|)),
  or with --gguf over the GGUF file's own weights (dequantized by the gguf
  library, llama.cpp's row order and RoPE: the converter's dequantization
  and row permutation are checked too), and pick the same most likely
  token at every position;
- prefill + token-by-token decode through the KV cache equals one full pass,
  and a decode batch of two rows, the shorter's cache padded on the
  model's side (after its positions where it says `tessera.padding` is
  `right`, else before), equals its rows run alone (same tolerance);
- with --expect, the greedy continuation of the first prompt starts with it;
- the `tokenizers` library and onnxruntime-genai's tokenizer give the same ids,
  `tokenizers` decodes them back to the text and genai to the same text less
  its special tokens; genai renders the chat template as jinja2 does;
- onnxruntime-genai's greedy search equals the onnxruntime loop here (genai
  leaves a final EOS token out of its sequence);
- prints generation speed of genai and of the loop here on one thread.

A 4-bit folder (convert_gguf.py --q4) computes with int8 activations, so
its logits are the numpy forward's only within a looser --tolerance; the
tests also compare it with onnxruntime-genai on the same folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime_genai as og

if TYPE_CHECKING:
    from tokenizers import Tokenizer

from llama_config import LlamaConfig, config_from_hf_json
from numpy_llama import forward, load_gguf, load_initializers
from ort_decoder import OrtDecoder

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
TOKENIZER_TEXTS = ["12345 + 678 = 91011", "héllo 日本 🙂", "  two spaces\n\ttab<|im_end|>x"]
NEW_TOKENS = 20
SPEED_TOKENS = 32


class Report:
    def __init__(self):
        self.failures = 0

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")

    def close(
        self, name: str, actual: np.ndarray, expected: np.ndarray, relative: float = 1e-3
    ) -> None:
        """Max abs difference against `relative` x the logits' scale."""
        diff = float(np.max(np.abs(actual - expected)))
        tolerance = relative * max(1.0, float(np.max(np.abs(expected))))
        self.check(name, diff <= tolerance, f"max abs diff {diff:.3g} (tolerance {tolerance:.3g})")


def check_against_numpy(
    report: Report, decoder: OrtDecoder, weights: dict, ids: list[int], gguf: bool, relative: float
) -> None:
    mask = np.ones((1, len(ids)), dtype=np.int64)
    expected = forward(weights, decoder.config, np.array([ids]), mask, interleaved_rope=gguf)[0]
    actual = decoder.full(ids)
    source = "the GGUF's numpy forward" if gguf else "numpy"
    report.close(f"onnxruntime vs {source} logits, {len(ids)} tokens", actual, expected, relative)
    same = int(np.sum(actual.argmax(-1) == expected.argmax(-1)))
    report.check(
        f"onnxruntime vs {source}: the most likely token", same == len(ids),
        f"{same} of {len(ids)} positions agree",
    )


def check_cache(
    report: Report, decoder: OrtDecoder, ids: list[int], prefill: int, relative: float = 1e-3
) -> None:
    """Prefill `prefill` tokens, then one token a step, against one full pass."""
    logits, past = decoder.step(
        [ids[:prefill]], np.ones((1, prefill)), [np.arange(prefill)], decoder.empty_past(1)
    )
    rows = [logits[0]]
    for position in range(prefill, len(ids)):
        step = [[ids[position]]], np.ones((1, position + 1)), [[position]]
        logits, past = decoder.step(*step, past)
        rows.append(logits[0])
    rows = np.concatenate(rows)
    report.close(
        f"prefill {prefill} + decode {len(ids) - prefill} vs full pass",
        rows,
        decoder.full(ids)[-len(rows) :],
        relative,
    )


def check_padded_decode(
    report: Report, decoder: OrtDecoder, long: list[int], short: list[int], relative: float = 1e-3
) -> None:
    """Both rows' last tokens as one decode batch, the shorter row's cache
    padded on the model's side, against each row alone."""
    pad = len(long) - len(short)
    batched = decoder.padded_decode([long, short])
    alone = np.stack([decoder.prefix(r)[-1] for r in (long, short)])
    side = "right" if decoder.pads_right else "left"
    report.close(f"{side}-padded decode batch of 2 (pad {pad}) vs rows alone", batched, alone, relative)


def check_tokenizers(report: Report, hf: Tokenizer, genai: og.Tokenizer, texts: list[str]) -> None:
    for text in texts:
        hf_ids = hf.encode(text).ids
        genai_ids = [int(i) for i in genai.encode(text)]
        report.check(
            f"token ids of {text!r}", hf_ids == genai_ids, f"tokenizers {hf_ids}, genai {genai_ids}"
        )
        decoded = hf.decode(hf_ids, skip_special_tokens=False)
        report.check(f"tokenizers decode of {text!r}", decoded == text, repr(decoded))
        expected, decoded = hf.decode(hf_ids), genai.decode(genai_ids)
        report.check(
            f"genai decode of {text!r} (special tokens skipped)", decoded == expected, repr(decoded)
        )


def chat_prompt(report: Report, folder: Path, genai: og.Tokenizer) -> str:
    template = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    import jinja2

    expected = jinja2.Template(template).render(messages=CHAT, add_generation_prompt=True)
    rendered = genai.apply_chat_template(json.dumps(CHAT), add_generation_prompt=True)
    report.check("genai chat template vs jinja2", rendered == expected, repr(rendered))
    return expected


def genai_greedy(model: og.Model, ids: list[int], new_tokens: int, min_new: int = 0) -> list[int]:
    params = og.GeneratorParams(model)
    total = len(ids) + new_tokens
    params.set_search_options(max_length=total, min_length=len(ids) + min_new, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)[len(ids) :]]


def check_genai(
    report: Report, model: og.Model, decoder: OrtDecoder, hf: Tokenizer, prompts: list[str]
) -> None:
    for prompt in prompts:
        ids = hf.encode(prompt).ids
        ours = decoder.greedy(ids, NEW_TOKENS)
        text = hf.decode(ours, skip_special_tokens=False)
        if ours[-1] == decoder.config.eos_token_id:
            ours = ours[:-1]
        theirs = genai_greedy(model, ids, NEW_TOKENS)
        report.check(
            f"genai greedy == onnxruntime loop for {prompt[:40]!r}", ours == theirs, repr(text)
        )


def measure_speed(folder: Path, config: LlamaConfig, ids: list[int]) -> None:
    """Tokens/s for SPEED_TOKENS new tokens (prefill included), one thread each."""
    genai_config = og.Config(str(folder))
    one_thread = {"intra_op_num_threads": 1, "inter_op_num_threads": 1}
    genai_config.overlay(json.dumps({"model": {"decoder": {"session_options": one_thread}}}))
    model = og.Model(genai_config)
    decoder = OrtDecoder(folder / "model.onnx", config, threads=1)
    for name, run in (
        ("onnxruntime-genai", lambda: genai_greedy(model, ids, SPEED_TOKENS, min_new=SPEED_TOKENS)),
        ("onnxruntime loop", lambda: decoder.greedy(ids, SPEED_TOKENS, stop_at_eos=False)),
    ):
        run()
        started = time.perf_counter()
        count = len(run())
        elapsed = time.perf_counter() - started
        rate = count / elapsed
        print(f"SPEED {name}, 1 thread: {count} new tokens after {len(ids)}: {rate:.1f} tokens/s")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="folder written by convert_gguf.py")
    parser.add_argument(
        "--expect", help=f"text the greedy continuation of {PROMPTS[0]!r} must start with"
    )
    parser.add_argument(
        "--gguf", type=Path, help="the GGUF file the folder came from: the numpy forward's weights"
    )
    parser.add_argument(
        "--tolerance", type=float, default=1e-3,
        help="logits' tolerance, times max(1, max |logit|) (default 1e-3)",
    )
    parser.add_argument(
        "--logits-only", action="store_true",
        help="only the logits' checks: against numpy, through the cache, a padded batch",
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    config = config_from_hf_json(json.loads((args.folder / "config.json").read_text()))
    decoder = OrtDecoder(args.folder / "model.onnx", config)
    model = og.Model(str(args.folder))
    genai_tokenizer = og.Tokenizer(model)
    report = Report()
    ids = [int(i) for i in genai_tokenizer.encode(PROMPTS[0] + " Paris. It is known for")]
    if args.gguf:
        weights = load_gguf(args.gguf)
    else:
        weights = load_initializers(args.folder / "model.onnx")
    check_against_numpy(report, decoder, weights, ids, bool(args.gguf), args.tolerance)
    if args.logits_only:
        # The cache and padding checks at the same tolerance (int8
        # activations round a step differently with other shapes).
        short = [int(i) for i in genai_tokenizer.encode(PROMPTS[1])]
        check_cache(report, decoder, ids, 4, args.tolerance)
        check_padded_decode(report, decoder, ids, short, args.tolerance)
        print(f"{report.failures} failure(s)")
        return 1 if report.failures else 0
    # The full checks compare with the `tokenizers` library and jinja2.
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(args.folder / "tokenizer.json"))
    if ids != hf.encode(PROMPTS[0] + " Paris. It is known for").ids:
        report.check("tokenizers vs genai", False, "the check's prompt encodes differently")
    check_cache(report, decoder, ids, prefill=4)
    check_padded_decode(report, decoder, ids, hf.encode(PROMPTS[1]).ids)
    if args.expect is not None:
        continuation = hf.decode(decoder.greedy(hf.encode(PROMPTS[0]).ids, NEW_TOKENS))
        report.check(
            f"greedy continuation starts with {args.expect!r}",
            continuation.startswith(args.expect),
            repr(continuation),
        )
    prompts = PROMPTS + [chat_prompt(report, args.folder, genai_tokenizer)]
    check_tokenizers(report, hf, genai_tokenizer, prompts + TOKENIZER_TEXTS)
    check_genai(report, model, decoder, hf, prompts)
    measure_speed(args.folder, config, hf.encode(PROMPTS[0]).ids)
    print(f"{report.failures} failure(s)")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
