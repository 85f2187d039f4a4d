"""onnxruntime's logits step by step, the oracle of Tessera's steps.

    ort_steps.py FOLDER --ids 504,3575,282 [--steps 3]

runs a fresh step over the prompt ids, then greedy decode steps that feed
the cache back (one thread), and prints one JSON object: the picked tokens
and each step's last-position logits.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from llama_config import config_from_hf_json
from ort_decoder import OrtDecoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--ids", required=True, help="prompt token ids, comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="decode steps after the prompt's")
    args = parser.parse_args()
    config = config_from_hf_json(json.loads((args.folder / "config.json").read_text()))
    decoder = OrtDecoder(args.folder / "model.onnx", config, threads=1)
    feed = [int(t) for t in args.ids.split(",")]
    past = decoder.empty_past(1)
    total, tokens, logits = 0, [], []
    for _ in range(args.steps + 1):
        count = len(feed)
        mask = np.ones((1, total + count), dtype=np.int64)
        positions = np.arange(total, total + count, dtype=np.int64)[None]
        step_logits, past = decoder.step([feed], mask, positions, past)
        last = step_logits[0, -1]
        logits.append([float(v) for v in last])
        tokens.append(int(np.argmax(last)))
        total += count
        feed = [tokens[-1]]
    print(json.dumps({"tokens": tokens, "logits": logits}))


if __name__ == "__main__":
    main()
