#!/usr/bin/env python3
"""What a decode batch of rows of different lengths costs, padded each way.

    bench_padding.py FOLDER [--lengths 512,16,16,16] [--steps N] [--threads T]

Runs N decode steps of a converted folder (`convert_gguf.py --q4`: its
GroupQueryAttention reads each row's length from the attention mask, so a
batch pads each row after its own positions) for rows holding the given
numbers of positions (random caches), and the same rows each padded to
the longest with the padding before them, as a graph that appends at the
batch's width has to read them. Prints milliseconds a step both ways.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from llama_config import config_from_hf_json
from ort_decoder import OrtDecoder


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--lengths", default="512,16,16,16")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def step_ms(decoder: OrtDecoder, lengths: list[int], own: bool, steps: int) -> float:
    """Milliseconds a step: each row reading its own positions (`own`), or
    every row reading the longest row's (its padding before its own)."""
    rows, longest = len(lengths), max(lengths)
    rng = np.random.default_rng(0)
    config = decoder.config
    shape = (rows, config.num_kv_heads, longest, config.head_dim)
    past = {
        name: (rng.standard_normal(shape) * 0.1).astype(np.float32) for name in decoder.past_names
    }
    held = list(lengths) if own else [longest] * rows
    began = time.perf_counter()
    for _ in range(steps):
        mask = np.zeros((rows, max(held) + 1), np.int64)
        for b, n in enumerate(held):
            mask[b, : n + 1] = 1
        ids = np.full((rows, 1), 300)
        _, past = decoder.step(ids, mask, np.array(held)[:, None], past)
        held = [n + 1 for n in held]
    return (time.perf_counter() - began) / steps * 1000


def main() -> int:
    args = parse_args()
    config = config_from_hf_json(json.loads((args.folder / "config.json").read_text()))
    decoder = OrtDecoder(args.folder / "model.onnx", config, args.threads)
    lengths = [int(n) for n in args.lengths.split(",")]
    step_ms(decoder, lengths, True, 4)  # warm up: the first run pays allocations
    own = step_ms(decoder, lengths, True, args.steps)
    longest = step_ms(decoder, lengths, False, args.steps)
    print(
        f"rows of {lengths} positions, {args.threads} threads: each its own {own:.1f} ms a step, "
        f"all the longest's {longest:.1f} ms ({longest / own:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
