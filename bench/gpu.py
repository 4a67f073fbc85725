"""The GPU, measured: a GPT-2-small-sized decoder trained in bf16 through trainyard's own worker loop
(``trainyard.training.loop.train`` with the ddp strategy, ``distributed.compile: true``, TensorBoard on),
against a plain PyTorch loop on the same model, data and settings; tokens/s of each, their ratio, and the
model FLOPs utilisation (MFU) of each.

Both sides: the same model class and initial weights, torch.compile, bf16 autocast, fused AdamW (lr 6e-4,
weight decay 0.1), a cosine schedule, batches of random tokens copied from pinned host memory. The timed
span is the same on both: from a device sync before step ``--warmup`` + 1 (the compile happens in the
steps before) to a device sync after the last step. MFU = tokens/s x FLOPs per token / the GPU's peak dense
bf16 rate (``--peak-tflops``, 989 for an H100/H200 SXM), counting 6N FLOPs per token (N: the parameters
less the position embeddings) and, as a second figure, 6N plus the attention's 12 x layers x width x
sequence length.

The device machine's image has torch but not pydantic, which trainyard's JobSpec needs. Carry wheels:

    scripts/device_wheels.sh            # here, once: gathers them into .whl/ (git-ignored)
    bash scripts/device_check.sh        # there, with carry [".whl"]: the GPU tests, then this benchmark

    python3 bench/gpu.py [--steps 120] [--warmup 20] [--batch 64] [--reps 1] [--out gpu.json]
    python3 bench/gpu.py --cpu-smoke     # a tiny model on the CPU, to show the code runs (the tests do this)

Where no CUDA GPU is present (and without ``--cpu-smoke``) it says it skipped (in ``--out`` too) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "include"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


@dataclass(frozen=True)
class Size:
    vocab: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64
    seq_len: int = 1024
    layers: int = 12
    heads: int = 12
    width: int = 768


GPT2_SMALL = Size()
TINY = Size(vocab=256, seq_len=32, layers=2, heads=2, width=32)


class Block(nn.Module):
    def __init__(self, size: Size) -> None:
        super().__init__()
        self.heads = size.heads
        self.ln1, self.ln2 = nn.LayerNorm(size.width), nn.LayerNorm(size.width)
        self.qkv = nn.Linear(size.width, 3 * size.width)
        self.proj = nn.Linear(size.width, size.width)
        self.fc = nn.Linear(size.width, 4 * size.width)
        self.out = nn.Linear(4 * size.width, size.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash attention on the GPU
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """A GPT-2-style decoder: learned positions, pre-norm blocks, the output head tied to the embedding."""

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.size, self.config = size, asdict(size)
        self.tokens = nn.Embedding(size.vocab, size.width)
        self.positions = nn.Embedding(size.seq_len, size.width)
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.ln = nn.LayerNorm(size.width)
        self.head = nn.Linear(size.width, size.vocab, bias=False)
        self.head.weight = self.tokens.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2's init: N(0, 0.02), residual projections scaled by the depth
                std = 0.02 / math.sqrt(2 * size.layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def flops_per_token(self) -> tuple[float, float]:
        """(6N, 6N + attention): N counts every parameter once (the tied head too) less the positions."""
        n = sum(p.numel() for p in self.parameters()) - self.positions.weight.numel()
        s = self.size
        return 6.0 * n, 6.0 * n + 12.0 * s.layers * s.width * s.seq_len


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), y.reshape(-1))


def token_rows(size: Size, rows: int, seed: int) -> torch.Tensor:
    """Random token sequences of seq_len + 1 (input and next-token target), int64, on the host."""
    return torch.randint(size.vocab, (rows, size.seq_len + 1), generator=torch.Generator().manual_seed(seed))


class Tokens(torch.utils.data.Dataset):
    """The loop's batches: ``__getitems__`` hands the DataLoader a whole batch (trainyard's convention)."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, indices):
        batch = self.rows[torch.as_tensor(indices)]
        return [batch[:, :-1], batch[:, 1:]]


class Clock:
    """The timed span: a device sync before the first timed step and after the last."""

    def __init__(self, device: torch.device, warmup: int) -> None:
        self.device, self.warmup, self.steps, self.t0, self.t1 = device, warmup, 0, 0.0, 0.0

    def sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def step(self) -> None:
        if self.steps == self.warmup:
            self.t0 = self.sync()
        self.steps += 1

    def stop(self) -> None:
        if not self.t1:
            self.t1 = self.sync()

    def timed_steps(self) -> int:
        return self.steps - self.warmup


def trainyard_recipe(size: Size, rows: torch.Tensor, clock: Clock):
    """A recipe object for the loop: the model, the loss and the data above; timing marks from the loss
    (before the first timed step) and from the validation the loop runs after the epoch (after the last)."""
    from trainyard.recipes.base import Options, Recipe

    class CausalLM(Recipe[Options]):
        name = "gpt_bench"
        options_model = Options

        def load(self, cfg):
            return Tokens(rows), None, {}

        def build_model(self, meta, options):
            torch.manual_seed(0)
            return GPT(size)

        def loss(self, model, batch):
            clock.step()
            return lm_loss(model, *batch)

        def val_metrics(self, model, val, device, dtype=torch.float32):
            clock.stop()
            return {}

    return CausalLM()


