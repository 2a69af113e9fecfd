"""In-memory weight push throughput from Python, next to the C++ sender, on the same tensors, in
one run: real rl-worker processes (and an rl-router) on loopback, the model's tensors held in
this process's memory (bf16 as raw uint16: what a trainer's state dict holds).

Per round, in turn:
  stream/worker   Client.update_weights_from_tensor straight to one worker (tensor stream)
  stream/router   the same through the router (the router fans the stream out to every worker)
  tcp/python      WeightsGroup.receive_weights through the router: the Python sender (rank 0)
                  broadcasts bucket by bucket to every worker
  tcp/c++         the same ReceiveWeights call, with rl-weight-sender (C++, reading the same
                  checkpoint into memory first) as rank 0
Each line gives the end-to-end seconds of the call (the workers apply the weights too) and, for
the tcp senders, the broadcast alone (the sender's own clock: checksums, sends, acks). GB/s is
the model's bytes over those seconds; medians over --rounds.

  .venv/bin/python bench/clients/push_bench.py [--model DIR] [--workers 1] [--rounds 3]
      [--bucket-mb 512] [--chunk-mb 16] [--build build]

Without --model it makes (once) the 0.5B-class Llama of the README's figures with
`rlctl make-model --arch llama --size 0.5b --seed 1` into BUILD/bench-models/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))

import rltest  # noqa: E402  (process helpers)
from rlfleet import Client, read_safetensors  # noqa: E402  (the venv's: scripts/venv)
from rlfleet.weight_sync import plan_buckets  # noqa: E402
from rlfleet.tensors import iter_named_tensors  # noqa: E402


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_model(build: Path) -> Path:
    out = build / "bench-models" / "llama-0.5b"
    if not (out / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(build / "bin" / "rlctl"), "make-model", "--arch", "llama", "--size",
                        "0.5b", "--seed", "1", "--out", str(out)], check=True)
    return out


def cxx_sender_round(build: Path, client: Client, model: Path, world: int, bucket_mb: float,
                     group: str) -> tuple[float, float]:
    """rl-weight-sender as rank 0 of a fresh group; ReceiveWeights through the router. Returns
    (end-to-end seconds of the call, the sender's own broadcast seconds)."""
    sender = [str(build / "bin" / "rl-weight-sender"), "--checkpoint", str(model),
              "--bucket-mb", str(bucket_mb), "--group-name", group, "--timeout-s", "300",
              "--log-level", "warn"]
    plan = subprocess.run(sender + ["--plan-only"], capture_output=True, text=True, check=True)
    buckets = []
    for line in plan.stdout.splitlines():
        b = json.loads(line)
        buckets.append((b["names"], b["dtypes"], b["shapes"]))
    proc = subprocess.Popen(sender + ["--listen", "127.0.0.1:0", "--world-size", str(world)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline()
        if not ready.startswith("listening on "):
            raise RuntimeError(f"rl-weight-sender: {ready!r} {proc.stderr.read()}")
        port = int(ready.rsplit(":", 1)[1])
        client.init_weights_update_group("127.0.0.1", port, 1, world, group, backend="tcp")
        # The sender prints a bucket line as it starts each broadcast; drain them.
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        t0 = time.monotonic()
        client.receive_weights(group, buckets)
        e2e = time.monotonic() - t0
        proc.wait(timeout=300)
        reader.join(30)
        done = json.loads(lines[-1])
        if proc.returncode != 0 or not done.get("done"):
            raise RuntimeError(f"rl-weight-sender failed: {proc.stderr.read()}")
        return e2e, float(done["seconds"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        client.destroy_weights_update_group(group)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--model")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=512)
    ap.add_argument("--chunk-mb", type=float, default=16)
    a = ap.parse_args()
    if not 1 <= a.workers <= 8 or not 1 <= a.rounds <= 50:
        ap.error("--workers in [1, 8], --rounds in [1, 50]")
    build = Path(a.build)
    os.environ["RL_BUILD_DIR"] = str(build)
    rltest.BIN = build / "bin"
    model = Path(a.model) if a.model else make_model(build)
    ck = read_safetensors(model)
    tensors = {n: ck[n] for n in ck}  # in memory from here on
    nbytes = sum(p.nbytes for p in iter_named_tensors(tensors))
    bucket_bytes = int(a.bucket_mb * (1 << 20))
    chunk_bytes = int(a.chunk_mb * (1 << 20))
    print(f"model {model.name}: {len(tensors)} tensors, {nbytes / 1e9:.3f} GB; "
          f"{a.workers} worker(s); bucket {a.bucket_mb:g} MiB, stream chunk {a.chunk_mb:g} MiB; "
          f"CPU {cpu_name()} ({os.cpu_count()} cores); load before {os.getloadavg()}",
          flush=True)
    fleet = rltest.Fleet(a.workers, "--kv-cache-gb", "0.1", model=model,
                         router_args=["--admin-load-timeout-ms", "600000"])
    results: dict[str, list[float]] = {k: [] for k in (
        "stream/worker", "stream/router", "tcp/python", "tcp/python broadcast", "tcp/c++",
        "tcp/c++ broadcast")}
    try:
        client = Client(fleet.address, load_timeout=900)
        direct = Client(fleet.workers[0].address, via="worker", load_timeout=900)
        world = a.workers + 1
        group = client.open_weights_group("bench-py", timeout=120)
        try:
            for r in range(a.rounds):
                t0 = time.monotonic()
                direct.update_weights_from_tensor(tensors, chunk_bytes=chunk_bytes)
                results["stream/worker"].append(time.monotonic() - t0)
                t0 = time.monotonic()
                client.update_weights_from_tensor(tensors, chunk_bytes=chunk_bytes)
                results["stream/router"].append(time.monotonic() - t0)
                buckets = plan_buckets(iter_named_tensors(tensors), bucket_bytes)
                sent = []
                orig = group.sender.broadcast

                def timed(b, _orig=orig, _sent=sent):
                    s = _orig(b)
                    _sent.append(s.seconds)
                    return s

                group.sender.broadcast = timed  # type: ignore[method-assign]
                t0 = time.monotonic()
                group.receive_weights(tensors, bucket_bytes=bucket_bytes)
                results["tcp/python"].append(time.monotonic() - t0)
                results["tcp/python broadcast"].append(sum(sent))
                group.sender.broadcast = orig  # type: ignore[method-assign]
                assert len(sent) == len(buckets)
                e2e, bcast = cxx_sender_round(build, client, model, world, a.bucket_mb,
                                              f"bench-cxx-{r}")
                results["tcp/c++"].append(e2e)
                results["tcp/c++ broadcast"].append(bcast)
                print(f"round {r + 1}: " + ", ".join(
                    f"{k} {v[-1]:.3f} s" for k, v in results.items()), flush=True)
        finally:
            group.close()
    finally:
        fleet.stop()
    print(f"\nmedians over {a.rounds} rounds ({nbytes / 1e9:.3f} GB to {a.workers} "
          f"worker(s); GB/s = model bytes / seconds):")
    for k, v in results.items():
        med = statistics.median(v)
        print(f"  {k:22s} {med:7.3f} s  {nbytes / med / 1e9:6.2f} GB/s   "
              f"(min {min(v):.3f} s, max {max(v):.3f} s)")
    print(f"load after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
