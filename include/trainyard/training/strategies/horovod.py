"""``distributed.strategy: horovod``: horovodrun workers (or torchrun's on Kubernetes), Gloo, and
``hvd.DistributedOptimizer``, which averages the gradients with allreduce hooks during backward, like DDP.

Rank 0 alone reads the newest checkpoint and broadcasts the weights, optimizer state and data position,
so the workers can never disagree on where they resume. GPU tensors need a Horovod built with NCCL; the
CPU (Gloo-only) build trains on the CPU, where fp16 is refused (see ``precision``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import torch

from trainyard.training.strategies.base import TorchStrategy, cuda_device


def import_horovod():
    try:
        import horovod.torch as hvd
    except ImportError as err:  # pragma: no cover - depends on the machine
        raise ImportError(
            f"distributed.strategy 'horovod' needs horovod.torch ({err}); build it into the venv with "
            "scripts/build_horovod.sh"
        ) from err
    return hvd


def _gloo_env_from_torchrun() -> None:
    """On Kubernetes there is no horovodrun (it needs ssh): torchrun starts the workers, and this maps its
    environment onto Horovod's gloo bootstrap (HOROVOD_RANK, ... and an HTTP rendezvous server run by
    rank 0 on HOROVOD_GLOO_RENDEZVOUS_PORT). Under horovodrun, HOROVOD_RANK is already set and this is a no-op."""
    if "HOROVOD_RANK" in os.environ or "GROUP_RANK" not in os.environ:
        return
    rank = int(os.environ["RANK"])
    os.environ.update(
        HOROVOD_RANK=os.environ["RANK"],
        HOROVOD_LOCAL_RANK=os.environ["LOCAL_RANK"],
        HOROVOD_CROSS_RANK=os.environ["GROUP_RANK"],
        HOROVOD_HOSTNAME=socket.gethostname(),
        HOROVOD_GLOO_RENDEZVOUS_ADDR=os.environ["MASTER_ADDR"],
    )
    port = int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    if rank == 0:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return
    deadline = time.time() + 120
    while True:
        try:
            socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=2).close()
            return
        except OSError as err:
            if time.time() > deadline:
                raise RuntimeError(
                    f"Horovod rendezvous server {os.environ['MASTER_ADDR']}:{port} never came up"
                ) from err
            time.sleep(0.2)


class HorovodStrategy(TorchStrategy):
    name = "horovod"
    opt: Any  # Horovod's DistributedOptimizer (untyped): torch's optimizer plus synchronize / skip_synchronize

    def init(self) -> None:
        hvd = self.hvd = import_horovod()
        _gloo_env_from_torchrun()
        # The device before hvd.init(), as for every GPU path; which rank is local comes from the launcher.
        local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("LOCAL_RANK", 0)))
        if torch.cuda.is_available() and hvd.nccl_built():
            self.device, self.backend = cuda_device(local_rank), "nccl"
        hvd.init()
        self.rank, self.world = hvd.rank(), hvd.size()

    def wrap_optimizer(self, opt, model):
        return self.hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    def zero_grad(self) -> None:
        self.opt.zero_grad()  # Horovod's override takes no set_to_none (torch's default is already None)

    def averaged(self) -> None:
        self.opt.synchronize()  # the averaged gradients, so the norm and the unscale see what is applied

    def optimizer_step(self) -> None:
        with self.opt.skip_synchronize():
            super().optimizer_step()

    def start_mean(self, t, name="train_loss"):
        handle = self.hvd.allreduce_async(t.detach(), op=self.hvd.Average, name=name)
        return lambda: self.hvd.synchronize(handle)

    def barrier(self) -> None:
        self.hvd.barrier()

    def load(self):
        hvd = self.hvd
        state = self.load_file() if self.rank == 0 else None
        if state is not None:
            self.restore(state)
        position = None
        if state is not None:
            position = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
        position = hvd.broadcast_object(position, root_rank=0, name="resume_position")
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.opt, root_rank=0)
        if position is None:
            return None
        self.sched.load_state_dict(position["scheduler"])
        if self.scaler is not None and "scaler" in position:
            self.scaler.load_state_dict(position["scaler"])
        return position["_path"], position

    def shutdown(self) -> None:
        self.hvd.barrier()  # the others wait for rank 0's model and result before Horovod goes down
        self.hvd.shutdown()
