#!/usr/bin/env python3
"""Tessera against llama.cpp on the same GGUF, ratios from one run.

    bench_llama_cpp.py --llama DIR --tessera DIR --gguf MODEL.gguf [--folder FOLDER]
        [--threads 1] [--server-threads 2] [--streams 1,4,8] [--skip WHAT,...]

DIR are folders of binaries: llama.cpp's llama-bench, llama-server and
ggml-rpc-server (scripts/bench-llama-cpp.sh builds them), Tessera's
tessera, coordinator and worker. Both sides take the GGUF file itself
(Tessera builds its graph from it, kept in a build cache of this run's
own: TESSERA_CACHE_DIR is a fresh folder, so the first load builds and
the later ones read the cache). FOLDER, optional, is the same GGUF
converted to an onnxruntime-genai folder (scripts/llm/convert_gguf.py),
for one more comparison. Measured, each on the same weights, threads and
prompts, one after the other:

- one sequence: tokens/s after the first (llama-bench tg64 against
  `tessera generate GGUF --workers 1`), best of three runs each, the two
  alternating;
- with FOLDER: Tessera's decode tokens/s on the GGUF directly against the
  converted folder (both `tessera generate --workers 1`, same threads and
  prompt, alternating, best of three each), ratio GGUF / folder, and the
  two on disk;
- two processes: llama.cpp RPC (two ggml-rpc-servers, every layer on them)
  against two Tessera workers cut by memory;
- OpenAI servers (llama-server with one slot per stream; a coordinator
  with the GGUF as `[models.NAME] path` and one worker, `max_sequences` =
  the largest stream count) at 1, 4 and 8 streams: each stream sends
  completions of a 128-token prompt, 64 new tokens, greedy, streamed; time
  to the first token, inter-token latency, output tokens/s over all
  streams (tokens counted by the model's tokenizer.json: FOLDER's, else
  the one `tessera convert` writes);
- peak memory (VmHWM) of every process of each side;
- the model on disk: the GGUF for llama.cpp, the GGUF and its build cache
  entry for Tessera.

Prints a table of figures and ratios (Tessera / llama.cpp), and with
FOLDER a second one (GGUF / folder); --json FILE writes them too:
{"vs_llama_cpp": {label: {"llama.cpp", "Tessera", "ratio"}},
 "gguf_vs_folder": {label: {"folder", "GGUF", "ratio"}}}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

PROMPT = "Once upon a time"
NEW_TOKENS = 64
RUNS = 3
STORY = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps as "
    "his father had, and watched the ships pass the rocks where the river met the sea. "
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_kib(pid: int) -> int:
    """A live process's peak resident memory (VmHWM), KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_child(cmd: list[str]) -> tuple[str, str]:
    """stdout and stderr of a command run to its end; an error if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc.stdout, proc.stderr


class Services:
    """Background processes, stopped together."""

    def __init__(self, logs: Path):
        self.procs: list[subprocess.Popen] = []
        self.names: list[str] = []
        self.files: list = []
        self.logs = logs

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")
        self.files.append(log)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.names.append(name)
        return proc

    def peaks_mib(self) -> dict[str, float]:
        """Each process's peak resident memory, MiB, by the name it was started as."""
        return {name: peak_kib(p.pid) / 1024 for p, name in zip(self.procs, self.names)}

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()
        self.names.clear()
        for f in self.files:
            f.close()
        self.files.clear()


