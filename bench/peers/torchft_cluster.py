"""A local torchft DiLoCo cluster: the Rust lighthouse plus one process per replica group.

Everything runs on 127.0.0.1, each process in its own session (process group), with its
log in RUN_DIR/logs. `TorchftCluster` speaks the chaos harness's `Cluster` interface, so
`chaos.controller.Controller` can apply the same schedule to it as to Islands: targets
`learner-1` … `learner-N` are the replica groups and `syncer` is the lighthouse (its
nearest counterpart; it comes back on the same port). Kill, pause and restart work; link
faults and partitions do not (there is no proxy on torchft's links) and are reported by
`unsupported()`. `kill(i)`, `restart(i)`, `is_running(i)` also take the group number.

    python bench/peers/torchft_cluster.py --smoke     # 2 groups, 40 s, kill group 2 at 15 s, back at 20 s

The groups run bench/peers/torchft_diloco.py with the python of torchft's own venv
(bench/peers/torchft_env.py); the launcher itself needs neither torch nor torchft.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.backends.base import Cluster, UnknownTarget, UnsupportedFault  # noqa: E402
from chaos.processes import ManagedProcess, Registry, start_recorded  # noqa: E402
from chaos.spares import SparePool, start_spares  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.events import EventLog, read_events  # noqa: E402

from bench.peers.torchft_env import WORK_DIR, ensure_torchft, lighthouse_binary  # noqa: E402

PEER_SCRIPT = Path(__file__).resolve().parent / "torchft_diloco.py"
# tests/properties/support.py FAST_TRAINER_ARGS: the small model the property suites train.
FAST_TRAINER_ARGS = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8",
                     "--sync-every", "10"]
SPARE_PRELOAD = ["trainer.warm", "torchft", "torchft.local_sgd"]  # what a group's warm spare imports
START_TIMEOUT = 30.0      # the lighthouse prints its address within this
TRAINING_TIMEOUT = 120.0  # every group made an inner step (imports are slow on a loaded box)
STOP_TIMEOUT = 15.0       # SIGTERM, then SIGKILL
LISTENING = re.compile(r"listening on: \S+:(\d+)")
# torchft reads these before its constructor arguments; a stray one would change the run.
TORCHFT_OVERRIDES = ("TORCHFT_TIMEOUT_SEC", "TORCHFT_QUORUM_TIMEOUT_SEC", "TORCHFT_CONNECT_TIMEOUT_SEC",
                     "TORCHFT_QUORUM_RETRIES", "TORCHFT_MANAGER_PORT", "TORCHFT_LIGHTHOUSE")


class TorchftCluster(Cluster):
    """`groups` torchft replica groups and a lighthouse with --min_replicas 1.

    heartbeat_timeout_ms defaults to Islands' --heartbeat-timeout (1 s) and the managers
    heartbeat at Islands' --heartbeat-interval (0.2 s); join_timeout_ms and quorum_tick_ms
    keep torchft's defaults. `trainer_args` are Islands training flags, passed to every
    group (model size, batch, H, seed...); `sync_every` is appended after them and wins.
    """

    supports_network_partitions = False

    def __init__(self, run_dir: str | os.PathLike, groups: int = 4, sync_every: int = 10,
                 heartbeat_timeout_ms: int = int(TrainConfig.heartbeat_timeout * 1000),
                 heartbeat_interval_ms: int = int(TrainConfig.heartbeat_interval * 1000),
                 join_timeout_ms: int = 60000, quorum_tick_ms: int = 100, data: str = "markov",
                 trainer_args: list[str] | None = None, peer_args: list[str] | None = None,
                 python: str | os.PathLike | None = None, lighthouse: str | os.PathLike | None = None,
                 min_replicas: int = 1, name: str = "torchft", warm_spares: int = 0) -> None:
        if groups < 1:
            raise ValueError(f"groups: must be >= 1, got {groups}")
        if heartbeat_interval_ms >= heartbeat_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms {heartbeat_interval_ms} must be below "
                             f"heartbeat_timeout_ms {heartbeat_timeout_ms}")
        self.run_dir = Path(run_dir)
        self.learners = self.groups = groups
        self.learner_args: dict[int, list[str]] = {}
        self.warm_spares = warm_spares
        self.spares: SparePool | None = None
        self.sync_every = sync_every
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.join_timeout_ms = join_timeout_ms
        self.quorum_tick_ms = quorum_tick_ms
        self.min_replicas = min_replicas
        self.data = data
        self.trainer_args = [str(a) for a in (trainer_args or [])]
        self.peer_args = [str(a) for a in (peer_args or [])]
        self.python = Path(python) if python is not None else None
        self.lighthouse_bin = Path(lighthouse) if lighthouse is not None else None
        self.registry = Registry(name, run_dir=self.run_dir)
        self.procs: dict[str, ManagedProcess] = {}
        self.lighthouse_port = 0
        self.leftovers: list[str] = []
        self.events: EventLog | None = None

    # ----------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.python is None:
            self.python = ensure_torchft()
            if self.python is None:
                raise RuntimeError("torchft is not installed and could not be (see the message above)")
        if self.lighthouse_bin is None:
            self.lighthouse_bin = lighthouse_binary(self.python.parent.parent)
            if self.lighthouse_bin is None:
                raise RuntimeError(f"no torchft_lighthouse beside {self.python}")
        self.leftovers = self.registry.reap_leftovers()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(self.run_dir, "torchft-launcher")
        env = {k: v for k, v in os.environ.items() if k not in TORCHFT_OVERRIDES and k != "VIRTUAL_ENV"}
        self.env = dict(env, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TORCHFT_USE_OTEL="false")
        # Restarts of a replica group take a warm spare (torch and torchft imported), as
        # Islands' learners do with LocalCluster(warm_spares=N): the same start-up for both.
        self.spares = start_spares(str(self.python), self.env, SPARE_PRELOAD, self.run_dir / "logs",
                                   self.warm_spares, self.registry)
        self._start_lighthouse()
        for i in range(1, self.groups + 1):
            self._start_group(i, first=True)

    @property
    def lighthouse_addr(self) -> str:
        return f"http://127.0.0.1:{self.lighthouse_port}"

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = self.procs[name] = start_recorded(name, argv, self.run_dir / "logs", self.env, self.registry,
                                                    self.spares)
        return proc

    def _start_lighthouse(self) -> None:
        log = self.run_dir / "logs" / "lighthouse.log"
        offset = log.stat().st_size if log.exists() else 0
        proc = self._spawn("lighthouse", [
            str(self.lighthouse_bin), "--min_replicas", str(self.min_replicas),
            "--bind", f"127.0.0.1:{self.lighthouse_port}", "--join_timeout_ms", str(self.join_timeout_ms),
            "--quorum_tick_ms", str(self.quorum_tick_ms), "--heartbeat_timeout_ms", str(self.heartbeat_timeout_ms)])
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with open(log, "rb") as fh:
                fh.seek(offset)
                found = LISTENING.search(fh.read().decode("utf-8", "replace"))
            if found:
                self.lighthouse_port = int(found.group(1))
                break
            if not proc.running():
                raise RuntimeError(f"torchft_lighthouse exited with {proc.popen.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"torchft_lighthouse did not listen within {START_TIMEOUT:.0f}s; see {log}")
            time.sleep(0.05)
        self._note("torchft_launch", target="syncer", role="lighthouse", pid=proc.pid, port=self.lighthouse_port,
                   heartbeat_timeout_ms=self.heartbeat_timeout_ms, join_timeout_ms=self.join_timeout_ms,
                   quorum_tick_ms=self.quorum_tick_ms, min_replicas=self.min_replicas)

    def _start_group(self, i: int, first: bool = False) -> None:
        spawned = time.monotonic()
        proc = self._spawn(f"torchft-{i}", [
            str(self.python), str(PEER_SCRIPT), "--replica-group", str(i), "--groups", str(self.groups),
            "--lighthouse", self.lighthouse_addr, "--run-dir", str(self.run_dir), "--data", self.data,
            *self.trainer_args, "--sync-every", str(self.sync_every),
            "--heartbeat-interval", str(self.heartbeat_interval_ms / 1000),
            "--heartbeat-timeout", str(self.heartbeat_timeout_ms / 1000),
            "--spawned-at", repr(spawned), *self.peer_args])
        self._note("torchft_launch" if first else "restart", target=f"learner-{i}", learner=i, pid=proc.pid)

    def _note(self, kind: str, **fields) -> None:
        if self.events is not None:
            self.events.emit(kind, **fields)

    def stop(self) -> None:
        """SIGTERM every group at once (each stops at its next step boundary), SIGKILL the
        ones still up after STOP_TIMEOUT, then stop the lighthouse."""
        groups = [p for n, p in self.procs.items() if n != "lighthouse" and p.running()]
        for proc in groups:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in groups:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: it gets SIGKILL
                proc.kill()
        if "lighthouse" in self.procs:
            self.procs["lighthouse"].terminate(STOP_TIMEOUT)
        if self.spares is not None:
            self.spares.close()
        self._note("torchft_stop")
        if self.events is not None:
            self.events.close()
            self.events = None
        self.registry.close()

    # ----------------------------------------------------------- targets
    def _name(self, target: int | str) -> str:
        """`learner-N` (or N) -> the group's process name; `syncer` -> the lighthouse."""
        if isinstance(target, int):
            target = f"learner-{target}"
        self.check_target(target)
        if "/" in target:
            raise UnknownTarget(f"{target!r}: a torchft replica group here runs one rank")
        return "lighthouse" if target == "syncer" else f"torchft-{int(target.split('-', 1)[1])}"

    def _proc(self, target: int | str) -> ManagedProcess | None:
        return self.procs.get(self._name(target))

    def kill(self, target: int | str) -> None:
        proc = self._proc(target)
        if proc is not None and proc.running():
            proc.kill()
            self._note("torchft_kill", target=self._target(target), pid=proc.pid)

    def pause(self, target: int | str) -> None:
        proc = self._proc(target)
        if proc is not None:
            proc.signal(signal.SIGSTOP)

    def resume(self, target: int | str) -> None:
        proc = self._proc(target)
        if proc is not None:
            proc.signal(signal.SIGCONT)

    def restart(self, target: int | str) -> None:
        """Start the target again if it is down: a new incarnation of a group, or the
        lighthouse on its old port."""
        name = self._name(target)
        proc = self.procs.get(name)
        if proc is not None and proc.running():
            return
        if name == "lighthouse":
            self._start_lighthouse()
        else:
            self._start_group(int(name.split("-", 1)[1]))

    def is_running(self, target: int | str) -> bool:
        proc = self._proc(target)
        return proc is not None and proc.running()

    def is_paused(self, target: int | str) -> bool:
        proc = self._proc(target)
        return proc is not None and proc.paused()

    def pid(self, target: int | str) -> int | None:
        proc = self._proc(target)
        return proc.pid if proc is not None and proc.running() else None

    def _target(self, target: int | str) -> str:
        return f"learner-{target}" if isinstance(target, int) else target

    # ----------------------------------------------------------- links: none
    def link_proxy(self, target: str) -> str:
        raise UnsupportedFault("the torchft peer has no proxy on its links: link faults and partitions "
                               "cannot be applied to it")

    def link_proxies(self) -> list[str]:
        return []

    def unsupported(self, schedule) -> list[str]:
        problems = []
        for i, f in enumerate(schedule.faults):
            if f.kind not in ("kill", "pause"):
                problems.append(f"faults[{i}].kind: {f.kind!r} needs a proxy on the links; the torchft peer "
                                "supports kill and pause only")
            elif "/" in str(getattr(f, "target", "")):
                problems.append(f"faults[{i}].target: {f.target!r}: torchft groups here run one rank")
        return problems

    def heal_all(self) -> list[str]:
        return self.heal_processes(self.units())  # no proxies to clear

    # ----------------------------------------------------------- waiting
    def wait_until_training(self, timeout: float = TRAINING_TIMEOUT) -> float:
        """Block until every group has made an inner step; returns time.monotonic() then."""
        deadline = time.monotonic() + timeout
        wanted = set(range(1, self.groups + 1))
        while True:
            stepped = {e["learner"] for e in read_events(self.run_dir) if e["kind"] == "inner_step"}
            if stepped >= wanted:
                return time.monotonic()
            for i in sorted(wanted - stepped):
                if not self.is_running(i):
                    raise RuntimeError(f"torchft group {i} exited before training; see "
                                       f"{self.run_dir / 'logs' / f'torchft-{i}.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"torchft group(s) {sorted(wanted - stepped)} made no inner step within "
                                   f"{timeout:.0f}s; see {self.run_dir / 'logs'}")
            time.sleep(0.25)


