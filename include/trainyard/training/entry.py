"""Worker entry point for every strategy: ``-m trainyard.training.entry --config run.json``.

torchrun (ddp, deepspeed) and horovodrun (horovod) start this module; the one loop
(:mod:`trainyard.training.loop`) runs with the strategy the run's JobSpec names."""

import argparse
import os
import sys
from pathlib import Path

from trainyard import environment
from trainyard.files import atomic_write
from trainyard.training import strategies
from trainyard.training.loop import train
from trainyard.training.preemption import ON_SIGTERM_ENV
from trainyard.training.run_config import RunConfig

REPLAY_DIFFERENCES_FILE = "replay_differences.txt"  # in work/: a replay allowed to differ says how


def check_environment(cfg: RunConfig, installed: list[str], first: bool) -> None:
    """Before training: this trainer's dependency set, written by the first worker into ``work/``; in a
    replay that carries the version's set (a pod's), SystemExit naming each difference unless the spec's
    ``replay_exact`` is false (then the first worker writes them down)."""
    work = Path(cfg.out_dir)
    if first:
        atomic_write(work / environment.TRAINER_FILE, ("\n".join(installed) + "\n").encode())
    if cfg.replay_dependencies is None:
        return
    different = environment.differences(cfg.replay_dependencies, installed)
    if different and cfg.spec.replay_exact:
        raise SystemExit(
            f"this trainer's packages differ from those {cfg.spec.replay_of} trained with, so the replay would not "
            "be exact (`trainyard replay --allow-different` trains anyway): "
            + "; ".join(f"dependency {line}" for line in different)
        )
    if first:
        text = "\n".join(f"dependency {line}" for line in different) or "none"
        atomic_write(work / REPLAY_DIFFERENCES_FILE, (text + "\n").encode())


STOPPED_ON_SIGTERM_EXIT = 3  # a pod's workers stopped on SIGTERM, checkpointed: not a finished training


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainyard.training.entry")
    parser.add_argument("--config", required=True, help="RunConfig JSON written by the train task")
    args = parser.parse_args(argv)
    cfg = RunConfig.load(args.config)
    check_environment(cfg, environment.installed(), first=os.environ.get("RANK", "0") == "0")
    result = train(cfg, strategies.for_run(cfg))
    if result.get("preempted_at_step") is not None and os.environ.get(ON_SIGTERM_ENV) == "1":
        # A pod's workers stopped on SIGTERM (its eviction, or torchrun's restart of the group) did not finish:
        # torchrun restarts the nodes left (elastic) or the pod fails, and a pod 0 that succeeds has the result.
        return STOPPED_ON_SIGTERM_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
