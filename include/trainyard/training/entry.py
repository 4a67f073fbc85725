"""torchrun entry point: ``torchrun --nproc_per_node=N -m trainyard.training.entry --config run.json``."""

import argparse
import sys

from trainyard.training.trainer import RunConfig, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainyard.training.entry")
    parser.add_argument("--config", required=True, help="RunConfig JSON written by the train task")
    args = parser.parse_args(argv)
    train(RunConfig.load(args.config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