# --------------------------------------------------------------------------- reading a run
def _rate(steps: list[dict]) -> float | None:
    if len(steps) < 2:
        return None
    return round((len(steps) - 1) / max(steps[-1]["t"] - steps[0]["t"], 1e-9), 2)


def net_merged_tokens(events: list[dict]) -> float:
    """trainer.metrics.merged_tokens less the tokens heals took back (see torchft_diloco.py)."""
    from trainer.metrics import merged_tokens
    return merged_tokens(events) - sum(e.get("retracted_tokens", 0) for e in events if e["kind"] == "torchft_heal")


def report(events: list[dict], groups: int) -> dict:
    """What a torchft run did, from its events: per group, per kill and per restart."""
    by_group: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e.get("learner") is not None and str(e.get("process", "")).startswith("torchft-") \
                and e["process"] != "torchft-launcher":
            by_group[e["learner"]][e["kind"]].append(e)
    out: dict = {"net_merged_tokens": net_merged_tokens(events),
                 "retracted_tokens": sum(e.get("retracted_tokens", 0) for e in events if e["kind"] == "torchft_heal"),
                 "groups": {}}
    for g in range(1, groups + 1):
        ev = by_group[g]
        steps, merges, failed = ev["inner_step"], ev["merge"], ev["sync_failed"]
        syncs = sorted(merges + failed, key=lambda e: e["t"])
        out["groups"][str(g)] = {
            "incarnations": len(ev["process_start"]),
            "inner_steps": len(steps),
            "steps_per_s_wall": _rate(steps),
            "median_compute_s": round(statistics.median(e["compute_s"] for e in steps), 5) if steps else None,
            "commits": len(merges), "solo_commits": sum(1 for e in merges if e.get("participants") == 1),
            "failed_syncs": len(failed), "heals": len(ev["torchft_heal"]),
            "stops": [e.get("reason") for e in ev["process_stop"]],
            "median_quorum_s": round(statistics.median(e["quorum_s"] for e in syncs), 4) if syncs else None,
            "max_quorum_s": max((e["quorum_s"] for e in syncs), default=None),
            "participants_seen": sorted({e.get("participants") for e in syncs if e.get("participants") is not None}),
            "startup_s": [s.get("startup_s") for s in ev["process_start"]],
            "barrier": [{k: b[k] for k in ("joined", "waited_s", "complete")} for b in ev["torchft_barrier"]],
        }
    launcher = [e for e in events if e.get("process") == "torchft-launcher"]
    out["kills"] = []
    for k in (e for e in launcher if e["kind"] == "torchft_kill" and e["target"].startswith("learner-")):
        victim = int(k["target"].split("-", 1)[1])
        row: dict = {"group": victim, "at": k["t"]}
        for g in (g for g in range(1, groups + 1) if g != victim):
            ev = by_group[g]
            after = [e for e in sorted(ev["merge"] + ev["sync_failed"], key=lambda e: e["t"]) if e["t"] > k["t"]]
            steps = [e["t"] for e in ev["inner_step"]]
            window = [t for t in steps if k["t"] - 1.0 <= t <= k["t"] + 15.0]
            gaps = [b - a for a, b in zip(window, window[1:])]
            first = after[0] if after else None
            row[f"survivor_{g}"] = {
                "first_sync_after_kill": None if first is None else {
                    "kind": first["kind"], "after_kill_s": round(first["t"] - k["t"], 3),
                    "quorum_s": first["quorum_s"], "sync_s": first["sync_s"],
                    "participants": first.get("participants"), "error": first.get("error")},
                "longest_step_gap_s": round(max(gaps), 3) if gaps else None,
                "syncs_until_alone": next((i + 1 for i, e in enumerate(after) if e.get("participants") == 1), None),
            }
        out["kills"].append(row)
    out["restarts"] = []
    for r in (e for e in launcher if e["kind"] == "restart" and e["target"].startswith("learner-")):
        g = int(r["target"].split("-", 1)[1])
        ev = by_group[g]
        start = next((e for e in ev["process_start"] if e["t"] > r["t"]), None)
        first_step = next((e for e in ev["inner_step"] if e["t"] > r["t"]), None)
        heal = next((e for e in ev["torchft_heal"] if e["t"] > r["t"]), None)
        merge = next((e for e in ev["merge"] if e["t"] > r["t"]), None)
        out["restarts"].append({
            "group": g,
            "process_start_after_spawn_s": round(start["t"] - r["t"], 3) if start else None,
            "first_step_after_spawn_s": round(first_step["t"] - r["t"], 3) if first_step else None,
            "heal_done_after_spawn_s": round(heal["t"] - r["t"], 3) if heal else None,
            "checkpoint_fetch_s": heal.get("fetch_s") if heal else None,
            "checkpoint_bytes": heal.get("bytes") if heal else None,
            "retracted_tokens": heal.get("retracted_tokens") if heal else None,
            "heal_quorum_s": heal and next((e["quorum_s"] for e in ev["merge"] + ev["sync_failed"]
                                            if e["t"] >= heal["t"]), None),
            "first_commit_after_spawn_s": round(merge["t"] - r["t"], 3) if merge else None,
        })
    return out


