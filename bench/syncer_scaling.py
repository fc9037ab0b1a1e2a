"""Syncer scaling: merge time and syncer memory as the number of learners grows.

For each model size (--sizes) and each N in --ns (1, 2, 4, ... 64) a real syncer process
is started (`python -m trainer syncer --learners N`, its own state dir and address file)
and N lightweight simulated learners ("pushers"), threads of this process, speak the
real protocol to it over real TCP sockets through trainer.link.Link and trainer.wire:
HELLO (the WELCOME gives the fragments and the config, hence the shapes), a HEARTBEAT
every --heartbeat-interval while idle, and every round one PUSH of fragment 0 carrying a
real encoded pseudo-gradient (random, trainer.codec.encode, the config's encoding) with
the header a learner sends. Like a learner, each pusher then waits for the version that
contains its push (heartbeats: BEAT carries the versions) and PULLs it (--no-pull skips
that). A round starts when every pusher has the new version; --warmup rounds are not
counted.

Measured, from the syncer's own events: merge seconds (the `merge` event's `seconds`:
outer step plus the durable write of the fragment; the write alone from `state_write`),
first push of a round -> its merge, last push -> merge; and from this side the round
time (release of the round -> every pusher holds the merged version). Memory: the
syncer's VmRSS from /proc (sampled every 50 ms; after start-up, the median at the end of
the rounds, the peak sampled) and its VmHWM at the end.

The syncer runs with --grace (default 60 s) so that every merge waits for all N pushes
(quorum 0 = every live learner): one merge per round of exactly N contributions, whatever
the time the N pushes take to arrive; and with --heartbeat-timeout 10 s, so that a pusher
thread delayed by this process's GIL is not declared dead (heartbeat_lost is counted and
reported).

Prints a table, writes bench/out/syncer_scaling.json and bench/out/syncer_scaling.png.

    python bench/syncer_scaling.py [--ns 1,2,4,8,16,32,64] [--sizes small,default] [--rounds 5] [--quick]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.outputs import check_output, output_dir, output_file  # noqa: E402
from trainer.argtypes import Parser, DescriptionFormatter  # noqa: E402

OUT = ROOT / "bench" / "out" / "syncer_scaling.json"
SIZES = {
    "small": ["--n-layer", "1", "--n-embd", "32", "--n-head", "2"],
    "default": [],  # the trainer's default model (4 layers, d=128): about 0.84M parameters
}
COMMON = ["--batch-size", "8", "--sync-every", "10"]
START_TIMEOUT = 120.0
ROUND_TIMEOUT = 300.0


# ----------------------------------------------------------------------------- pure helpers
def parse_ns(text: str) -> list[int]:
    ns = [int(x) for x in text.split(",") if x.strip()]
    if not ns or any(n < 1 for n in ns):
        raise ValueError(f"--ns: expected a comma-separated list of integers >= 1, got {text!r}")
    return sorted(set(ns))


def parse_sizes(text: str) -> list[str]:
    sizes = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if not sizes or unknown:
        raise ValueError(f"--sizes: expected names among {', '.join(SIZES)}, got {text!r}")
    return sizes


def vm_kib(status_text: str, key: str) -> int | None:
    """A `VmRSS:  1234 kB` style field of /proc/<pid>/status, in KiB (None if absent)."""
    for line in status_text.splitlines():
        if line.startswith(key + ":"):
            parts = line.split()
            return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def read_vm(pid: int) -> dict[str, int | None]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {"VmRSS": None, "VmHWM": None}
    return {"VmRSS": vm_kib(text, "VmRSS"), "VmHWM": vm_kib(text, "VmHWM")}


def push_header(learner: int, incarnation: int, seq: int, base_version: int, tokens: int, steps: int,
                position: int, encoding: str, fragment: int = 0) -> dict:
    """The header fields of a learner's PUSH (trainer/learner.py, _send_push)."""
    return {"learner": learner, "incarnation": incarnation, "seq": seq, "fragment": fragment,
            "base_version": base_version, "tokens": tokens, "steps": steps, "position": position,
            "encoding": encoding}


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def med(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return percentile(v, 50) if v else None


def p90(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return percentile(v, 90) if v else None


def merge_rows(events: Iterable[dict], fragment: int = 0) -> list[dict]:
    """One row per (non-final) merge of a fragment, from the syncer's events, in version order."""
    events = list(events)
    accepted = {e["id"]: e["t"] for e in events if e["kind"] == "push_accepted"}
    writes = {e["version"]: e["seconds"] for e in events
              if e["kind"] == "state_write" and e.get("what") == f"fragment-{fragment}" and "version" in e}
    rows = []
    for m in events:
        if m["kind"] != "merge" or m.get("fragment") != fragment or m.get("reason") == "final":
            continue
        times = [accepted[c["id"]] for c in m["contributors"] if c["id"] in accepted]
        rows.append({
            "version": m["version"], "reason": m.get("reason"), "contributors": len(m["contributors"]),
            "seconds": m["seconds"], "write_seconds": writes.get(m["version"]),
            "first_push_to_merge": m["t"] - min(times) if times else None,
            "last_push_to_merge": m["t"] - max(times) if times else None,
            "t": m["t"],
        })
    return sorted(rows, key=lambda r: r["version"])


def summarize_point(size: str, params: int, n: int, merges: list[dict], rounds: list[dict], warmup: int,
                    vm: dict, events: list[dict]) -> dict:
    """One (size, N) point of the curve from its measured merges and rounds."""
    counted = [m for m in merges if m["version"] > warmup]
    compute = [m["seconds"] - m["write_seconds"] for m in counted if m["write_seconds"] is not None]
    measured_rounds = [r for r in rounds if r["round"] > warmup]
    mib = (lambda kib: None if kib is None else round(kib / 1024, 1))
    return {
        "size": size, "params": params, "n": n, "rounds": len(measured_rounds), "merges": len(counted),
        "partial_merges": sum(1 for m in counted if m["contributors"] != n),
        "merge_s_median": med(m["seconds"] for m in counted), "merge_s_p90": p90(m["seconds"] for m in counted),
        "merge_compute_s_median": med(compute), "merge_write_s_median": med(m["write_seconds"] for m in counted),
        "first_push_to_merge_s_median": med(m["first_push_to_merge"] for m in counted),
        "last_push_to_merge_s_median": med(m["last_push_to_merge"] for m in counted),
        "round_s_median": med(r["seconds"] for r in measured_rounds),
        "rss_start_mib": mib(vm.get("start")), "rss_end_of_round_mib": mib(med(vm.get("end_of_round", []))),
        "rss_peak_sampled_mib": mib(vm.get("peak")), "hwm_mib": mib(vm.get("hwm")),
        "heartbeats_lost": sum(1 for e in events if e["kind"] == "heartbeat_lost"),
        "frames_rejected": sum(1 for e in events if e["kind"] == "frame_rejected"),
        "pushes_dropped": sum(1 for e in events if e["kind"] == "push_dropped"),
    }


def format_table(points: list[dict]) -> str:
    def f(x, spec=".3f"):
        return format(x, spec) if x is not None else "-"

    head = (f"{'size':<8} {'params':>8} {'N':>3} {'merge s':>8} {'p90':>8} {'write s':>8} {'1st push':>9} "
            f"{'last push':>9} {'round s':>8} {'RSS MiB':>8} {'peak':>7} {'HWM':>7}  notes")
    lines = [head, f"{'':<8} {'':>8} {'':>3} {'median':>8} {'':>8} {'median':>8} {'->merge':>9} {'->merge':>9}"]
    for p in points:
        notes = []
        if p["partial_merges"]:
            notes.append(f"{p['partial_merges']} partial merges")
        if p["heartbeats_lost"]:
            notes.append(f"{p['heartbeats_lost']} heartbeats lost")
        if p["frames_rejected"] or p["pushes_dropped"]:
            notes.append(f"{p['frames_rejected']} rejected, {p['pushes_dropped']} dropped")
        lines.append(
            f"{p['size']:<8} {p['params']:>8} {p['n']:>3} {f(p['merge_s_median']):>8} {f(p['merge_s_p90']):>8} "
            f"{f(p['merge_write_s_median']):>8} {f(p['first_push_to_merge_s_median']):>9} "
            f"{f(p['last_push_to_merge_s_median']):>9} {f(p['round_s_median']):>8} "
            f"{f(p['rss_end_of_round_mib'], '.0f'):>8} {f(p['rss_peak_sampled_mib'], '.0f'):>7} "
            f"{f(p['hwm_mib'], '.0f'):>7}  {'; '.join(notes)}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the pushers
@dataclass
class Conductor:
    """Releases rounds to the pusher threads and collects what they report."""
    cond: threading.Condition = field(default_factory=threading.Condition)
    round: int = 0
    stop: bool = False
    done: dict[int, list[dict]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class Pusher:
    """One simulated learner: a real Link, real frames, no model and no training."""

    def __init__(self, learner: int, address, secret: bytes, heartbeat_interval: float, request_timeout: float,
                 pull: bool) -> None:
        from trainer.events import EventLog
        from trainer.link import Link

        self.learner = learner
        self.stop = threading.Event()
        self.link = Link(address, secret, learner, "decoupled", EventLog(None, f"pusher-{learner}", learner),
                         request_timeout, self.stop)
        self.heartbeat_interval = heartbeat_interval
        self.pull = pull
        self.seq = 0
        self.version = 0
        self.payload = b""
        self.tokens = self.steps = 0
        self.encoding = "fp32"

    def hello(self) -> dict:
        welcome = self.link.connect(want_params=False, budget=60.0)
        self.incarnation = int(welcome.header["incarnation"])
        self.version = int(welcome.header["versions"][0])
        return welcome.header

    def prepare(self, shapes: dict, names: list[str], encoding: str, tokens: int, steps: int, seed: int) -> None:
        """A random pseudo-gradient of fragment 0, encoded once: the bytes of every PUSH of this pusher."""
        import torch

        from trainer.codec import encode
        from trainer.wire import pack_tensors

        g = torch.Generator().manual_seed(seed)
        delta = {n: torch.randn(shapes[n], generator=g) * 1e-3 for n in names}
        self.payload = pack_tensors(encode(delta, encoding))
        self.encoding, self.tokens, self.steps = encoding, tokens, steps

    def _versions(self, frame) -> None:
        versions = frame.header.get("versions")
        if versions:
            self.version = max(self.version, int(versions[0]))

    def heartbeat(self) -> None:
        from trainer import wire
        self._versions(self.link.request(wire.message(wire.HEARTBEAT, {})))

    def one_round(self) -> dict:
        from trainer import wire

        self.seq += 1
        header = push_header(self.learner, self.incarnation, self.seq, self.version, self.tokens, self.steps,
                             self.seq * self.steps, self.encoding)
        started = time.monotonic()
        frame = wire.message(wire.PUSH, header, payload=self.payload)
        ack = self.link.request(frame)
        acked = time.monotonic()
        status = ack.header.get("status")
        self._versions(ack)
        target = int(ack.header["version"]) + 1 if status == "accepted" else int(ack.header["version"])
        while self.version < target:
            self.stop.wait(self.heartbeat_interval)
            self.heartbeat()
        seen = time.monotonic()
        pulled = None
        if self.pull:
            reply = self.link.request(wire.message(wire.PULL, {"fragment": 0}))
            pulled = time.monotonic()
            self.version = max(self.version, int(reply.header["version"]))
        return {"learner": self.learner, "status": status, "push_started": started, "acked": acked,
                "version_seen": seen, "pulled": pulled, "push_bytes": frame.wire_size}

    def run(self, c: Conductor) -> None:
        last = 0
        try:
            while True:
                with c.cond:
                    c.cond.wait_for(lambda: c.round > last or c.stop, timeout=self.heartbeat_interval)
                    r, stop = c.round, c.stop
                if stop:
                    return
                if r > last:
                    result = self.one_round()
                    last = r
                    with c.cond:
                        c.done.setdefault(r, []).append(result)
                        c.cond.notify_all()
                else:
                    self.heartbeat()
        except Exception as exc:  # noqa: BLE001 - reported by the conductor
            with c.cond:
                c.errors.append(f"pusher {self.learner}: {type(exc).__name__}: {exc}")
                c.cond.notify_all()

    def bye(self) -> None:
        from trainer import wire
        from trainer.link import TRANSIENT, Refusal
        try:
            if self.link.connected:
                self.link.request(wire.message(wire.BYE, {}))
        except (Refusal, *TRANSIENT):
            pass
        self.link.close()


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 0.05) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid, self.every = pid, every
        self.peak = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            rss = read_vm(self.pid)["VmRSS"]
            if rss is not None:
                self.peak = max(self.peak, rss)
            self.halt.wait(self.every)


# ----------------------------------------------------------------------------- one point
def start_syncer(tmp: Path, n: int, size: str, args: argparse.Namespace) -> tuple:
    from trainer.secretfile import ensure_secret
    secret_file = ensure_secret(tmp / "secret")
    address_file = tmp / "syncer.json"
    argv = [sys.executable, "-m", "trainer", "syncer", "--learners", str(n), "--state-dir", str(tmp / "state"),
            "--run-dir", str(tmp), "--address-file", str(address_file), "--mode", "decoupled",
            "--grace", str(args.grace), "--heartbeat-interval", str(args.heartbeat_interval),
            "--heartbeat-timeout", str(args.heartbeat_timeout), "--encoding", args.encoding,
            *SIZES[size], *COMMON]
    env = dict(os.environ, ISLANDS_SECRET_FILE=str(secret_file), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    log = open(tmp / "syncer.log", "wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    log.close()
    deadline = time.monotonic() + START_TIMEOUT
    while not address_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"syncer exited with {proc.returncode}: {(tmp / 'syncer.log').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"syncer did not listen within {START_TIMEOUT:.0f}s")
        time.sleep(0.05)
    addr = json.loads(address_file.read_text())
    return proc, (addr["host"], int(addr["port"])), secret_file.read_text().strip().encode(), argv


def stop_syncer(proc: subprocess.Popen) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(timeout=10)
    return proc.returncode


def measure(size: str, n: int, args: argparse.Namespace) -> tuple[dict, dict]:
    import torch

    from trainer.config import TrainConfig
    from trainer.events import read_events
    from trainer.link import Address
    from trainer.model import build_model

    total = args.warmup + args.rounds
    with tempfile.TemporaryDirectory(prefix=f"islands-scaling-{size}-{n}-") as tmp_name:
        tmp = Path(tmp_name)
        proc, (host, port), secret, argv = start_syncer(tmp, n, size, args)
        vm: dict = {"start": read_vm(proc.pid)["VmRSS"], "end_of_round": []}
        sampler = RssSampler(proc.pid)
        sampler.start()
        pushers = [Pusher(i, Address(host, port), secret, args.heartbeat_interval, args.request_timeout,
                          not args.no_pull) for i in range(1, n + 1)]
        c = Conductor()
        threads: list[threading.Thread] = []
        rounds: list[dict] = []
        try:
            headers = [p.hello() for p in pushers]
            h = headers[0]
            cfg = TrainConfig.from_dict(h["config"])
            torch.manual_seed(0)
            shapes = {k: v.shape for k, v in build_model(cfg.model, cfg.seed).named_parameters()}
            names = list(h["fragments"][0])
            params = sum(math.prod(shapes[k]) for k in names)
            tokens = cfg.sync_every * cfg.tokens_per_step
            for p in pushers:
                p.prepare(shapes, names, cfg.encoding, tokens, cfg.sync_every, seed=p.learner)
            threads = [threading.Thread(target=p.run, args=(c,), name=f"pusher-{p.learner}", daemon=True)
                       for p in pushers]
            for t in threads:
                t.start()
            for r in range(1, total + 1):
                released = time.monotonic()
                with c.cond:
                    c.round = r
                    c.cond.notify_all()
                    ok = c.cond.wait_for(lambda: len(c.done.get(r, [])) == n or c.errors, timeout=ROUND_TIMEOUT)
                    if c.errors:
                        raise RuntimeError("; ".join(c.errors[:3]))
                    if not ok:
                        raise TimeoutError(f"round {r}: {len(c.done.get(r, []))} of {n} pushers done "
                                           f"within {ROUND_TIMEOUT:.0f}s")
                    results = list(c.done[r])
                finished = max(x["pulled"] or x["version_seen"] for x in results)
                rounds.append({"round": r, "seconds": max(x["version_seen"] for x in results) - released,
                               "with_pull_seconds": finished - released,
                               "statuses": sorted({x["status"] for x in results}),
                               "push_bytes": sum(x["push_bytes"] for x in results)})
                vm["end_of_round"].append(read_vm(proc.pid)["VmRSS"])
            vm["hwm"] = read_vm(proc.pid)["VmHWM"]
        finally:
            with c.cond:
                c.stop = True
                c.cond.notify_all()
            for t in threads:
                t.join(timeout=30)
            for p in pushers:
                p.bye()
            sampler.halt.set()
            sampler.join(timeout=5)
            vm["peak"] = sampler.peak or None
            code = stop_syncer(proc)
        events = [e for e in read_events(tmp) if e.get("process") == "syncer"]
        merges = merge_rows(events)
        if args.keep:
            dest = Path(args.keep) / f"{size}-{n}"
            dest.mkdir(parents=True, exist_ok=True)
            for name in ("syncer.log",):
                (dest / name).write_bytes((tmp / name).read_bytes())
            (dest / "syncer.jsonl").write_text((tmp / "events" / "syncer.jsonl").read_text())
    point = summarize_point(size, params, n, merges, rounds, args.warmup, vm, events)
    point["syncer_exit_code"] = code
    raw = {"size": size, "n": n, "syncer_argv": argv[1:], "merges": merges, "rounds": rounds, "vm_kib": vm}
    return point, raw


# ----------------------------------------------------------------------------- plot
def plot(points: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {"small": "tab:blue", "default": "tab:red"}
    for size in dict.fromkeys(p["size"] for p in points):
        pts = [p for p in points if p["size"] == size and p["merge_s_median"] is not None]
        if not pts:
            continue
        ns = [p["n"] for p in pts]
        color = colors.get(size, None)
        label = f"{size} ({pts[0]['params'] / 1e6:.2f}M params)"
        lo = [p["merge_s_median"] for p in pts]
        hi = [p["merge_s_p90"] - p["merge_s_median"] for p in pts]
        axes[0].errorbar(ns, lo, yerr=[[0] * len(pts), hi], marker="o", color=color, capsize=3,
                         label=f"{label}: merge (median, p90)")
        axes[0].plot(ns, [p["first_push_to_merge_s_median"] for p in pts], ls="--", marker="x", color=color,
                     label=f"{size}: first push -> merge")
        axes[1].plot(ns, [p["rss_end_of_round_mib"] for p in pts], marker="o", color=color,
                     label=f"{size}: RSS after a round")
        axes[1].plot(ns, [p["hwm_mib"] for p in pts], ls="--", marker="^", color=color, label=f"{size}: VmHWM")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_xlabel("learners N (simulated pushers)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("seconds")
    axes[0].set_title("merge time vs N")
    axes[1].set_ylabel("syncer memory (MiB)")
    axes[1].set_title("syncer memory vs N")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = Parser(description=__doc__, formatter_class=DescriptionFormatter)
    ap.add_argument("--ns", default="1,2,4,8,16,32,64", help="learner counts, comma-separated")
    ap.add_argument("--sizes", default="small,default", help=f"model sizes among {', '.join(SIZES)}")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds per point")
    ap.add_argument("--warmup", type=int, default=1, help="rounds not counted")
    ap.add_argument("--encoding", default="fp32",
                    help="the syncer's --encoding, which its WELCOME hands the pushers: how each pushed "
                         "pseudo-gradient is encoded (fp32, bf16, int8, int4, e3m0)")
    ap.add_argument("--grace", type=float, default=60.0, help="syncer --grace: large, so merges wait for all N")
    ap.add_argument("--heartbeat-interval", type=float, default=0.2,
                    help="seconds between an idle pusher's heartbeats (also the syncer's --heartbeat-interval)")
    ap.add_argument("--heartbeat-timeout", type=float, default=10.0,
                    help="syncer --heartbeat-timeout, seconds: large, so a pusher delayed by this process's GIL "
                         "is not declared dead")
    ap.add_argument("--request-timeout", type=float, default=60.0,
                    help="seconds a pusher waits for the syncer's answer before it reconnects")
    ap.add_argument("--no-pull", action="store_true", help="pushers do not PULL the merged fragment")
    ap.add_argument("--quick", action="store_true", help="N in 1,2,4,8 and 2 rounds: proves the script end to end")
    ap.add_argument("--keep", type=output_dir, help="copy each point's syncer log and events under this directory")
    ap.add_argument("--out", type=output_file, default=str(OUT),
                    help="the JSON written: the table's points, the raw merges and the flags")
    ap.add_argument("--png", type=output_file, default=None,
                    help="the plot of merge time and memory against N (default: --out with .png)")
    args = ap.parse_args(argv)
    if args.png is None:
        check_output(ap, "--out", Path(args.out).with_suffix(".png"))
    try:
        ns, sizes = parse_ns(args.ns), parse_sizes(args.sizes)
    except ValueError as exc:
        ap.error(str(exc))
    if args.quick:
        ns = [n for n in ns if n <= 8] or [1]
        args.rounds = min(args.rounds, 2)
    if args.rounds < 1 or args.warmup < 0:
        ap.error("--rounds must be >= 1 and --warmup >= 0")

    started = time.monotonic()
    load = os.getloadavg()
    points, raw = [], []
    for size in sizes:
        for n in ns:
            t = time.monotonic()
            point, detail = measure(size, n, args)
            point["wall_s"] = round(time.monotonic() - t, 1)
            points.append(point)
            raw.append(detail)
            print(format_table([point]).splitlines()[-1] + f"  ({point['wall_s']:.0f} s)", flush=True)
    wall = time.monotonic() - started
    print()
    print(format_table(points))
    out = Path(args.out)
    png = Path(args.png) if args.png else out.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": "python bench/syncer_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": platform.platform(), "cpus": os.cpu_count(), "load_average_at_start": load,
        "wall_seconds": round(wall, 1), "ns": ns, "sizes": {s: SIZES[s] for s in sizes}, "common_flags": COMMON,
        "rounds": args.rounds, "warmup": args.warmup, "encoding": args.encoding, "grace": args.grace,
        "heartbeat_interval": args.heartbeat_interval, "heartbeat_timeout": args.heartbeat_timeout,
        "pull": not args.no_pull, "points": points, "raw": raw}, indent=2))
    plot(points, png, f"syncer scaling ({args.rounds} rounds per point, {args.encoding}, "
                      f"{'push+pull' if not args.no_pull else 'push only'}), {os.cpu_count()} CPUs, "
                      f"load {load[0]:.1f}")
    print(f"wall {wall:.0f} s; wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
