"""Throughput and ping latency through our Toxiproxy-compatible server vs direct loopback.

Runs in one go, on 127.0.0.1 only:
  * a sink/echo server in a child process,
  * our proxy server (``python -m chaos.toxiproxy``) in another child process,
  * the client here.
It moves a payload (64 MiB by default) client->server ("upload") and
server->client ("download") several times, alternating direct and proxied runs,
and takes medians; then it times 1 KiB request/response pings on both paths. Prints a table and writes JSON to
bench/out/proxy_throughput.json. The goal is proxy >= 0.5x direct throughput.

    python bench/proxy_throughput.py [--size-mib 64] [--reps 7] [--pings 2000]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.outputs import check_output, output_file  # noqa: E402
from trainer.argtypes import Parser  # noqa: E402

OUT = ROOT / "bench" / "out" / "proxy_throughput.json"
BUF = 4 << 20  # application read/write size; --chunk-kib changes it
PING_SIZE = 1024
HEADER = struct.Struct("!cQ")  # mode, byte count


def set_chunk(size: int) -> None:
    """Client buffer size; the sink child keeps the default."""
    global BUF
    BUF = size


def _recv_exact(sock: socket.socket, count: int, buf: bytearray) -> int:
    view = memoryview(buf)
    got = 0
    while got < count:
        n = sock.recv_into(view[: min(len(buf), count - got)])
        if n == 0:
            break
        got += n
    return got


def _send_count(sock: socket.socket, count: int, payload: memoryview) -> None:
    left = count
    while left > 0:
        step = min(left, len(payload))
        sock.sendall(payload[:step])
        left -= step


def _serve_one(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(BUF)
    payload = memoryview(bytes(BUF))
    try:
        header = bytearray(HEADER.size)
        if _recv_exact(conn, HEADER.size, header) < HEADER.size:
            return
        mode, count = HEADER.unpack(header)
        if mode == b"U":
            got = _recv_exact(conn, count, buf)
            conn.sendall(b"K" if got == count else b"E")
        elif mode == b"D":
            _send_count(conn, count, payload)
            _recv_exact(conn, 1, buf)  # wait for the client's ack before closing
        elif mode == b"P":
            msg = bytearray(PING_SIZE)
            for _ in range(count):
                if _recv_exact(conn, PING_SIZE, msg) < PING_SIZE:
                    break
                conn.sendall(msg)
    except OSError:
        pass
    finally:
        conn.close()


def sink_main(port_queue: Any) -> None:
    """Child process: a tiny server for the three modes, one thread per connection."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port_queue.put(listener.getsockname()[1])
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def upload(port: int, size: int) -> float:
    payload = memoryview(bytes(BUF))
    with _connect(port) as sock:
        start = time.perf_counter()
        sock.sendall(HEADER.pack(b"U", size))
        _send_count(sock, size, payload)
        ack = sock.recv(1)
        elapsed = time.perf_counter() - start
    if ack != b"K":
        raise RuntimeError(f"upload failed (ack {ack!r})")
    return size / elapsed / 1e6


def download(port: int, size: int) -> float:
    buf = bytearray(BUF)
    with _connect(port) as sock:
        start = time.perf_counter()
        sock.sendall(HEADER.pack(b"D", size))
        got = _recv_exact(sock, size, buf)
        elapsed = time.perf_counter() - start
        sock.sendall(b"K")
    if got != size:
        raise RuntimeError(f"download short: {got} of {size}")
    return size / elapsed / 1e6


def ping(port: int, count: int) -> list[float]:
    msg = os.urandom(PING_SIZE)
    buf = bytearray(PING_SIZE)
    times = []
    with _connect(port) as sock:
        sock.sendall(HEADER.pack(b"P", count))
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(msg)
            if _recv_exact(sock, PING_SIZE, buf) < PING_SIZE:
                raise RuntimeError("ping connection closed")
            times.append((time.perf_counter() - start) * 1e6)
    return times


def start_proxy_server() -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.toxiproxy", "--port", "0", "--log-level", "WARNING"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 20
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "listening on" in line:
            return proc, line.strip().rsplit(" ", 1)[1]
    proc.kill()
    raise RuntimeError("proxy server did not start")


def stop_proxy_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def summarize(ups: list[float], downs: list[float], ping_us: list[float]) -> dict[str, Any]:
    ping_us = sorted(ping_us)
    return {
        "upload_mb_s": ups,
        "download_mb_s": downs,
        "upload_median_mb_s": statistics.median(ups),
        "download_median_mb_s": statistics.median(downs),
        "ping_median_us": statistics.median(ping_us),
        "ping_p99_us": ping_us[min(len(ping_us) - 1, int(len(ping_us) * 0.99))],
    }