def run_trainyard(size: Size, args: argparse.Namespace, device: torch.device, out: Path) -> dict:
    from trainyard.spec import parse_spec
    from trainyard.training import strategies
    from trainyard.training.loop import train
    from trainyard.training.run_config import RunConfig

    steps = args.warmup + args.steps
    rows = token_rows(size, steps * args.batch, seed=1)
    clock = Clock(device, args.warmup)
    spec = parse_spec(
        {
            "hyperparameters": {
                "epochs": 1,
                "batch_size": args.batch,
                "optimizer": "adamw",
                "learning_rate": 6e-4,
                "weight_decay": 0.1,
            },
            "distributed": {"strategy": "ddp", "precision": args.precision, "compile": args.compile},
            "checkpointing": {"every_steps": steps + 1},  # none inside the timed span
            "resources": {"gpus_per_node": 1, "gpu_type": "cpu" if device.type == "cpu" else "h100-80gb"},
        }
    )
    cfg = RunConfig(spec=spec, out_dir=str(out), tensorboard_dir=str(out / "tb"))
    train(cfg, strategies.for_run(cfg), trainyard_recipe(size, rows, clock))
    return {"steps": clock.timed_steps(), "seconds": clock.t1 - clock.t0}


def run_hand(size: Size, args: argparse.Namespace, device: torch.device) -> dict:
    """What someone would write by hand (nanoGPT's way): pinned batches, compile, autocast, fused AdamW."""
    steps = args.warmup + args.steps
    rows = token_rows(size, steps * args.batch, seed=1)
    torch.manual_seed(0)
    model = GPT(size).to(device)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True if cuda else None)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    forward = torch.compile(model) if args.compile else model
    dtype = {"bf16": torch.bfloat16, "fp32": None}[args.precision]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(2))
    clock = Clock(device, args.warmup)
    for i in range(steps):
        batch = rows[order[i * args.batch : (i + 1) * args.batch]]
        if cuda:
            batch = batch.pin_memory()
        batch = batch.to(device, non_blocking=True)
        clock.step()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = lm_loss(forward, batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    clock.stop()
    return {"steps": clock.timed_steps(), "seconds": clock.t1 - clock.t0, "last_loss": float(loss.detach())}


def side(args: argparse.Namespace) -> None:
    """One measurement in this process (a fresh process per side: no compiled graph or allocator shared)."""
    size = TINY if args.cpu_smoke else GPT2_SMALL
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        got = run_hand(size, args, device) if args.side == "hand" else run_trainyard(size, args, device, Path(tmp))
    tokens = got["steps"] * args.batch * size.seq_len
    flops = GPT(size).flops_per_token()
    got.update(tokens_per_s=tokens / got["seconds"], flops_per_token=flops)
    Path(args.result).write_text(json.dumps(got))


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first (the compile happens here)")
    parser.add_argument("--batch", type=int, default=64, help="sequences per step (1024 tokens each)")
    parser.add_argument("--reps", type=int, default=1, help="runs a side, alternating hand / trainyard")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's peak dense bf16 TFLOP/s")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="eager on both sides")
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny model on the CPU: the code runs")
    parser.add_argument("--out", help="also write the figures to this file (JSON)")
    parser.add_argument("--side", choices=["hand", "trainyard"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side(args)
        return
    if args.cpu_smoke:
        args.steps, args.warmup, args.batch = min(args.steps, 4), min(args.warmup, 2), min(args.batch, 4)
    elif not torch.cuda.is_available():
        report = {"skipped": "no CUDA GPU on this machine (bench/gpu.py is for the device machine)", **machine()}
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"skipped: {report['skipped']}")
        return

    side_args = [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--batch={args.batch}"]
    side_args += [f"--precision={args.precision}", *(["--cpu-smoke"] if args.cpu_smoke else [])]
    side_args += [] if args.compile else ["--no-compile"]
    runs: dict[str, list[dict]] = {"hand": [], "trainyard": []}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        for rep in range(args.reps):
            for name in ("hand", "trainyard"):
                result = Path(tmp) / f"{name}-{rep}.json"
                argv = [sys.executable, __file__, *side_args, "--side", name, "--result", str(result)]
                subprocess.run(argv, check=True, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
                runs[name].append(json.loads(result.read_text()))
    best = {name: max(r["tokens_per_s"] for r in rs) for name, rs in runs.items()}
    six_n, with_attention = runs["hand"][0]["flops_per_token"]
    peak = args.peak_tflops * 1e12
    report = {
        **machine(),
        "model": "cpu-smoke (tiny)" if args.cpu_smoke else "GPT-2 small (124M), sequence 1024",
        "batch": args.batch,
        "precision": args.precision,
        "compile": args.compile,
        "timed_steps": args.steps,
        "runs": runs,
        "tokens_per_s": best,
        "ratio": best["trainyard"] / best["hand"],
        "mfu_6n": {k: v * six_n / peak for k, v in best.items()},
        "mfu_with_attention": {k: v * with_attention / peak for k, v in best.items()},
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(
        f"{report['model']}, batch {args.batch}, {args.precision}, compile {args.compile}, best of {args.reps}:\n"
        f"  hand       {best['hand']:10.0f} tokens/s  MFU {report['mfu_6n']['hand']:.1%} (6N), "
        f"{report['mfu_with_attention']['hand']:.1%} (with attention)\n"
        f"  trainyard  {best['trainyard']:10.0f} tokens/s  MFU {report['mfu_6n']['trainyard']:.1%} (6N), "
        f"{report['mfu_with_attention']['trainyard']:.1%} (with attention)\n"
        f"  ratio {report['ratio']:.3f}x"
    )


if __name__ == "__main__":
    main()
