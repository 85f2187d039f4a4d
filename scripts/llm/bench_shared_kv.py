#!/usr/bin/env python3
"""Is a decode batch faster with its KV cache in place? One run, figures.

    bench_shared_kv.py FOLDER [--batch B] [--prompt P] [--steps N]
                              [--threads T] [--spare S]

Runs a converted folder's decoder (`convert_gguf.py --q4`: onnxruntime's
GroupQueryAttention) for N greedy decode steps of a batch of B random
prompts of P tokens, two ways, and prints tokens/s of each and the largest
logit difference between them:

- plain: each step's `present` is a new buffer that the next step reads as
  its `past` (onnxruntime copies the cache into it: what Tessera does);
- shared: one buffer per cache tensor of P + N + S positions, bound with
  IoBinding as both the step's past and its present, so that
  GroupQueryAttention appends in place (onnxruntime's
  past_present_share_buffer mode, what onnxruntime-genai can do).

The same graph serves both (its rows here all of one length, each
appended at its own length, which it reads from the mask).
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from llama_config import config_from_hf_json
from ort_decoder import OrtDecoder


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spare", type=int, default=8, help="shared buffers' spare positions")
    return parser.parse_args()


def load(folder: Path, threads: int) -> OrtDecoder:
    config = config_from_hf_json(json.loads((folder / "config.json").read_text()))
    return OrtDecoder(folder / "model.onnx", config, threads)


def one_token(tokens: np.ndarray, total: int) -> tuple:
    """Each row's token at position total - 1, attending to all `total`."""
    rows = len(tokens)
    return tokens[:, None], np.ones((rows, total)), np.full((rows, 1), total - 1)


def plain(decoder: OrtDecoder, first, cache: dict, start: int, steps: int) -> tuple[list, float]:
    """Each step's present handed back as the next step's past."""
    token, logits = first[:, -1].argmax(-1), []
    began = time.perf_counter()
    for i in range(steps):
        out, cache = decoder.step(*one_token(token, start + i + 1), cache)
        logits.append(out[:, -1])
        token = logits[-1].argmax(-1)
    return logits, time.perf_counter() - began


def shared(
    decoder: OrtDecoder, first, cache: dict, start: int, steps: int, capacity: int
) -> tuple[list, float]:
    """One buffer per cache tensor bound as both past and present."""
    buffers = {}
    for past, value in cache.items():
        rows, heads, _, dim = value.shape
        array = np.zeros((rows, heads, capacity, dim), np.float32)
        array[:, :, :start] = value
        buffers[past] = ort.OrtValue.ortvalue_from_numpy(array)
    token, logits = first[:, -1].argmax(-1), []
    began = time.perf_counter()
    for i in range(steps):
        binding = decoder.session.io_binding()
        names = ("input_ids", "attention_mask", "position_ids")
        for name, value in zip(names, one_token(token, start + i + 1)):
            binding.bind_cpu_input(name, np.asarray(value, dtype=np.int64))
        for past, value in buffers.items():
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(past.replace("past_key_values.", "present."), value)
        binding.bind_output("logits")
        decoder.session.run_with_iobinding(binding)
        logits.append(binding.copy_outputs_to_cpu()[-1][:, -1])
        token = logits[-1].argmax(-1)
    return logits, time.perf_counter() - began


def main() -> int:
    args = parse_args()
    decoder = load(args.folder, args.threads)
    ids = np.random.default_rng(0).integers(100, 20000, (args.batch, args.prompt))
    positions = np.tile(np.arange(args.prompt), (args.batch, 1))
    first, cache = decoder.step(
        ids, np.ones(ids.shape), positions, decoder.empty_past(args.batch)
    )
    plain_logits, plain_s = plain(decoder, first, cache, args.prompt, args.steps)
    capacity = args.prompt + args.steps + args.spare
    shared_logits, shared_s = shared(decoder, first, cache, args.prompt, args.steps, capacity)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(plain_logits, shared_logits))
    made = args.batch * args.steps
    print(
        f"batch {args.batch}, prompt {args.prompt}, {args.steps} steps, {args.threads} threads, "
        f"buffers of {capacity}: plain {made / plain_s:.1f} tokens/s, shared "
        f"{made / shared_s:.1f} ({plain_s / shared_s:.2f}x); largest logit difference {diff:.2e}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
