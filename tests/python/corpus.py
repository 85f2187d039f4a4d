#!/usr/bin/env python3
"""The corpus runner: every real model of the corpus, in every split mode,
compared with onnxruntime on the same inputs.

Usage: corpus.py TESSERA_BIN MODELS_DIR WORK_DIR [--mode M ...] [--model NAME ...]
                 [--leave-out NAME ...]
                 [--cpu-backend auto|tract|onnxruntime]

Modes (default: all):
  local-cpu      tessera run --local --devices HETERO:CPU
  local-gpu-cpu  tessera run --local --devices HETERO:GPU,CPU (lavapipe in CI)
  cluster-cpu    the embedded cluster, two CPU workers, the default plan
  cluster-gpu    the embedded cluster, two workers serving GPU,CPU

Inputs are seeded and meaningful for each model (token ids within the
vocabulary, Silero's sample rate); dynamic dims get the sizes in CORPUS.
In the CPU modes the plan must be one subgraph (the CPU runs every node).
Tolerance: |tessera - onnxruntime| <= atol * max(1, max|onnxruntime|), atol
1e-4 on CPU and 1e-3 where a GPU takes part. Prints one line per
(model, mode) and `corpus: N passed, M failed`; exits 1 on any failure,
naming the model, the mode and what failed.
"""
import argparse
import os
import re
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

MODES = ["local-cpu", "local-gpu-cpu", "cluster-cpu", "cluster-gpu"]


def image(shape):
    return lambda rng: {"x": rng.random(shape, dtype=np.float32)}


def light(name):
    def inputs(rng):
        return {name: rng.random((1, 3, 224, 224), dtype=np.float32)}

    return inputs


def magika(rng):
    return {"bytes": rng.integers(0, 257, size=(1, 2048), dtype=np.int32)}


def minilm(rng):
    ids = rng.integers(1000, 30000, size=(1, 16), dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((1, 16), dtype=np.int64)}


def silero_sequence(rng):
    return {"input": (rng.random((4, 576), dtype=np.float32) - 0.5) * 0.2,
            "h": np.zeros((1, 1, 128), dtype=np.float32),
            "c": np.zeros((1, 1, 128), dtype=np.float32)}


# model file -> input generator
CORPUS = {
    "ch_PP-OCRv4_det_infer.onnx": image((1, 3, 320, 320)),
    "ch_PP-OCRv4_rec_infer.onnx": image((1, 3, 48, 320)),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": image((1, 3, 48, 192)),
    "magika_standard_v3_3.onnx": magika,
    "light_bvlc_alexnet.onnx": light("data_0"),
    "light_densenet121.onnx": light("data_0"),
    "light_inception_v1.onnx": light("data_0"),
    "light_inception_v2.onnx": light("data_0"),
    "light_resnet50.onnx": light("gpu_0/data_0"),
    "light_shufflenet.onnx": light("gpu_0/data_0"),
    "light_squeezenet.onnx": light("data_0"),
    "light_vgg19.onnx": light("data_0"),
    "light_zfnet512.onnx": light("gpu_0/data_0"),
    "paraphrase-MiniLM-L3-v2.onnx": minilm,
    "silero_vad_16k_sequence.onnx": silero_sequence,
}


def mode_args(mode):
    return {
        "local-cpu": ["--local", "--devices", "HETERO:CPU"],
        "local-gpu-cpu": ["--local", "--devices", "HETERO:GPU,CPU"],
        # lavapipe runs vgg19's 20 GFLOP in tens of seconds on two shared
        # cores: past the coordinator's default 30 s request deadline.
        "cluster-cpu": ["--workers", "2", "--deadline-ms", "600000"],
        "cluster-gpu": ["--workers", "2", "--worker-devices", "GPU,CPU",
                        "--deadline-ms", "600000"],
    }[mode]


def check(tessera, model_path, mode, backend, feeds, expected, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    args = [tessera, "run", model_path, "--output-dir", out_dir, "--cpu-backend", backend]
    args += mode_args(mode)
    for name, value in feeds.items():
        path = os.path.join(out_dir, "in_" + safe(name) + ".npy")
        np.save(path, value)
        args += ["--input", f"{name}={path}"]
    started = time.time()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    took = time.time() - started
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        # A crash report (every thread's backtrace) is shown whole.
        report = [i for i, l in enumerate(lines) if "tessera: fatal signal" in l]
        if report:
            crash = "\n".join(lines[report[0]:])
            return False, f"exit {proc.returncode} after {took:.0f} s, crashed:\n{crash}"
        tail = lines[-6:]
        return False, f"exit {proc.returncode} after {took:.0f} s: " + " | ".join(tail)
    atol = 1e-3 if "gpu" in mode else 1e-4
    worst = 0.0
    for name, want in expected.items():
        path = os.path.join(out_dir, safe(name) + ".npy")
        if not os.path.exists(path):
            return False, f"output '{name}' missing"
        got = np.load(path)
        if got.shape != want.shape:
            return False, f"output '{name}' has shape {got.shape}, onnxruntime {want.shape}"
        if want.dtype.kind in "iub":
            if not np.array_equal(got, want):
                return False, f"output '{name}' differs (integers)"
            continue
        scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if want.size else 0.0
        worst = max(worst, diff / scale)
        if not diff <= atol * scale:
            return False, f"output '{name}' differs by {diff:.3g} (scale {scale:.3g}, atol {atol})"
    plan = next((l for l in proc.stdout.splitlines() if "subgraph" in l), "")
    # The CPU runs every node of the corpus: one device used, one subgraph.
    count = re.match(r"\s*(\d+) subgraphs", plan)
    if mode.endswith("-cpu") and "gpu" not in mode and (not count or count.group(1) != "1"):
        return False, f"expected 1 subgraph on the CPU, got: {plan.strip()}"
    return True, f"max rel diff {worst:.2g}, {took:.1f} s; {plan.strip()}"


def safe(name):
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tessera")
    p.add_argument("models")
    p.add_argument("work")
    p.add_argument("--mode", action="append", choices=MODES)
    p.add_argument("--model", action="append")
    p.add_argument("--leave-out", action="append", default=[],
                   help="a model to leave out (the GPU modes on a software adapter: vgg19)")
    p.add_argument("--cpu-backend", default="auto", choices=["auto", "tract", "onnxruntime"])
    a = p.parse_args()
    modes = a.mode or MODES
    models = [m for m in CORPUS if not a.model or any(s in m for s in a.model)]
    for m in a.leave_out:
        if m not in CORPUS:
            sys.exit(f"--leave-out {m}: not a corpus model")
        print(f"left out: {m}", flush=True)
    models = [m for m in models if m not in a.leave_out]
    passed, failed = 0, []
    for model in models:
        path = os.path.join(a.models, model)
        if not os.path.exists(path):
            failed.append(f"{model}: missing (run scripts/fetch-test-models.sh)")
            print(f"FAIL {model}: missing", flush=True)
            continue
        feeds = CORPUS[model](np.random.default_rng(7))
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        expected = dict(zip(names, session.run(None, feeds)))
        for mode in modes:
            out = os.path.join(a.work, safe(model), mode)
            ok, what = check(a.tessera, path, mode, a.cpu_backend, feeds, expected, out)
            label = f"{mode}, {a.cpu_backend}"
            print(f"{'ok  ' if ok else 'FAIL'} {model} [{label}]: {what}", flush=True)
            if ok:
                passed += 1
            else:
                failed.append(f"{model} [{label}]: {what}")
    print(f"corpus: {passed} passed, {len(failed)} failed")
    for f in failed:
        print("  failed: " + f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
