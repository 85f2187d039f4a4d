"""Run an exported decoder folder with onnxruntime: one step with an explicit
KV cache, and a greedy generation loop that feeds present.N.* back as
past_key_values.N.*."""

from pathlib import Path

import numpy as np
import onnxruntime as ort

from llama_config import LlamaConfig


class OrtDecoder:
    def __init__(self, model_path: Path, config: LlamaConfig, threads: int = 0):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        if threads:
            options.inter_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(model_path), options, providers=["CPUExecutionProvider"]
        )
        self.config = config
        self.past_names = [
            i.name for i in self.session.get_inputs() if i.name.startswith("past_key_values.")
        ]
        self.output_names = [o.name for o in self.session.get_outputs()]
        # Where a decode batch pads each row's cache: after its positions
        # where the model says so (it reads each row's length from the mask).
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.pads_right = metadata.get("tessera.padding") == "right"

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        shape = (batch, self.config.num_kv_heads, 0, self.config.head_dim)
        return {name: np.zeros(shape, dtype=np.float32) for name in self.past_names}

    def step(
        self, input_ids, attention_mask, position_ids, past
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Logits of the new tokens and the cache to pass to the next step."""
        feeds = {
            "input_ids": np.asarray(input_ids, dtype=np.int64),
            "attention_mask": np.asarray(attention_mask, dtype=np.int64),
            "position_ids": np.asarray(position_ids, dtype=np.int64),
            **past,
        }
        results = dict(zip(self.output_names, self.session.run(self.output_names, feeds)))
        present = {
            name: results[name.replace("past_key_values.", "present.")] for name in self.past_names
        }
        return results["logits"], present

    def full(self, input_ids: list[int]) -> np.ndarray:
        """Logits [S, V] of one sequence, each position's from a single call
        over the sequence up to it with an empty cache (one call in all where
        the model answers every position; one per position where it answers
        the last only)."""
        rows = self.prefix(input_ids)
        if rows.shape[0] == len(input_ids):
            return rows
        return np.concatenate([self.prefix(input_ids[: n + 1])[-1:] for n in range(len(input_ids))])

    def padded_decode(self, rows: list[list[int]]) -> np.ndarray:
        """The last token of each row as one decode batch ([rows, V]), as
        Tessera runs it: each row's cache made alone from its other tokens,
        padded with zeros to the longest on the model's side, the mask
        saying which positions are the row's."""
        caches = [self.step([r[:-1]], np.ones((1, len(r) - 1)), [np.arange(len(r) - 1)],
                            self.empty_past(1))[1] for r in rows]
        longest = max(len(r) - 1 for r in rows)
        mask = np.zeros((len(rows), longest + 1), dtype=np.int64)
        past = {}
        for name in self.past_names:
            shape = list(caches[0][name].shape)
            shape[0], shape[2] = len(rows), longest
            past[name] = np.zeros(shape, dtype=np.float32)
        for b, (row, cache) in enumerate(zip(rows, caches)):
            own = len(row) - 1
            start = 0 if self.pads_right else longest - own
            for name in self.past_names:
                past[name][b, :, start : start + own] = cache[name][0]
            mask[b, start : start + own] = 1
            mask[b, own if self.pads_right else longest] = 1  # the new token
        ids = [[r[-1]] for r in rows]
        positions = [[len(r) - 1] for r in rows]
        logits, _ = self.step(ids, mask, positions, past)
        return logits[:, -1]

    def prefix(self, input_ids: list[int]) -> np.ndarray:
        """The logits one call over `input_ids` answers: [S, V], or [1, V]
        for a model that computes the last position only."""
        count = len(input_ids)
        logits, _ = self.step(
            [input_ids], np.ones((1, count)), [np.arange(count)], self.empty_past(1)
        )
        return logits[0]

    def greedy(self, prompt: list[int], max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
        """Argmax continuation of `prompt`; ends after the EOS token unless told not to."""
        past = self.empty_past(1)
        input_ids, total, generated = list(prompt), 0, []
        for _ in range(max_new_tokens):
            positions = np.arange(total, total + len(input_ids))
            total += len(input_ids)
            logits, past = self.step([input_ids], np.ones((1, total)), [positions], past)
            token = int(logits[0, -1].argmax())
            generated.append(token)
            if stop_at_eos and token == self.config.eos_token_id:
                break
            input_ids = [token]
        return generated
