"""The goodput simulator: seeded discrete events, standard library only (matplotlib for --plot).

Two modes, one result shape (result.SystemResult: goodput and the losses by cause):
  scale     scale.simulate(ScaleInputs) -> {"decoupled", "elastic-dp", "dp"}: one stream of chip
            failures (failures.py) through decoupled DiLoCo, with the paper's learners or
            Islands' (decoupled.py), and data-parallel, elastic or not (dataparallel.py);
  schedule  scheduled.predict_schedule(Schedule, RunInputs): an explicit fault schedule replayed
            on a simulated Islands cluster, predicting bench/goodput.py's two goodputs
            (runfile.py reads a recorded benchmark and its measured inputs).
inputs.py holds the scale inputs with the assumption behind each default; cli.py is
`python -m chaos simulate-goodput`; docs/simulate-goodput.md explains the model.
"""
from .dists import Dist, Empirical, ExpWeibull, Fixed, LogNormal, Sum, parse_dist
from .inputs import PAPER, PRESETS, ScaleInputs
from .result import LOSSES, SYSTEMS, SystemResult
from .runfile import load_run, measured_pace, measured_restarts
from .scale import simulate
from .scheduled import RunInputs, predict_schedule

__all__ = ["Dist", "Empirical", "ExpWeibull", "Fixed", "LOSSES", "LogNormal", "PAPER", "PRESETS", "RunInputs", "SYSTEMS",
           "ScaleInputs", "Sum", "SystemResult", "load_run", "measured_pace", "measured_restarts", "parse_dist",
           "predict_schedule", "simulate"]
