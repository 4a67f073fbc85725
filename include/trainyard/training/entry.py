"""Worker entry point for every strategy: ``-m trainyard.training.entry --config run.json``.

torchrun (ddp), horovodrun (horovod) and the deepspeed launcher all start this module; the strategy in
the run's JobSpec picks the loop."""

import argparse
import importlib
import sys

from trainyard.training.common import RunConfig

TRAINERS = {
    "ddp": "trainyard.training.trainer",
    "horovod": "trainyard.training.horovod_trainer",
    "deepspeed": "trainyard.training.deepspeed_trainer",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainyard.training.entry")
    parser.add_argument("--config", required=True, help="RunConfig JSON written by the train task")
    # The deepspeed launcher appends --local_rank=N; the rank also arrives in the environment.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cfg = RunConfig.load(args.config)
    strategy = cfg.spec.get("distributed", {}).get("strategy", "ddp")
    importlib.import_module(TRAINERS[strategy]).train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