def measure(direct_port: int, proxy_port: int, size: int, reps: int,
            pings: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    """Alternate direct and proxied runs so load changes on a shared machine hit both alike."""
    runs: dict[str, dict[str, list[float]]] = {
        path: {"up": [], "down": []} for path in ("direct", "proxy")}
    ratios: dict[str, list[float]] = {"up": [], "down": []}
    for _ in range(reps):
        for kind, func in (("up", upload), ("down", download)):
            direct_rate = func(direct_port, size)
            proxy_rate = func(proxy_port, size)
            runs["direct"][kind].append(direct_rate)
            runs["proxy"][kind].append(proxy_rate)
            ratios[kind].append(proxy_rate / direct_rate)
    direct_ping = ping(direct_port, pings)
    proxy_ping = ping(proxy_port, pings)
    direct = summarize(runs["direct"]["up"], runs["direct"]["down"], direct_ping)
    proxied = summarize(runs["proxy"]["up"], runs["proxy"]["down"], proxy_ping)
    return direct, proxied, {kind: statistics.median(values) for kind, values in ratios.items()}


def plot(result: dict, path: Path) -> None:
    """Each repetition's throughput, direct and through the proxy, and the ping latencies."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 2]})
    groups = [("upload", "upload_mb_s"), ("download", "download_mb_s")]
    for k, (label, key) in enumerate(groups):
        for j, (path_name, color) in enumerate((("direct", "tab:gray"), ("proxy", "tab:blue"))):
            values = result[path_name][key]
            x = k * 3 + j
            ax_t.scatter([x] * len(values), values, color=color, alpha=0.6, s=18,
                         label=path_name if k == 0 else None)
            ax_t.hlines(result[path_name][f"{key.replace('_mb_s', '')}_median_mb_s"], x - 0.3, x + 0.3, color=color)
        ratio = result[f"ratio_{label}"]
        ax_t.annotate(f"{ratio:.2f}x", (k * 3 + 0.5, result["proxy"][f"{label}_median_mb_s"]),
                      textcoords="offset points", xytext=(0, -18), ha="center")
    ax_t.set_xticks([0.5, 3.5], ["upload", "download"])
    ax_t.set_ylabel("MB/s")
    ax_t.set_ylim(bottom=0)
    ax_t.set_title(f"{result['payload_bytes'] >> 20} MiB payloads, {result['repetitions']} repetitions (lines: medians)")
    ax_t.legend(loc="lower right")
    names = ["direct", "proxy"]
    for j, (q, key) in enumerate((("p50", "ping_median_us"), ("p99", "ping_p99_us"))):
        ax_p.bar([i + j * 0.4 for i in range(2)], [result[n][key] for n in names], width=0.4, label=q)
    ax_p.set_xticks([0.2, 1.2], names)
    ax_p.set_ylabel("µs")
    ax_p.set_title(f"{result['pings']} pings of 1 KiB, round trip")
    ax_p.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, facecolor="white")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=64,
                        help="MiB moved per upload and per download, on each path")
    parser.add_argument("--reps", type=int, default=7,
                        help="uploads and downloads per path, direct and proxied alternated; medians reported")
    parser.add_argument("--pings", type=int, default=2000,
                        help="1 KiB request/response round trips timed per path (median and p99 in us)")
    parser.add_argument("--chunk-kib", type=int, default=BUF >> 10,
                        help="client read/write size (default 4096 KiB: the fastest direct path)")
    parser.add_argument("--out", type=output_file, default=OUT,
                        help="the JSON written; the plot goes beside it (the same name, .png)")
    args = parser.parse_args(argv)
    check_output(parser, "--out", args.out.with_suffix(".png"))
    set_chunk(args.chunk_kib << 10)
    size = args.size_mib << 20

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    sink = ctx.Process(target=sink_main, args=(queue,), daemon=True)
    sink.start()
    sink_port = queue.get(timeout=20)
    proc, url = start_proxy_server()
    try:
        created = requests.post(f"{url}/proxies", timeout=10, json={
            "name": "bench", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{sink_port}"})
        created.raise_for_status()
        proxy_port = int(created.json()["listen"].rsplit(":", 1)[1])
        # Warm up both paths, then alternate so drift hits both equally.
        upload(sink_port, 8 << 20)
        upload(proxy_port, 8 << 20)
        direct, proxied, paired = measure(sink_port, proxy_port, size, args.reps, args.pings)
    finally:
        stop_proxy_server(proc)
        sink.terminate()
        sink.join(5)

    ratio_up = proxied["upload_median_mb_s"] / direct["upload_median_mb_s"]
    ratio_down = proxied["download_median_mb_s"] / direct["download_median_mb_s"]
    load = os.getloadavg()[0]
    result = {
        "payload_bytes": size,
        "client_chunk_bytes": BUF,
        "repetitions": args.reps,
        "pings": args.pings,
        "direct": direct,
        "proxy": proxied,
        "ratio_upload": ratio_up,
        "ratio_download": ratio_down,
        "paired_ratio_upload_median": paired["up"],
        "paired_ratio_download_median": paired["down"],
        "load_average_1m": load,
        "goal_ratio": 0.5,
        "meets_goal": min(ratio_up, ratio_down) >= 0.5,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "kernel": platform.release()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    png = args.out.with_suffix(".png")
    plot(result, png)

    print(f"payload {args.size_mib} MiB x {args.reps} reps (median), client chunk {BUF >> 10} KiB, "
          f"{args.pings} x 1 KiB pings")
    print(f"{'path':<8} {'upload MB/s':>12} {'download MB/s':>14} {'ping p50 us':>12} {'ping p99 us':>12}")
    for name, row in (("direct", direct), ("proxy", proxied)):
        print(f"{name:<8} {row['upload_median_mb_s']:>12.0f} {row['download_median_mb_s']:>14.0f} "
              f"{row['ping_median_us']:>12.0f} {row['ping_p99_us']:>12.0f}")
    print(f"{'ratio':<8} {ratio_up:>12.2f} {ratio_down:>14.2f}   (median of medians)")
    print(f"{'paired':<8} {paired['up']:>12.2f} {paired['down']:>14.2f}   (median of per-run ratios)")
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs (other work skews both paths)")
    print(f"goal >= 0.5x direct: {'met' if result['meets_goal'] else 'NOT met'}; wrote {args.out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