def wait_http(url: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {seconds} s")


def llama_bench_run(llama: Path, gguf: Path, threads: int, extra: list[str] = (),
                    new_tokens: int = NEW_TOKENS, repetitions: int = 1,
                    stats: dict | None = None, prompt_tokens: int = 0) -> float:
    """llama-bench tg`new_tokens` tokens/s (its best row's mean over its
    `repetitions`; llama-bench warms up with one token first); with
    `prompt_tokens` (and new_tokens 0), pp`prompt_tokens` instead. With
    `stats`, run under /usr/bin/time -v: its peak RSS (KiB) goes there as
    peak_kib."""
    cmd = [str(llama / "llama-bench"), "-m", str(gguf), "-t", str(threads),
           "-p", str(prompt_tokens), "-n", str(new_tokens), "-r", str(repetitions),
           "-o", "json", *extra]
    if stats is not None:
        cmd = ["/usr/bin/time", "-v", *cmd]
    out, err = run_child(cmd)
    if stats is not None and (found := re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)):
        stats["peak_kib"] = int(found.group(1))
    rows = json.loads(out)
    return max(float(r["avg_ts"]) for r in rows)


def llama_bench(args, extra: list[str], threads: int) -> float:
    """llama-bench tg64 tokens/s, best of RUNS runs."""
    return max(llama_bench_run(args.llama, args.gguf, threads, extra) for _ in range(RUNS))


def generate_run(tessera: Path, model: Path, *, workers: int = 1, threads: int = 1,
                 new_tokens: int = NEW_TOKENS, context: int = 512, memory: str | None = None,
                 prompt: str = PROMPT, env: dict | None = None,
                 timed: bool = False) -> dict:
    """One `tessera generate` run: its figures from stderr ("loaded in",
    "tokens/s after it", the hosts its plan spans), wall time and, with
    `timed`, its peak RSS (/usr/bin/time -v, KiB)."""
    cmd = [str(tessera / "tessera"), "generate", str(model), "--prompt", prompt,
           "--max-tokens", str(new_tokens), "--workers", str(workers),
           "--threads", str(threads), "--context", str(context)]
    if memory:
        cmd += ["--worker-memory", memory]
    if timed:
        cmd = ["/usr/bin/time", "-v", *cmd]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    err = proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"tessera generate exited {proc.returncode}:\n{err[-3000:]}")
    result = {"wall_s": wall, "hosts": len(set(re.findall(r"subgraph\d+ on ([^/]+)/", err)))}
    if found := re.search(r"loaded in ([0-9.]+) s", err):
        result["loaded_s"] = float(found.group(1))
    if found := re.search(r"generated (\d+) \(([^)]*)\)", err):
        result["generated"], result["finish"] = int(found.group(1)), found.group(2)
    if found := re.search(r"prompt (\d+) tokens", err):
        result["prompt_tokens"] = int(found.group(1))
    if found := re.search(r"first token ([0-9.]+) ms", err):
        result["first_token_ms"] = float(found.group(1))
    if found := re.search(r"([0-9.]+) tokens/s after it", err):
        result["tokens_per_s"] = float(found.group(1))
    if found := re.search(r"Maximum resident set size \(kbytes\): (\d+)", err):
        result["peak_kib"] = int(found.group(1))
    if "tokens_per_s" not in result and new_tokens > 1:
        raise RuntimeError(f"no tokens/s in tessera generate's output:\n{err[-3000:]}")
    if result.get("generated", new_tokens) < new_tokens:
        print(f"warning: tessera generate {model.name} stopped after {result['generated']} "
              f"tokens ({result.get('finish')}), not {new_tokens}", file=sys.stderr)
    return result


def tessera_generate(args, workers: int, memory: str | None) -> tuple[float, int]:
    """`tessera generate` on the GGUF: tokens/s after the first (best of
    RUNS) and the hosts its plan spans."""
    runs = [generate_run(args.tessera, args.gguf, workers=workers, threads=args.threads,
                         memory=memory) for _ in range(RUNS)]
    return max(r["tokens_per_s"] for r in runs), runs[-1]["hosts"]


def alternate(runs: int, **sides) -> dict:
    """Each side (a function giving tokens/s) run `runs` times, the sides
    taking turns; the best of each."""
    rates: dict = {name: [] for name in sides}
    for _ in range(runs):
        for name, run in sides.items():
            rates[name].append(run())
    print("  " + "; ".join(f"{n}: {', '.join(f'{r:.1f}' for r in v)}" for n, v in rates.items()),
          flush=True)
    return {name: max(v) for name, v in rates.items()}


