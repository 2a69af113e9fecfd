"""Peer catch-up cost (issue 30): two rl-worker processes on one model; the sender streams its
weights to the receiver (Admin.SendWeightsToPeer) while a greedy decode runs on the sender.
Prints, in one run: the send time and throughput (median of --rounds), and the sender's decode
inter-token gaps undisturbed and during the sends (p50 / max), so the stall the sliced copy adds
is read beside the undisturbed figure. CPU backend; figures depend on the machine and its load.

  .venv/bin/python bench/peer/peer_send.py --model DIR [--rounds 3]
"""

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "tests" / "testing")]

import grpc  # noqa: E402

from rlfleet import Client  # noqa: E402
from rlfleet.proto import admin_pb2  # noqa: E402
from rlfleet._stubs import admin_pb2_grpc  # noqa: E402
from rltest import start_worker  # noqa: E402


def gaps_while(worker, stop, out):
    """Streams greedy decodes on `worker` until `stop`, appending (time, gap) per token."""
    c = Client(worker.address, timeout=600, via="worker")
    while not stop.is_set():
        last = time.monotonic()
        for part in c.generate_stream(text="Once upon a time", stream=True, temperature=0.0,
                                      max_new_tokens=64, ignore_eos=True):
            now = time.monotonic()
            out.append((now, now - last))
            last = now
            if stop.is_set():
                break


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    sender = start_worker("--kv-cache-gb", "0.2", model=a.model)
    receiver = start_worker("--kv-cache-gb", "0.2", model=a.model)
    try:
        stub = admin_pb2_grpc.AdminStub(grpc.insecure_channel(sender.address))
        gaps, stop = [], threading.Event()
        t = threading.Thread(target=gaps_while, args=(sender, stop, gaps))
        t.start()
        time.sleep(10)  # undisturbed decode
        windows, times, sent = [], [], 0
        for _ in range(a.rounds):
            start = time.monotonic()
            r = stub.SendWeightsToPeer(admin_pb2.SendWeightsToPeerRequest(
                target=receiver.address, weight_version=0), timeout=600)
            end = time.monotonic()
            windows.append((start, end))
            times.append(end - start)
            sent = int(r.message.split(" tensors, ")[1].split(" bytes")[0])
            time.sleep(3)
        stop.set()
        t.join()
        during = [g for (ts, g) in gaps if any(s <= ts <= e for s, e in windows)]
        before = [g for (ts, g) in gaps if ts < windows[0][0]]
        med = statistics.median(times)
        print(f"model {a.model}: {sent / 2**20:.0f} MiB sent per round, {a.rounds} rounds")
        print(f"send time: median {med:.2f} s ({sent / 2**20 / med:.0f} MiB/s), "
              f"all {[round(x, 2) for x in times]}")
        for name, g in (("undisturbed", before), ("during sends", during)):
            if g:
                g = sorted(g)
                print(f"sender decode gap {name}: p50 {1e3 * statistics.median(g):.0f} ms, "
                      f"max {1e3 * g[-1]:.0f} ms ({len(g)} tokens)")
    finally:
        sender.stop()
        receiver.stop()


if __name__ == "__main__":
    main()
