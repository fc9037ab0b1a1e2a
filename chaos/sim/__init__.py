"""The deterministic simulator: the real syncer in one thread, on a virtual clock, a
simulated network and a simulated disk (issue 28; FoundationDB's and TigerBeetle's way).

One process, one thread, one seeded PRNG. The syncer is trainer.syncer.Syncer itself,
started with no socket or thread (`start_stepped`): frames reach it through `handle`, time
through `tick`, its state through a SimDisk. Learners are stand-ins that keep the real
learner's versions protocol (trainer.adoption.VersionBook) and push queue, training a
small model whose optimum is known (task.py). A schedule from `faults/` drives the faults,
the same event schema comes out, and the same checkers judge the run.

  loop.py          virtual time: a clock and a queue of timed actions
  task.py          the stand-in task (linear regression with a known optimum)
  network.py       one link per learner: latency, blackholes by direction, refusal
  syncer_host.py   the real syncer, driven: deliver, tick, kill, power loss, restart
  learner.py       a stand-in learner on the real versions protocol
  world.py         a schedule run end to end into a run directory
  cli.py           `python -m chaos sim`
"""
