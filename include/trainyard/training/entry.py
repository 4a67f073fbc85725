"""Worker entry point for every strategy: ``-m trainyard.training.entry --config run.json``.

torchrun (ddp, deepspeed) and horovodrun (horovod) start this module; the one loop
(:mod:`trainyard.training.loop`) runs with the strategy the run's JobSpec names."""

import argparse
import sys

from trainyard.training import strategies
from trainyard.training.loop import train
from trainyard.training.run_config import RunConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainyard.training.entry")
    parser.add_argument("--config", required=True, help="RunConfig JSON written by the train task")
    args = parser.parse_args(argv)
    cfg = RunConfig.load(args.config)
    train(cfg, strategies.for_run(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
