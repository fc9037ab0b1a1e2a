"""Live fuzzing: mutated frames, unsigned and signed, at a real syncer process.

    python -m fuzz.live --frames 100000 --json bench/out/live_fuzz.json

A syncer runs as its own process (`python -m trainer syncer`, the tiny model). Client
threads open connections and send, for each unit, one mutated thing:
- unsigned (no secret): random bytes, a mangled opening, a frame under a wrong key, a
  prefix claiming a huge header or payload, a truncated frame;
- signed (as learner 2, holding the secret): a sealed frame whose header fields, types,
  numbers, nesting, crc and tensors are mutated, pipelined on one connection for as long
  as the syncer keeps it (a refused request keeps the stream in step; a bad frame ends it).
Every unit is either answered (a reply came back) or, if the connection closed without
one, must show up in the syncer's own counters (rejected_frames + refused_connections):
the verdict compares them. Then a real learner process (learner 1) trains against the
same syncer and must get its pushes merged. The syncer's RSS is sampled throughout.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer import wire
from trainer.codec import ENCODINGS, encode
from trainer.keys import learner_key
from trainer.events import iter_file
from trainer.argtypes import Parser
from bench.outputs import output_file

MODEL_FLAGS = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8", "--batch-size", "4",
               "--sync-every", "4", "--heartbeat-timeout", "30", "--heartbeat-interval", "1"]
TIMEOUT = 10.0
_PAYLOADS: dict[tuple, bytes] = {}


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0           # a reply (ACK, BEAT, ERROR, ...) came back
    errors: int = 0             # of which ERROR replies (each one counted by the syncer)
    unanswered: int = 0         # the connection closed (or reset) without a reply
    signed: int = 0
    unsigned: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note(self, signed: bool, reply: wire.Frame | None) -> None:
        with self.lock:
            self.sent += 1
            self.signed += signed
            self.unsigned += not signed
            if reply is None:
                self.unanswered += 1
                return
            self.answered += 1
            if reply.type == wire.ERROR:
                self.errors += 1
                reason = str(reply.header.get("reason"))
                self.reasons[reason] = self.reasons.get(reason, 0) + 1


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ----------------------------------------------------------------------------- mutations

def _opening(rng: random.Random, learner: int = 0) -> bytes:
    return wire.OPENING.pack(wire.MAGIC, wire.VERSION, learner.to_bytes(3, "big"), rng.randbytes(wire.RANDOM_BYTES))


def unsigned_bytes(rng: random.Random) -> bytes:
    """What someone without the secret can send."""
    kind = rng.randrange(7)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 2048))
    if kind == 1:
        # a bit of the magic or the version: the bytes after them name a learner id, and an
        # opening for another id is a valid one (the syncer answers it with its own)
        opening = bytearray(_opening(rng))
        opening[rng.randrange(5)] ^= 1 << rng.randrange(8)
        return bytes(opening)
    if kind == 2:  # a plausible HELLO under a wrong key
        head = json.dumps({"type": "HELLO", "learner": 1, "nonce": "x", "mode": "decoupled", "crc32": 0}).encode()
        return _opening(rng) + wire.Session(rng.randbytes(32), client=True).seal(wire.Message(wire.HELLO, head, b""))
    if kind == 3:  # a prefix claiming far more than any unauthenticated frame may carry
        return _opening(rng) + wire.PREFIX.pack(wire.MAGIC, wire.VERSION, rng.choice([10, 5000, 1 << 31]),
                                                rng.choice([1, 64 << 20, 1 << 60]))
    if kind == 4:  # truncated
        return _opening(rng)[:rng.randrange(1, 40)]
    if kind == 5:  # an HTTP request to the wrong port
        return b"GET / HTTP/1.1\r\nHost: syncer\r\n\r\n"
    return _opening(rng) + rng.randbytes(rng.randrange(20, 600))


def _number(rng: random.Random) -> object:
    return rng.choice([0, 1, 2, 4, -1, 2 ** 53, 2 ** 64, 10 ** 309, 1.5, float("1e308"), "7", None, True, [],
                       rng.randrange(1000)])


def _json_with_literals(header: dict, rng: random.Random) -> bytes:
    text = json.dumps(header, separators=(",", ":"))
    kind = rng.randrange(6)
    if kind == 0:
        return text[:-1].encode() + b',"deep":' + b"[" * rng.randrange(9, 20000) + b"]" * 5 + b"}"
    if kind == 1:
        return text[:-1].encode() + b',"big":' + b"9" * rng.randrange(20, 6000) + b"}"
    if kind == 2:
        return text[:-1].encode() + b',"x":NaN}'
    if kind == 3:
        raw = bytearray(text.encode())
        raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == 4:
        return text.replace('"type"', '"typ"', 1).encode()
    return text.encode()


class SignedStream:
    """One authenticated connection as learner `learner` (each worker its own: a second
    connection of one learner supersedes the first), sending mutated sealed frames."""

    def __init__(self, address: tuple[str, int], secret: bytes, shapes: list[dict[str, torch.Size]],
                 rng: random.Random, learner: int) -> None:
        self.rng = rng
        self.learner = learner
        self.shapes = shapes
        self.sock = socket.create_connection(address, timeout=TIMEOUT)
        self.channel = wire.Channel.connect(self.sock, learner_key(secret, learner), time.monotonic() + TIMEOUT,
                                            learner)
        hello = wire.message(wire.HELLO, {"learner": learner, "nonce": "fuzzer", "mode": "decoupled",
                                          "want_params": False})
        welcome = self.channel.request(hello, time.monotonic() + TIMEOUT)
        self.incarnation = int(welcome.header["incarnation"])
        self.seq = rng.randrange(1, 1 << 30)

    def _payload(self, fragment: int, encoding: str) -> bytes:
        """A pseudo-gradient of one of a few shapes of wrongness, encoded once and cached
        (encoding dominates the fuzzer's own time otherwise)."""
        rng = self.rng
        key = (fragment % len(self.shapes), encoding, rng.randrange(8), rng.randrange(4))
        if key not in _PAYLOADS:
            names = self.shapes[key[0]]
            scale = [0.0, 1e-3, 1e-2, 1.0, 1e3, 3.4e38, float("nan"), float("inf")][key[2]]
            out = {n: torch.randn(s) * scale for n, s in names.items()}
            if key[3] == 1 and out:
                out.pop(next(iter(out)))
            if key[3] == 2:
                out[next(iter(names))] = torch.zeros(3)
            try:
                _PAYLOADS[key] = wire.pack_tensors(encode(out, encoding))
            except ValueError:
                _PAYLOADS[key] = b""
        return _PAYLOADS[key]

    def message(self) -> wire.Message:
        rng = self.rng
        kind = rng.choice([wire.PUSH] * 6 + [wire.HEARTBEAT, wire.PULL, wire.HELLO, wire.GRAD, wire.ACK])
        self.seq += 1
        header: dict = {"learner": self.learner, "incarnation": self.incarnation, "seq": self.seq,
                        "fragment": rng.choice([0, 0, 1, 2, 99]), "base_version": rng.choice([0, 0, 1, 10 ** 6]),
                        "tokens": rng.choice([64, 128, 10 ** 12]), "steps": rng.choice([4, 4, 1, 0, 10 ** 9]),
                        "position": rng.randrange(100), "encoding": rng.choice([*ENCODINGS, "int3"]),
                        "mode": "decoupled", "nonce": "fuzzer"}
        # Any field but `learner`: a learner holding the secret can speak for another id (the
        # secret is shared), which would supersede another worker's connection mid-request.
        for key in rng.sample([k for k in header if k != "learner"], rng.randrange(0, 3)):
            if rng.random() < 0.5:
                del header[key]
            else:
                header[key] = _number(rng)
        payload = b""
        if kind == wire.PUSH:
            fragment = header.get("fragment") if isinstance(header.get("fragment"), int) else 0
            encoding = header.get("encoding") if header.get("encoding") in ENCODINGS else "fp32"
            payload = self._payload(int(fragment) % 8, encoding)
            if rng.random() < 0.1:
                payload = payload[: rng.randrange(len(payload) + 1)] if payload else rng.randbytes(64)
        header["type"] = str(kind)
        header["crc32"] = zlib.crc32(payload) if rng.random() > 0.05 else rng.randrange(1 << 32)
        head = _json_with_literals(header, rng) if rng.random() < 0.15 else json.dumps(header).encode()
        return wire.Message(kind, head, payload)

    def exchange(self, msg: wire.Message) -> wire.Frame | None:
        """Send one sealed message; its reply, or None if the connection ended without one."""
        try:
            self.channel.send(msg, time.monotonic() + TIMEOUT)
            return self.channel.recv(time.monotonic() + TIMEOUT)
        except (OSError, wire.PeerClosed, wire.DeadlineExceeded, wire.FrameError):
            return None

    def close(self) -> None:
        self.sock.close()


def send_unsigned(address: tuple[str, int], data: bytes) -> wire.Frame | None:
    """Raw bytes on a fresh connection; whatever the syncer answers (it cannot answer with a
    frame we could verify: no unauthenticated peer has a session), so None, or a reply
    object when bytes came back."""
    with socket.create_connection(address, timeout=TIMEOUT) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(TIMEOUT)
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
        except OSError:
            return None
    return None


# ----------------------------------------------------------------------------- the run

def start_syncer(workdir: Path, learners: int) -> tuple[subprocess.Popen, tuple[str, int], bytes]:
    secret_file = workdir / "secret"
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)
    address_file = workdir / "syncer.json"
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "syncer", "--secret-file", str(secret_file),
                             "--state-dir", str(workdir / "state"), "--run-dir", str(workdir),
                             "--address-file", str(address_file), "--quorum", "1", "--grace", "0.2", "--learners", str(learners),
                             *MODEL_FLAGS],
                            stdout=subprocess.DEVNULL, stderr=open(workdir / "syncer.log", "w"),
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not address_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the syncer did not start (exit {proc.poll()}): {(workdir / 'syncer.log').read_text()[-2000:]}")
        time.sleep(0.05)
    addr = json.loads(address_file.read_text())
    return proc, (addr["host"], int(addr["port"])), secret_file.read_bytes().strip()


