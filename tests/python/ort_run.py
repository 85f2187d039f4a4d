#!/usr/bin/env python3
"""Runs an ONNX model with onnxruntime (CPU) on .npy inputs.

Usage: ort_run.py MODEL OUT_DIR NAME=FILE.npy [NAME=FILE.npy ...]
Writes output i as OUT_DIR/out<i>.npy, in the model's output order.
"""
import os
import sys

import numpy as np
import onnxruntime as ort


def main():
    model, out_dir, *specs = sys.argv[1:]
    feeds = {}
    for spec in specs:
        name, path = spec.split("=", 1)
        feeds[name] = np.load(path)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    os.makedirs(out_dir, exist_ok=True)
    for i, y in enumerate(session.run(None, feeds)):
        np.save(os.path.join(out_dir, "out%d.npy" % i), y)


if __name__ == "__main__":
    main()
