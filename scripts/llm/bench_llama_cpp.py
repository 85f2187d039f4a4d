#!/usr/bin/env python3
"""Tessera against llama.cpp on the same GGUF, ratios from one run.

    bench_llama_cpp.py --llama DIR --tessera DIR --gguf MODEL.gguf --folder FOLDER
        [--threads 1] [--server-threads 2] [--streams 1,4,8] [--skip WHAT,...]

DIR are folders of binaries: llama.cpp's llama-bench, llama-server and
ggml-rpc-server (scripts/bench-llama-cpp.sh builds them), Tessera's
tessera, coordinator and worker. FOLDER is the converted GGUF
(scripts/llm/convert_gguf.py). Measured, each on the same weights, threads
and prompts, one after the other:

- one sequence: tokens/s after the first (llama-bench tg64 against
  `tessera generate --workers 1`), best of three runs each;
- two processes: llama.cpp RPC (two ggml-rpc-servers, every layer on them)
  against two Tessera workers cut by memory;
- OpenAI servers (llama-server with one slot per stream; a coordinator and
  one worker with `max_sequences` = the largest stream count) at 1, 4 and 8
  streams: each stream sends completions of a 128-token prompt, 64 new
  tokens, greedy, streamed; time to the first token, inter-token latency,
  output tokens/s over all streams;
- peak memory (VmHWM) of every process of each side.

Prints one table of figures and ratios (Tessera / llama.cpp); --json FILE
writes them too.
"""

from __future__ import annotations

import argparse
import json
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
        self.files: list = []
        self.logs = logs

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")
        self.files.append(log)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def peak_mib(self) -> float:
        return sum(peak_kib(p.pid) for p in self.procs) / 1024

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()
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


def llama_bench(args, extra: list[str], threads: int) -> float:
    """llama-bench tg64 tokens/s (mean over its repetitions)."""
    cmd = [str(args.llama / "llama-bench"), "-m", str(args.gguf), "-t", str(threads),
           "-p", "0", "-n", str(NEW_TOKENS), "-r", str(RUNS), "-o", "json", *extra]
    out, _ = run_child(cmd)
    rows = json.loads(out)
    return max(float(r["avg_ts"]) for r in rows)


def tessera_generate(args, workers: int, memory: str | None) -> tuple[float, int]:
    """`tessera generate` tokens/s after the first (best of RUNS) and the
    hosts its plan spans."""
    cmd = [str(args.tessera / "tessera"), "generate", str(args.folder), "--prompt", PROMPT,
           "--max-tokens", str(NEW_TOKENS), "--workers", str(workers),
           "--threads", str(args.threads), "--context", "512"]
    if memory:
        cmd += ["--worker-memory", memory]
    rates, hosts = [], 0
    for _ in range(RUNS):
        _, err = run_child(cmd)
        found = re.search(r"([0-9.]+) tokens/s after it", err)
        if not found:
            raise RuntimeError(f"no tokens/s in tessera generate's output:\n{err[-2000:]}")
        rates.append(float(found.group(1)))
        hosts = len(set(re.findall(r"subgraph\d+ on ([^/]+)/", err)))
    return max(rates), hosts


def one_sequence(args, figures: dict) -> None:
    figures["one sequence, tokens/s"] = (
        llama_bench(args, [], args.threads), tessera_generate(args, 1, None)[0]
    )


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
    port = free_port()
    services.start("llama-server", [
        str(args.llama / "llama-server"), "-m", str(args.gguf), "-t", str(args.server_threads),
        "-tb", str(args.server_threads), "-c", str(1024 * slots), "-np", str(slots), "-cb",
        "--host", "127.0.0.1", "--port", str(port), "--no-webui",
    ])
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/health")
    return base


def tessera_server(args, services: Services, slots: int, work: Path) -> str:
    tessera = str(args.tessera / "tessera")
    certs = work / "certs"
    subprocess.run([tessera, "certs", "init", "--dir", str(certs), "--cluster", "bench",
                    "--nodes", "coordinator,node-a"], check=True, stdout=subprocess.DEVNULL)
    quic, http = free_port(), free_port()
    (work / "cluster.toml").write_text(
        f'cluster = "bench"\nlisten = "127.0.0.1:{quic}"\ncerts = "{certs}"\n'
        f'http_listen = "127.0.0.1:{http}"\n\n[models.smollm2]\npath = "{args.folder}"\n'
        f"context = 1024\nmax_sequences = {slots}\n"
    )
    services.start("coordinator", [str(args.tessera / "coordinator"), "--config",
                                   str(work / "cluster.toml")])
    time.sleep(1)
    services.start("worker", [
        str(args.tessera / "worker"), "--devices", "CPU", "--name", "node-a", "--coordinator",
        f"127.0.0.1:{quic}", "--certs", str(certs), "--cluster", "bench",
        "--threads", str(args.server_threads), "--cache-dir", str(work / "cache"),
    ])
    base = f"http://127.0.0.1:{http}"
    wait_http(f"{base}/v2/health/ready")
    return base


def servers(args, figures: dict, logs: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.folder / "tokenizer.json"))
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
            results[(side, "peak")] = services.peak_mib()
        finally:
            services.stop()
            shutil.rmtree(work, ignore_errors=True)
    for streams in args.streams:
        llama, ours = results[("llama.cpp", streams)], results[("tessera", streams)]
        for key, label in (("tokens_per_s", "output tokens/s"), ("itl_ms", "inter-token ms"),
                           ("ttft_ms", "first token ms")):
            figures[f"server, {streams} stream(s): {label}"] = (llama[key], ours[key])
    figures["server peak memory, MiB (all processes)"] = (
        results[("llama.cpp", "peak")], results[("tessera", "peak")]
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama", type=Path, required=True)
    parser.add_argument("--tessera", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--server-threads", type=int, default=2)
    parser.add_argument("--split-memory", default="100MiB",
                        help="each of the two Tessera workers' memory (cuts the model in two)")
    parser.add_argument("--streams", default="1,4,8",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--skip", default="", help="one,two,servers to leave out")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    args.folder, args.gguf = args.folder.resolve(), args.gguf.resolve()
    skip = set(filter(None, args.skip.split(",")))
    figures: dict[str, tuple[float, float]] = {}
    logs = Path(tempfile.mkdtemp(prefix="bench-llama-cpp-logs-"))
    print(f"logs in {logs}", flush=True)
    steps = (("one", one_sequence), ("two", two_processes), ("servers", servers))
    for name, step in steps:
        if name in skip:
            continue
        print(f"{name}...", flush=True)
        step(args, figures) if name == "one" else step(args, figures, logs)
    gguf_mb = args.gguf.stat().st_size / 1e6
    folder_mb = sum(f.stat().st_size for f in args.folder.iterdir() if f.is_file()) / 1e6
    figures["model on disk, MB"] = (gguf_mb, folder_mb)
    print("\n| | llama.cpp | Tessera | Tessera / llama.cpp |\n|---|---|---|---|")
    for label, (llama, ours) in figures.items():
        print(f"| {label} | {llama:.1f} | {ours:.1f} | {ours / llama:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({k: list(v) for k, v in figures.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
