#!/usr/bin/env python3
"""Runs an ONNX model with onnxruntime (CPU) on .npy inputs.

Usage: ort_run.py MODEL OUT_DIR NAME=FILE.npy [...] [-- NAME=FILE.npy [...]]...
Each `--` starts another run on the same session. The first run's output i
is written as OUT_DIR/out<i>.npy, run r's (r >= 1) as OUT_DIR/run<r>_out<i>.npy,
in the model's output order.
"""
import os
import sys

import numpy as np
import onnxruntime as ort


def main():
    model, out_dir, *specs = sys.argv[1:]
    runs = [[]]
    for spec in specs:
        if spec == "--":
            runs.append([])
        else:
            runs[-1].append(spec)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    os.makedirs(out_dir, exist_ok=True)
    for r, run in enumerate(runs):
        feeds = {}
        for spec in run:
            name, path = spec.split("=", 1)
            feeds[name] = np.load(path)
        prefix = "" if r == 0 else "run%d_" % r
        for i, y in enumerate(session.run(None, feeds)):
            np.save(os.path.join(out_dir, "%sout%d.npy" % (prefix, i)), y)


if __name__ == "__main__":
    main()