def fragment_shapes(address: tuple[str, int], secret: bytes) -> list[dict[str, torch.Size]]:
    """The fragments' tensor shapes, as a learner learns them from WELCOME."""
    with socket.create_connection(address, timeout=TIMEOUT) as sock:
        channel = wire.Channel.connect(sock, learner_key(secret, 2), time.monotonic() + TIMEOUT, 2)
        welcome = channel.request(wire.message(wire.HELLO, {"learner": 2, "nonce": "fuzzer", "mode": "decoupled",
                                                            "want_params": True}), time.monotonic() + TIMEOUT)
        params = welcome.tensors()
        return [{n: params[n].shape for n in names} for names in welcome.header["fragments"]]


def fuzz_worker(address: tuple[str, int], secret: bytes, shapes: list, frames: int, seed: int, tally: Tally,
                signed_share: float, learner: int) -> None:
    rng = random.Random(seed)
    stream: SignedStream | None = None
    deadline = time.monotonic() + 3600
    while tally.sent < frames and time.monotonic() < deadline:
        if rng.random() >= signed_share:
            tally.note(False, send_unsigned(address, unsigned_bytes(rng)))
            continue
        if stream is None:
            stream = SignedStream(address, secret, shapes, rng, learner)
        reply = stream.exchange(stream.message())
        tally.note(True, reply)
        if reply is None or (reply.type == wire.ERROR and not _keeps_connection(str(reply.header.get("reason")))):
            stream.close()
            stream = None
    if stream is not None:
        stream.close()


