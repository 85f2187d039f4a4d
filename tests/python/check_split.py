#!/usr/bin/env python3
"""Oracle for Tessera's export: runs a whole ONNX model and its exported
subgraphs with onnxruntime on the same seeded random inputs and compares.

Usage: check_split.py MODEL PLAN_JSON SUBGRAPH_DIR [--seed N] [--tol T]
                      [--dim NAME=VALUE ...]

PLAN_JSON is Tessera's `<model>_subgraphs.json`; SUBGRAPH_DIR holds
`subgraph_<id>.onnx` for each subgraph. Subgraphs run in id order (a
topological order), reading graph inputs and earlier subgraphs' outputs.
Prints `max_abs_diff=<value>` and exits 1 if it exceeds the tolerance (or an
output is missing), 0 otherwise.
"""
import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

NP_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64,
            9: np.bool_, 10: np.float16, 11: np.float64}


def make_inputs(model, rng, overrides):
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = []
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            elif d.HasField("dim_param") and d.dim_param in overrides:
                shape.append(overrides[d.dim_param])
            else:
                shape.append(1 if k == 0 else 64)
        dtype = NP_TYPES.get(tt.elem_type)
        if dtype is None:
            sys.exit(f"unsupported input type {tt.elem_type} for {vi.name}")
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(0, 256, shape).astype(dtype)
    return feeds


def session(path_or_bytes):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(path_or_bytes, opts, providers=["CPUExecutionProvider"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("plan")
    ap.add_argument("subgraph_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--dim", action="append", default=[])
    a = ap.parse_args()
    overrides = {k: int(v) for k, v in (d.split("=", 1) for d in a.dim)}

    model = onnx.load(a.model)
    feeds = make_inputs(model, np.random.default_rng(a.seed), overrides)
    whole = session(a.model)
    out_names = [o.name for o in whole.get_outputs()]
    expected = dict(zip(out_names, whole.run(out_names, feeds)))

    with open(a.plan) as f:
        plan = json.load(f)
    values = dict(feeds)
    for init in model.graph.initializer:
        if init.name in plan.get("passthrough_outputs", []):
            values[init.name] = onnx.numpy_helper.to_array(init)
    for sg in sorted(plan["subgraphs"], key=lambda s: s["id"]):
        path = os.path.join(a.subgraph_dir, f"subgraph_{sg['id']}.onnx")
        onnx.checker.check_model(path)
        sess = session(path)
        ins = {i.name: values[i.name] for i in sess.get_inputs()}
        names = [o.name for o in sess.get_outputs()]
        values.update(zip(names, sess.run(names, ins)))

    worst = 0.0
    for name, want in expected.items():
        if name not in values:
            print(f"output {name} was not produced by any subgraph")
            return 1
        got = values[name]
        if got.shape != want.shape:
            print(f"output {name}: shape {got.shape} != {want.shape}")
            return 1
        if want.size:
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            worst = max(worst, float(np.nanmax(diff)) if not np.all(np.isnan(diff)) else 0.0)
    print(f"subgraphs={len(plan['subgraphs'])} outputs={len(expected)} max_abs_diff={worst:.3e}")
    return 0 if worst <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