def one_sequence(args, figures: dict) -> None:
    best = alternate(
        RUNS,
        llama=lambda: llama_bench_run(args.llama, args.gguf, args.threads),
        tessera=lambda: generate_run(args.tessera, args.gguf, threads=args.threads)["tokens_per_s"],
    )
    figures["one sequence, tokens/s"] = (best["llama"], best["tessera"])


def gguf_vs_folder(args, figures: dict) -> None:
    """Tessera's decode on the GGUF directly against the converted folder."""
    best = alternate(
        RUNS,
        gguf=lambda: generate_run(args.tessera, args.gguf, threads=args.threads)["tokens_per_s"],
        folder=lambda: generate_run(args.tessera, args.folder, threads=args.threads)["tokens_per_s"],
    )
    args.folder_figures["decode tokens/s, GGUF directly vs the converted folder"] = (
        best["folder"], best["gguf"]
    )
    folder_mb = sum(f.stat().st_size for f in args.folder.iterdir() if f.is_file()) / 1e6
    args.folder_figures["model on disk, MB"] = (folder_mb, args.gguf.stat().st_size / 1e6)


def two_processes(args, figures: dict, logs: Path) -> None:
    services = Services(logs)
    try:
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            services.start(f"rpc-{i}", [str(args.llama / "ggml-rpc-server"), "-H", "127.0.0.1",
                                        "-p", str(port), "-t", str(args.threads)])
        time.sleep(2)
        rpc = ",".join(f"127.0.0.1:{p}" for p in ports)
        llama = llama_bench(args, ["--rpc", rpc, "-ngl", "99"], args.threads)
    finally:
        services.stop()
    tessera, hosts = tessera_generate(args, 2, args.split_memory)
    if hosts != 2:
        print(f"warning: Tessera's plan spans {hosts} host(s), not 2", file=sys.stderr)
    figures["two processes, tokens/s"] = (llama, tessera)


