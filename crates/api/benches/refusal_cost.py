#!/usr/bin/env python3
"""Server CPU per refused request: the edge's canned 503 against refusals made inside the app.

Starts the release `breakwater-api` once per variant, sends the same number of requests with the
same client, and divides the server's CPU time (utime + stime from /proc/<pid>/stat) by the
requests answered. Server CPU is counted, not wall time, so a busy machine changes little.

Variants (all GET /v1/conversations, the inbox):
  edge          MAX_CONNECTIONS=0: every connection is over the cap and gets the canned 503
  edge-reset    MAX_CONNECTIONS=0, MAX_REFUSING_CONNECTIONS=0: every connection is reset at accept
  app-new-conn  no token: a 401 from the auth layer, one new connection per request
                (hyper, admission, the router and the JWT check ran)
  app-keepalive no token: a 401 on kept-alive connections (no connection setup)

Usage: python3 crates/api/benches/refusal_cost.py [--requests N] [--concurrency C] [--binary PATH ...]
Needs DATABASE_URL (the API connects lazily; no query runs) and a release build:
  cargo build --release -p breakwater-api
"""

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

REQUEST = b"GET /v1/conversations HTTP/1.1\r\nhost: bench\r\n\r\n"
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[11], fields[12]: utime, stime (after the pid and comm fields).
    return (int(fields[11]) + int(fields[12])) / TICKS


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


async def new_connection_each(port, count, statuses):
    for _ in range(count):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionResetError:
            statuses.append("reset")
            continue
        try:
            writer.write(REQUEST)
            statuses.append(await read_response(reader))
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError):
            statuses.append("reset")
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionResetError:
            pass


async def keep_alive(port, count, statuses):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(count):
        writer.write(REQUEST)
        statuses.append(await read_response(reader))
    writer.close()
    await writer.wait_closed()


async def drive(port, requests, concurrency, fresh):
    statuses = []
    each = requests // concurrency
    worker = new_connection_each if fresh else keep_alive
    await asyncio.gather(*(worker(port, each, statuses) for _ in range(concurrency)))
    return statuses


def wait_ready(port, proc):
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"breakwater-api exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
                if s.recv(16).startswith(b"HTTP/1.1"):
                    return
        except ConnectionResetError:
            return  # listening, and resetting every connection (edge-reset)
        except OSError:
            time.sleep(0.1)
    sys.exit("breakwater-api did not answer /health within 30 s")


def run(binary, name, env_extra, fresh, args):
    port = free_port()
    env = dict(os.environ, BIND_ADDR=f"127.0.0.1:{port}", LOG_FORMAT="json", RUST_LOG="warn",
               THROTTLES="off", TOKIO_WORKER_THREADS="1", **env_extra)
    proc = subprocess.Popen([binary, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        # Warm up, then measure.
        asyncio.run(drive(port, args.concurrency * 20, args.concurrency, fresh))
        before = cpu_seconds(proc.pid)
        started = time.perf_counter()
        statuses = asyncio.run(drive(port, args.requests, args.concurrency, fresh))
        wall = time.perf_counter() - started
        used = cpu_seconds(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    kinds = sorted(set(map(str, statuses)))
    return {"variant": name, "requests": len(statuses), "statuses": kinds,
            "cpu_us_per_request": used / len(statuses) * 1e6, "req_per_s": len(statuses) / wall}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--binary", action="append",
                        help="the API binary (repeat to compare builds in one run; "
                        "default target/release/breakwater-api)")
    args = parser.parse_args()
    if "DATABASE_URL" not in os.environ:
        sys.exit("set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres)")
    variants = [
        ("edge", {"MAX_CONNECTIONS": "0"}, True),
        ("edge-reset", {"MAX_CONNECTIONS": "0", "MAX_REFUSING_CONNECTIONS": "0"}, True),
        ("app-new-conn", {}, True),
        ("app-keepalive", {}, False),
    ]
    binaries = args.binary or ["target/release/breakwater-api"]
    label = (lambda b, n: n) if len(binaries) == 1 else (lambda b, n: f"{os.path.basename(b)}:{n}")
    results = {label(b, name): [] for b in binaries for name, _, _ in variants}
    # Rounds interleave the variants so that drift in the machine's load hits them alike.
    for round_no in range(args.rounds):
        for binary in binaries:
            for name, env_extra, fresh in variants:
                r = run(binary, label(binary, name), env_extra, fresh, args)
                results[label(binary, name)].append(r)
                print(f"round {round_no + 1} {r['variant']:14} {r['requests']} requests, statuses {r['statuses']}, "
                      f"{r['cpu_us_per_request']:.1f} us server CPU each, {r['req_per_s']:.0f} req/s", flush=True)
    print("\nvariant          server CPU per request (median of rounds)")
    for name, rs in results.items():
        print(f"{name:40} {statistics.median(r['cpu_us_per_request'] for r in rs):6.1f} us")


if __name__ == "__main__":
    main()
