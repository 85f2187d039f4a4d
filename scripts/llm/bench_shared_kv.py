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


class Decoder:
    def __init__(self, folder: Path, threads: int, batch: int):
        config = json.loads((folder / "config.json").read_text())
        self.layers = config["num_hidden_layers"]
        self.kv_shape = (batch, config["num_key_value_heads"], config["head_dim"])
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(
            str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.batch = batch

    def cache_names(self):
        for layer in range(self.layers):
            for kind in ("key", "value"):
                yield f"past_key_values.{layer}.{kind}", f"present.{layer}.{kind}"

    def tokens(self, ids: np.ndarray, total: int) -> dict:
        rows, new = ids.shape
        return {
            "input_ids": ids.astype(np.int64),
            "attention_mask": np.ones((rows, total), np.int64),
            "position_ids": np.tile(np.arange(total - new, total), (rows, 1)).astype(np.int64),
        }

    def prefill(self, ids: np.ndarray) -> dict:
        b, heads, dim = self.kv_shape
        feed = self.tokens(ids, ids.shape[1])
        for past, _ in self.cache_names():
            feed[past] = np.zeros((b, heads, 0, dim), np.float32)
        return dict(zip(self.outputs, self.session.run(None, feed)))

    def plain(self, first: dict, start: int, steps: int) -> tuple[list, float]:
        cache = {past: first[present] for past, present in self.cache_names()}
        token, logits = first["logits"][:, -1].argmax(-1), []
        began = time.perf_counter()
        for i in range(steps):
            feed = self.tokens(token[:, None], start + i + 1)
            feed.update(cache)
            out = dict(zip(self.outputs, self.session.run(None, feed)))
            cache = {past: out[present] for past, present in self.cache_names()}
            logits.append(out["logits"][:, -1])
            token = logits[-1].argmax(-1)
        return logits, time.perf_counter() - began

    def shared(self, first: dict, start: int, steps: int, capacity: int) -> tuple[list, float]:
        b, heads, dim = self.kv_shape
        buffers = {}
        for past, present in self.cache_names():
            array = np.zeros((b, heads, capacity, dim), np.float32)
            array[:, :, :start] = first[present]
            buffers[(past, present)] = ort.OrtValue.ortvalue_from_numpy(array)
        token, logits = first["logits"][:, -1].argmax(-1), []
        began = time.perf_counter()
        for i in range(steps):
            binding = self.session.io_binding()
            for name, value in self.tokens(token[:, None], start + i + 1).items():
                binding.bind_cpu_input(name, value)
            for (past, present), value in buffers.items():
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
            binding.bind_output("logits")
            self.session.run_with_iobinding(binding)
            logits.append(binding.copy_outputs_to_cpu()[-1][:, -1])
            token = logits[-1].argmax(-1)
        return logits, time.perf_counter() - began


def main() -> int:
    args = parse_args()
    decoder = Decoder(args.folder, args.threads, args.batch)
    ids = np.random.default_rng(0).integers(100, 20000, (args.batch, args.prompt))
    first = decoder.prefill(ids)
    plain, plain_s = decoder.plain(first, args.prompt, args.steps)
    capacity = args.prompt + args.steps + args.spare
    shared, shared_s = decoder.shared(first, args.prompt, args.steps, capacity)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(plain, shared))
    made = args.batch * args.steps
    print(
        f"batch {args.batch}, prompt {args.prompt}, {args.steps} steps, {args.threads} threads, "
        f"buffers of {capacity}: plain {made / plain_s:.1f} tokens/s, shared "
        f"{made / shared_s:.1f} ({plain_s / shared_s:.2f}x); largest logit difference {diff:.2e}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