def story_prompt(tokens: int) -> str:
    """A prompt of about `tokens` tokens (SmolLM2's tokenizer: ~1.3 tokens a word)."""
    words = STORY.split()
    count = int(tokens / 1.3)
    return " ".join((words * (count // len(words) + 1))[:count])


def one_completion(base: str, model: str, prompt: str, record: list) -> None:
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0,
        "stream": True,
    }).encode()
    request = urllib.request.Request(
        f"{base}/v1/completions", body, {"Content-Type": "application/json"}
    )
    started, times, text = time.perf_counter(), [], ""
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            piece = (chunk.get("choices") or [{}])[0].get("text") or ""
            if piece:
                times.append(time.perf_counter())
                text += piece
    record.append((started, times, text))


def load(base: str, model: str, streams: int, per_stream: int, tokenizer) -> dict:
    """`streams` clients, each sending `per_stream` completions one after
    the other: TTFT and ITL means (ms) and output tokens/s in all."""
    records: list = []
    story = story_prompt(120)

    def prompt(stream: int, k: int) -> str:
        # Its own first words: no request shares a prefix with another
        # (llama-server would answer a repeated prompt from its cache).
        return f"Tale {streams}-{stream}-{k}. {story}"

    def client(i: int) -> None:
        for k in range(per_stream):
            one_completion(base, model, prompt(i, k), records)

    one_completion(base, model, prompt(-1, 0), [])  # warm up
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    # Tokens counted by the model's tokenizer on each text, the same way for
    # both servers (a streamed chunk may hold more than one token).
    counts = [len(tokenizer.encode(text, add_special_tokens=False).ids) for _, _, text in records]
    ttft = statistics.mean(times[0] - start for start, times, _ in records if times)
    gaps = [
        (times[-1] - times[0]) / (count - 1)
        for (_, times, _), count in zip(records, counts)
        if len(times) > 1 and count > 1
    ]
    itl = statistics.mean(gaps)
    return {"ttft_ms": ttft * 1e3, "itl_ms": itl * 1e3, "tokens_per_s": sum(counts) / wall}


def llama_server(args, services: Services, slots: int) -> str:
    return start_llama_server(args.llama, args.gguf, services, threads=args.server_threads,
                              context=1024 * slots, slots=slots)


def start_llama_server(llama: Path, gguf: Path, services: Services, *, threads: int,
                       context: int, slots: int = 1) -> str:
    """llama-server on `gguf`, its base URL once /health answers."""
    port = free_port()
    cmd = [str(llama / "llama-server"), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
           "-c", str(context), "-np", str(slots), "-cb", "--host", "127.0.0.1", "--port",
           str(port), "--no-webui"]
    services.start("llama-server", cmd)
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/health")
    return base


def tessera_server(args, services: Services, slots: int, work: Path) -> str:
    return start_tessera_server(args.tessera, args.gguf, services, work, name="smollm2",
                                slots=slots, context=1024, threads=args.server_threads)


def start_tessera_server(tessera: Path, model: Path, services: Services, work: Path, *,
                         name: str, slots: int, context: int, threads: int,
                         ready_timeout: float = 600) -> str:
    """A coordinator with `model` (a GGUF file or a folder) as
    `[models.NAME] path` and one worker; its front door's base URL once
    the model is ready."""
    certs = work / "certs"
    subprocess.run([str(tessera / "tessera"), "certs", "init", "--dir", str(certs), "--cluster",
                    "bench", "--nodes", "coordinator,node-a"], check=True, stdout=subprocess.DEVNULL)
    quic, http = free_port(), free_port()
    (work / "cluster.toml").write_text(
        f'cluster = "bench"\nlisten = "127.0.0.1:{quic}"\ncerts = "{certs}"\n'
        f'http_listen = "127.0.0.1:{http}"\n\n[models.{name}]\npath = "{model}"\n'
        f"context = {context}\nmax_sequences = {slots}\n"
    )
    services.start("coordinator", [str(tessera / "coordinator"), "--config",
                                   str(work / "cluster.toml")])
    time.sleep(1)
    services.start("worker", [
        str(tessera / "worker"), "--devices", "CPU", "--name", "node-a", "--coordinator",
        f"127.0.0.1:{quic}", "--certs", str(certs), "--cluster", "bench",
        "--threads", str(threads), "--cache-dir", str(work / "cache"),
    ])
    base = f"http://127.0.0.1:{http}"
    wait_http(f"{base}/v2/health/ready", ready_timeout)
    wait_http(f"{base}/v2/models/{name}/ready", ready_timeout)
    return base


def tokenizer_file(args, logs: Path) -> Path:
    """The model's tokenizer.json: the folder's, else the one `tessera
    convert` writes of the GGUF (into the logs' folder)."""
    if args.folder:
        return args.folder / "tokenizer.json"
    out = logs / "converted"
    if not (out / "tokenizer.json").is_file():
        run_child([str(args.tessera / "tessera"), "convert", str(args.gguf), str(out)])
    return out / "tokenizer.json"


def servers(args, figures: dict, logs: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file(args, logs)))
    slots = max(args.streams)
    results = {}
    for side in ("llama.cpp", "tessera"):
        services = Services(logs)
        work = Path(tempfile.mkdtemp(prefix=f"bench-{side}-"))
        try:
            if side == "llama.cpp":
                base = llama_server(args, services, slots)
            else:
                base = tessera_server(args, services, slots, work)
            for streams in args.streams:
                results[(side, streams)] = load(base, "smollm2", streams, 2, tokenizer)
                print(f"  {side}, {streams} stream(s): {results[(side, streams)]}", flush=True)
            results[(side, "peak")] = services.peaks_mib()
        finally:
            services.stop()
            shutil.rmtree(work, ignore_errors=True)
    for streams in args.streams:
        llama, ours = results[("llama.cpp", streams)], results[("tessera", streams)]
        for key, label in (("tokens_per_s", "output tokens/s"), ("itl_ms", "inter-token ms"),
                           ("ttft_ms", "first token ms")):
            figures[f"server, {streams} stream(s): {label}"] = (llama[key], ours[key])
    peaks = results[("tessera", "peak")]
    figures["server peak memory, MiB (all processes; Tessera: "
            + ", ".join(f"{n} {v:.0f}" for n, v in peaks.items()) + ")"] = (
        sum(results[("llama.cpp", "peak")].values()), sum(peaks.values())
    )


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def print_table(title: str, columns: tuple[str, str], figures: dict) -> dict:
    """A markdown table of (a, b) figures with b / a; the same as a dict."""
    a_name, b_name = columns
    print(f"\n{title}\n\n| | {a_name} | {b_name} | {b_name} / {a_name} |\n|---|---|---|---|")
    out = {}
    for label, (a, b) in figures.items():
        ratio = b / a if a else float("nan")
        print(f"| {label} | {a:.1f} | {b:.1f} | {ratio:.2f} |")
        out[label] = {a_name: a, b_name: b, "ratio": ratio}
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama", type=Path, required=True)
    parser.add_argument("--tessera", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, required=True, help="the model, for both sides")
    parser.add_argument("--folder", type=Path,
                        help="the GGUF converted (an onnxruntime-genai folder): Tessera on it "
                             "against Tessera on the GGUF")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--server-threads", type=int, default=2)
    parser.add_argument("--split-memory", default="100MiB",
                        help="each of the two Tessera workers' memory (cuts the model in two)")
    parser.add_argument("--streams", default="1,4,8",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--skip", default="", help="one,folder,two,servers to leave out")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    args.gguf = args.gguf.resolve()
    if args.folder is not None:
        args.folder = args.folder.resolve()
        if not (args.folder / "model.onnx").is_file():
            print(f"no {args.folder}/model.onnx: the GGUF-vs-folder figure is left out",
                  file=sys.stderr)
            args.folder = None
    args.folder_figures = {}
    skip = set(filter(None, args.skip.split(",")))
    figures: dict[str, tuple[float, float]] = {}
    logs = Path(tempfile.mkdtemp(prefix="bench-llama-cpp-logs-"))
    # A build cache of this run's own: the first load of the GGUF builds its
    # graph, every later one (generate runs, the coordinator) reads it.
    cache = logs / "tessera-cache"
    os.environ["TESSERA_CACHE_DIR"] = str(cache)
    print(f"logs in {logs}", flush=True)
    steps = (("one", one_sequence), ("folder", gguf_vs_folder), ("two", two_processes),
             ("servers", servers))
    for name, step in steps:
        if name in skip or (name == "folder" and args.folder is None):
            continue
        print(f"{name}...", flush=True)
        step(args, figures) if name in ("one", "folder") else step(args, figures, logs)
    gguf_mb = args.gguf.stat().st_size / 1e6
    cache_mb = dir_mb(cache) if cache.is_dir() else 0.0
    # The logs stay; the built models go.
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(logs / "converted", ignore_errors=True)
    figures[f"model on disk, MB (Tessera: the GGUF and its build cache entry, {cache_mb:.1f})"] = (
        gguf_mb, gguf_mb + cache_mb
    )
    results = {"vs_llama_cpp": print_table("Tessera against llama.cpp, the same GGUF",
                                           ("llama.cpp", "Tessera"), figures)}
    if args.folder_figures:
        results["gguf_vs_folder"] = print_table(
            f"Tessera on the GGUF directly against the converted folder ({args.folder.name})",
            ("folder", "GGUF"), args.folder_figures)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