def smoke(args: argparse.Namespace) -> int:
    python = ensure_torchft()
    if python is None:
        print(json.dumps({"torchft": "unavailable"}))
        return 2
    run_dir = Path(args.run_dir) if args.run_dir else WORK_DIR / "torchft-smoke"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cluster = TorchftCluster(run_dir, groups=args.groups, sync_every=args.sync_every,
                             trainer_args=FAST_TRAINER_ARGS, python=python)
    started = time.monotonic()
    try:
        cluster.start()
        t0 = cluster.wait_until_training()
        print(f"smoke: {args.groups} groups training {t0 - started:.1f}s after start; run dir {run_dir}",
              flush=True)
        for at, action in ((args.kill_at, "kill"), (args.restart_at, "restart")):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            getattr(cluster, action)(args.victim)
            print(f"smoke: t={time.monotonic() - t0:5.1f}s {action} group {args.victim}", flush=True)
        time.sleep(max(0.0, t0 + args.duration - time.monotonic()))
    finally:
        cluster.stop()
    from trainer.metrics import summarize
    events = read_events(run_dir)
    result = {"torchft_report": report(events, args.groups), "summarize": summarize(events, args.groups),
              "schedule": {"kill_at": args.kill_at, "restart_at": args.restart_at, "duration": args.duration,
                           "victim": args.victim, "t0_after_start_s": round(t0 - started, 2)}}
    print(json.dumps(result, indent=1))
    (run_dir / "smoke.json").write_text(json.dumps(result, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--smoke", action="store_true", help="run the kill/restart smoke and print its report")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--sync-every", type=int, default=10)
    p.add_argument("--duration", type=float, default=40.0, help="seconds from when every group trains")
    p.add_argument("--kill-at", type=float, default=15.0)
    p.add_argument("--restart-at", type=float, default=20.0)
    p.add_argument("--victim", type=int, default=2)
    p.add_argument("--run-dir", default=None, help="default: bench/out/work/torchft-smoke (replaced)")
    args = p.parse_args(argv)
    if not args.smoke:
        p.print_help()
        return 0
    return smoke(args)


if __name__ == "__main__":
    sys.exit(main())
