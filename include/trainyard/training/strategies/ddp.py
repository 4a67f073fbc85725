"""``distributed.strategy: ddp``: torchrun workers, DistributedDataParallel (gloo on CPU, nccl on GPU).

The device is made current before the process group exists (NCCL binds to it). Every rank reads the
newest good checkpoint file itself (they are written atomically by rank 0, so all
ranks see the same newest file); DDP averages the gradients during backward.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainyard.training.strategies.base import TorchStrategy, cuda_device, start_all_reduce_mean


class DDPStrategy(TorchStrategy):
    name = "ddp"

    def init(self) -> None:
        self.rank, self.world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if torch.cuda.is_available():
            self.device, self.backend = cuda_device(int(os.environ.get("LOCAL_RANK", 0))), "nccl"
        if self.world > 1:  # a world of one has nothing to average: no process group, no DDP wrapper
            dist.init_process_group(self.backend, device_id=self.device if self.cuda else None)

    def wrap_model(self, model):
        if not dist.is_initialized():
            return model
        return DistributedDataParallel(model, device_ids=[self.device.index] if self.cuda else None)

    def start_mean(self, t, name="train_loss"):
        return start_all_reduce_mean(t, self.world)

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def load(self):
        state = self.load_file()
        if state is None:
            return None
        self.restore(state)
        return state["_path"], state

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
