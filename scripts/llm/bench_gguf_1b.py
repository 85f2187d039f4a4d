#!/usr/bin/env python3
"""Tessera and llama.cpp on a Llama-3.2-1B-sized GGUF: decode, prompt, load, memory.

    bench_gguf_1b.py --llama DIR --tessera DIR --gguf MODEL.gguf
        [--runs 3] [--new-tokens 64] [--server-cache cold|warm]
        [--skip load,decode,prompt,convert,servers] [--json FILE]

DIR are folders of binaries: llama.cpp's llama-bench and llama-server
(scripts/llama-cpp.sh), Tessera's tessera, coordinator and worker.
scripts/bench-gguf-1b.sh writes the model (a seeded random
Llama-3.2-1B-shaped Q4_K GGUF, scripts/llm/random_gguf.py) and runs this.
Measured, one after the other, everything on one thread:

- load: `tessera generate MODEL --workers 1 --threads 1` (4 new tokens)
  with an empty build cache (TESSERA_CACHE_DIR a fresh folder: the GGUF
  is hashed and its graph built) and again with the same cache (the built
  model read back): its "loaded in X s" and the whole command's wall time,
  and its peak RSS (/usr/bin/time -v; the embedded cluster's coordinator
  and worker are one process);
- decode: tokens/s after the first token, llama-bench `-t 1 -p 0 -n 64`
  (tg64) against `tessera generate --workers 1 --threads 1 --max-tokens
  64 --context 512` ("tokens/s after it"; the cache warm), the two
  alternating, best of --runs each; llama-bench's peak RSS too;
- prompt: a prompt's tokens/s on one thread, llama-bench `-t 1 -p 256
  -n 0` (pp256) against `tessera generate` with a prompt of about as many
  tokens and one new token (its prompt tokens over "first token X ms":
  the prompt's pass and the first token's sampling), alternating, best of
  --runs each;
- convert: `tessera convert MODEL DIR` (the builder alone: the GGUF read,
  the graph built, the folder written) under /usr/bin/time -v: its
  maximum resident set size against the file's size;
- servers: a coordinator with the model as `[models.random] path`
  (context 512, one sequence) and one worker (1 thread), against
  `llama-server -m MODEL -t 1 -c 512`: the seconds from start until the
  model answers ready, then one streamed completion (64 tokens), then each
  process's peak RSS (VmHWM) against the file's size and against
  llama-server's. --server-cache cold (the default) gives the coordinator
  an empty build cache (it builds the graph, the peak a first start
  has), warm the one the load runs filled.

Prints one table; --json FILE writes it and every run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llama_cpp import (  # noqa: E402
    PROMPT, Services, alternate, generate_run, llama_bench_run, one_completion,
    start_llama_server, start_tessera_server,
)

MIB = 1 << 20
PROMPT_TOKENS = 256


def env_with_cache(cache: Path) -> dict:
    return {**os.environ, "TESSERA_CACHE_DIR": str(cache)}


def load(args, work: Path, out: dict) -> None:
    cache = work / "cache-load"
    out["load"] = {}
    for which in ("first", "cached"):
        run = generate_run(args.tessera, args.gguf, threads=1, new_tokens=4,
                           env=env_with_cache(cache), timed=True)
        out["load"][which] = run
        print(f"  {which}: {run}", flush=True)
    args.warm_cache = cache


def decode(args, work: Path, out: dict) -> None:
    env = env_with_cache(args.warm_cache or work / "cache-load")
    llama_stats: dict = {}
    tessera_runs: list = []

    def tessera() -> float:
        run = generate_run(args.tessera, args.gguf, threads=1, new_tokens=args.new_tokens,
                           context=512, env=env, timed=True)
        tessera_runs.append(run)
        return run["tokens_per_s"]

    best = alternate(
        args.runs,
        llama=lambda: llama_bench_run(args.llama, args.gguf, 1, new_tokens=args.new_tokens,
                                      stats=llama_stats),
        tessera=tessera,
    )
    out["decode"] = {"llama.cpp": best["llama"], "tessera": best["tessera"],
                     "tessera_runs": tessera_runs, "llama_bench_peak_kib": llama_stats.get("peak_kib")}


def prompt(args, work: Path, out: dict) -> None:
    env = env_with_cache(args.warm_cache or work / "cache-load")
    text = " ".join(f"{PROMPT} there was lighthouse number {i}." for i in range(24))
    runs: list = []

    def tessera() -> float:
        run = generate_run(args.tessera, args.gguf, threads=1, new_tokens=1, context=512,
                           prompt=text, env=env)
        runs.append(run)
        return run["prompt_tokens"] / (run["first_token_ms"] / 1000)

    best = alternate(
        args.runs,
        llama=lambda: llama_bench_run(args.llama, args.gguf, 1, new_tokens=0,
                                      prompt_tokens=PROMPT_TOKENS),
        tessera=tessera,
    )
    out["prompt"] = {"llama.cpp": best["llama"], "tessera": best["tessera"],
                     "tessera_prompt_tokens": runs[0]["prompt_tokens"], "tessera_runs": runs}


def convert(args, work: Path, out: dict) -> None:
    folder = work / "converted"
    cmd = ["/usr/bin/time", "-v", str(args.tessera / "tessera"), "convert", str(args.gguf), str(folder)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env_with_cache(work / "cache-convert"))
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"tessera convert exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    out["convert"] = {"peak_kib": peak, "wall_s": wall, "folder_bytes": size}
    print(f"  {out['convert']}", flush=True)
    shutil.rmtree(folder, ignore_errors=True)


def serve(args, work: Path, logs: Path, out: dict) -> None:
    out["servers"] = {}
    for side in ("llama.cpp", "tessera"):
        services = Services(logs)
        side_work = work / f"server-{side}"
        side_work.mkdir()
        try:
            started = time.perf_counter()
            if side == "llama.cpp":
                base = start_llama_server(args.llama, args.gguf, services, threads=1, context=512)
                model = "random"
            else:
                cache = (args.warm_cache if args.server_cache == "warm" and args.warm_cache
                         else side_work / "build-cache")
                os.environ["TESSERA_CACHE_DIR"] = str(cache)
                try:
                    base = start_tessera_server(args.tessera, args.gguf, services, side_work,
                                                name="random", slots=1, context=512, threads=1)
                finally:
                    os.environ.pop("TESSERA_CACHE_DIR", None)
                model = "random"
            ready = time.perf_counter() - started
            record: list = []
            one_completion(base, model, f"{PROMPT} there was a lighthouse", record)
            _, times, text = record[0]
            result = {"ready_s": ready, "pieces": len(times),
                      "peak_mib": services.peaks_mib()}
            if len(times) < 2:
                print(f"warning: {side}'s completion streamed {len(times)} pieces: {text!r}",
                      file=sys.stderr)
            out["servers"][side] = result
            print(f"  {side}: {result}", flush=True)
        finally:
            services.stop()


def table(args, out: dict) -> list:
    """Rows of (label, llama.cpp, Tessera, ratio), text cells."""
    file_mib = args.gguf.stat().st_size / MIB

    def mib(kib) -> str:
        return "–" if kib is None else f"{kib / 1024:,.0f} MiB ({kib * 1024 / MIB / file_mib:.2f}× file)"

    rows = [(f"the GGUF file ({args.gguf.name})", f"{file_mib:,.0f} MiB", "(the same)", "")]
    if "decode" in out:
        d = out["decode"]
        rows.append((f"decode tokens/s, 1 thread (tg{args.new_tokens}; generate --max-tokens "
                     f"{args.new_tokens}), best of {args.runs}, alternating",
                     f"{d['llama.cpp']:.1f}", f"{d['tessera']:.1f}", f"{d['tessera'] / d['llama.cpp']:.2f}"))
        peaks = [r.get("peak_kib") for r in d["tessera_runs"] if r.get("peak_kib")]
        rows.append(("peak RSS while decoding, one process (llama-bench; tessera generate: "
                     "coordinator and worker embedded)", mib(d["llama_bench_peak_kib"]),
                     mib(max(peaks) if peaks else None),
                     f"{max(peaks) / d['llama_bench_peak_kib']:.2f}"
                     if peaks and d["llama_bench_peak_kib"] else ""))
    if "prompt" in out:
        p = out["prompt"]
        rows.append((f"prompt tokens/s, 1 thread (pp{PROMPT_TOKENS}; a {p['tessera_prompt_tokens']}-token "
                     f"prompt, one new token), best of {args.runs}, alternating",
                     f"{p['llama.cpp']:.1f}", f"{p['tessera']:.1f}",
                     f"{p['tessera'] / p['llama.cpp']:.2f}"))
    if "load" in out:
        for which, label in (("first", "empty build cache"), ("cached", "cached, the same cache")):
            r = out["load"][which]
            rows.append((f"Tessera load, {label}: \"loaded in\" / whole command, s", "–",
                         f"{r.get('loaded_s', float('nan')):.2f} / {r['wall_s']:.2f}", ""))
        rows.append(("Tessera load: peak RSS, empty cache / cached (tessera generate)", "–",
                     f"{mib(out['load']['first'].get('peak_kib'))} / "
                     f"{mib(out['load']['cached'].get('peak_kib'))}", ""))
    if "convert" in out:
        c = out["convert"]
        rows.append(("peak RSS of `tessera convert` (GGUF read, graph built, folder written; "
                     f"{c['wall_s']:.1f} s)", "–", mib(c["peak_kib"]), ""))
    if "servers" in out:
        s = out["servers"]
        llama = s.get("llama.cpp", {}).get("peak_mib", {}).get("llama-server")
        ours = s.get("tessera", {}).get("peak_mib", {})
        to_kib = (lambda v: None if v is None else v * 1024)
        for name in ("coordinator", "worker"):
            if name in ours:
                rows.append((f"server peak RSS (VmHWM): Tessera's {name} / llama-server",
                             mib(to_kib(llama)), mib(to_kib(ours[name])),
                             f"{ours[name] / llama:.2f}" if llama else ""))
        if ours:
            total = sum(ours.values())
            rows.append((f"server peak RSS: coordinator + worker / llama-server ({args.server_cache} "
                         "build cache)", mib(to_kib(llama)), mib(to_kib(total)),
                         f"{total / llama:.2f}" if llama else ""))
        if "llama.cpp" in s and "tessera" in s:
            a, b = s["llama.cpp"]["ready_s"], s["tessera"]["ready_s"]
            rows.append((f"server start until the model is ready, s ({args.server_cache} build "
                         "cache)", f"{a:.1f}", f"{b:.1f}",
                         f"{b / a:.2f}"))
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama", type=Path, required=True)
    parser.add_argument("--tessera", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--server-cache", choices=["cold", "warm"], default="cold",
                        help="the coordinator's build cache: empty (it builds), or the load runs' one")
    parser.add_argument("--skip", default="", help="load,decode,prompt,convert,servers to leave out")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    args.gguf, args.warm_cache = args.gguf.resolve(), None
    if not Path("/usr/bin/time").is_file():
        sys.exit("bench_gguf_1b.py: no /usr/bin/time (apt-get install time)")
    skip = set(filter(None, args.skip.split(",")))
    logs = Path(tempfile.mkdtemp(prefix="bench-gguf-1b-"))
    work = logs / "work"
    work.mkdir()
    print(f"{args.gguf} ({args.gguf.stat().st_size / MIB:,.0f} MiB); logs in {logs}", flush=True)
    out: dict = {"gguf": str(args.gguf), "gguf_bytes": args.gguf.stat().st_size}
    try:
        for name, step in (("load", load), ("decode", decode), ("prompt", prompt),
                           ("convert", convert),
                           ("servers", serve)):
            if name in skip:
                continue
            print(f"{name}...", flush=True)
            step(args, work, logs, out) if name == "servers" else step(args, work, out)
    finally:
        # The logs stay; the built models and caches go.
        shutil.rmtree(work, ignore_errors=True)
    rows = table(args, out)
    print("\n| | llama.cpp | Tessera | Tessera / llama.cpp |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.json:
        out["table"] = [dict(zip(("label", "llama.cpp", "Tessera", "ratio"), r)) for r in rows]
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