def _keeps_connection(reason: str) -> bool:
    from trainer.protocol import Reason

    try:
        return not Reason(reason).closes_connection
    except ValueError:
        return False


def final_counters(workdir: Path) -> dict:
    finals = [e for e in iter_file(workdir / "events" / "syncer.jsonl") if e["kind"] == "final_state"]
    return finals[-1]["counters"] if finals else {}


def legit_learner_merges(workdir: Path, address: tuple[str, int], secret_file: Path, steps: int = 40) -> int:
    """A real learner process trains `steps` steps; how many of its pushes were merged."""
    proc = subprocess.run([sys.executable, "-m", "trainer", "learner", "--learner", "1",
                           "--connect", f"{address[0]}:{address[1]}", "--secret-file", str(secret_file),
                           "--run-dir", str(workdir), "--max-steps", str(steps), "--threads", "1"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"the legitimate learner failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        merged = sum(1 for e in iter_file(workdir / "events" / "syncer.jsonl") if e["kind"] == "merge"
                     for c in e["contributors"] if c["learner"] == 1)
        if merged:
            return merged
        time.sleep(0.2)
    return 0


def run(frames: int, workers: int = 4, seed: int = 0, signed_share: float = 0.8,
        workdir: Path | None = None) -> dict:
    workdir = Path(workdir or tempfile.mkdtemp(prefix="islands-live-fuzz-"))
    proc, address, secret = start_syncer(workdir, learners=workers + 1)  # learner 1 is the legitimate one
    rss = {"before": rss_mb(proc.pid), "max": 0.0}
    tally = Tally()
    started = time.monotonic()
    try:
        shapes = fragment_shapes(address, secret)
        threads = [threading.Thread(target=fuzz_worker, args=(address, secret, shapes, frames, seed * 1000 + i, tally,
                                                              signed_share, i + 2), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss["max"] = max(rss["max"], rss_mb(proc.pid))
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        for t in threads:
            t.join(timeout=60)
        fuzz_seconds = time.monotonic() - started
        alive_after_fuzz = proc.poll() is None
        merged = legit_learner_merges(workdir, address, workdir / "secret") if alive_after_fuzz else 0
        rss["after"] = rss_mb(proc.pid) if proc.poll() is None else None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        exit_code = proc.wait(timeout=60)
    counters = final_counters(workdir)
    counted = counters.get("rejected_frames", 0) + counters.get("refused_connections", 0)
    traceback_lines = [line for line in (workdir / "syncer.log").read_text().splitlines() if "Traceback" in line]
    return {"frames": tally.sent, "signed": tally.signed, "unsigned": tally.unsigned, "answered": tally.answered,
            "error_replies": tally.errors, "closed_without_reply": tally.unanswered,
            "syncer_counted": counted, "uncounted": max(0, tally.errors + tally.unanswered - counted),
            "crashes": int(not alive_after_fuzz) + int(exit_code not in (0, -signal.SIGTERM)),
            "tracebacks": len(traceback_lines), "syncer_exit": exit_code, "rss_mb": rss,
            "rss_growth_mb": round(rss["max"] - rss["before"], 1), "fuzz_seconds": round(fuzz_seconds, 1),
            "frames_per_s": round(tally.sent / fuzz_seconds) if fuzz_seconds else None,
            "learner_pushes_merged": merged, "reasons": dict(sorted(tally.reasons.items())),
            "counters": {k: v for k, v in counters.items() if k.startswith(("rejected", "refused", "accepted",
                                                                            "quarantined", "merges"))},
            "workdir": str(workdir)}


def flood(idle: int = 300, claiming: int = 16, workdir: Path | None = None) -> dict:
    """The issue's live admission check: `idle` unauthenticated connections held open (2
    bytes each), `claiming` more whose first frame claims the largest payload; then how
    long a legitimate handshake and HELLO take, and how much the syncer's RSS grew."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="islands-flood-"))
    proc, address, secret = start_syncer(workdir, learners=2)
    held: list[socket.socket] = []
    try:
        before = rss_mb(proc.pid)
        for _ in range(idle):
            sock = socket.create_connection(address, timeout=TIMEOUT)
            sock.sendall(b"IS")
            held.append(sock)
        for _ in range(claiming):
            sock = socket.create_connection(address, timeout=TIMEOUT)
            sock.sendall(_opening(random.Random()) + wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 16, 64 << 20))
            held.append(sock)
        peak = max(before, rss_mb(proc.pid))
        started = time.monotonic()
        with socket.create_connection(address, timeout=TIMEOUT) as sock:
            channel = wire.Channel.connect(sock, learner_key(secret, 1), time.monotonic() + TIMEOUT, 1)
            welcome = channel.request(wire.message(wire.HELLO, {"learner": 1, "nonce": "legit", "mode": "decoupled",
                                                                "want_params": True}), time.monotonic() + TIMEOUT)
        join_seconds = time.monotonic() - started
        peak = max(peak, rss_mb(proc.pid))
    finally:
        for sock in held:
            sock.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    counters = final_counters(workdir)
    return {"idle": idle, "claiming": claiming, "joined": welcome.type == wire.WELCOME,
            "join_seconds": round(join_seconds, 3), "rss_before_mb": round(before, 1),
            "rss_growth_mb": round(peak - before, 1),
            "evicted": counters.get("refused_unauthenticated_limit", 0),
            "oversized": counters.get("rejected_oversized", 0)}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m fuzz.live", description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=100_000,
                   help="mutated units to send in all, shared by the workers (each unit is one frame or connection)")
    p.add_argument("--workers", type=int, default=4,
                   help="client threads sending at once; worker i signs as learner i + 2 (learner 1 is the real one)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the mutations (worker i draws from seed x 1000 + i)")
    p.add_argument("--json", type=output_file,
                   help="write the result here: the tallies, the syncer's counters, RSS and the merged pushes")
    args = p.parse_args(argv)
    result = run(args.frames, args.workers, args.seed)
    rows = [("frames", result["frames"]), ("signed / unsigned", f"{result['signed']} / {result['unsigned']}"),
            ("answered", result["answered"]), ("closed without reply", result["closed_without_reply"]),
            ("counted by the syncer", result["syncer_counted"]), ("uncounted", result["uncounted"]),
            ("crashes", result["crashes"]), ("tracebacks in the syncer's log", result["tracebacks"]),
            ("RSS before / max (MB)", f"{result['rss_mb']['before']:.0f} / {result['rss_mb']['max']:.0f}"),
            ("frames/s", result["frames_per_s"]), ("legitimate learner's pushes merged", result["learner_pushes_merged"])]
    for name, value in rows:
        print(f"{name:>36} | {value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    ok = not result["crashes"] and not result["uncounted"] and result["learner_pushes_merged"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
