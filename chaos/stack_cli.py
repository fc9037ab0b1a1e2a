"""`python -m chaos stack`: print the Swarm stack file rendered from compose.yaml.

For a deployment by hand; `chaos run --backend swarm` renders and deploys its own. The
file keeps compose.yaml's ${VARIABLES}: `docker stack deploy` fills them from the
environment, as compose does.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.argtypes import Parser, positive_int

from .backends.compose_cli import ComposeError, find_compose_file
from .backends.compose import OVERRIDE_FILE
from .backends.stack import LEARNERS_LABEL, Placement, dump_stack, render_stack

EPILOG = """\
then, on a swarm manager, with the syncer's node labelled (docker node update --label-add islands.syncer=true NODE),
/var/lib/islands/host-clock made on every node (mkdir -p; the tasks read the node's clock there),
and each learner's own key written (python -m trainer.keys runs/swarm/secret N runs/swarm/keys/learner-N.key):
  ISLANDS_RUN_DIR=$PWD/runs/swarm ISLANDS_SECRET_FILE=$PWD/runs/swarm/secret ISLANDS_KEY_DIR=$PWD/runs/swarm/keys \\
      docker stack deploy --resolve-image never -c stack.yaml islands
"""


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m chaos stack", description=__doc__.splitlines()[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", type=positive_int, default=3, help="learner services (default 3)")
    parser.add_argument("--toxiproxy", choices=("islands", "shopify"), default="islands",
                        help="the proxy: our Toxiproxy-compatible server from the islands image (default), or the "
                             "real Toxiproxy image named by $TOXIPROXY_IMAGE")
    parser.add_argument("--compose-file", type=Path, default=None,
                        help="the compose file to render (default: compose.yaml of this checkout)")
    parser.add_argument("--spread-learners", action="store_true",
                        help=f"run learners only on nodes labelled {LEARNERS_LABEL}=true")
    parser.add_argument("-o", "--output", type=Path, default=None, help="write here instead of stdout")
    args = parser.parse_args(argv)
    try:
        compose_file = args.compose_file or find_compose_file()
    except ComposeError as exc:
        parser.error(f"--compose-file: {exc}")
    if not compose_file.is_file():
        parser.error(f"--compose-file: no such file: {compose_file}")
    files = [compose_file] + ([compose_file.parent / OVERRIDE_FILE] if args.toxiproxy == "islands" else [])
    placement = Placement(learners=(f"node.labels.{LEARNERS_LABEL} == true",) if args.spread_learners else ())
    try:
        text = dump_stack(render_stack(files, args.learners, placement=placement))
    except (ValueError, OSError) as exc:
        parser.error(f"--compose-file: {exc}")
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
