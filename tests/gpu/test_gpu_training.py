"""The GPU group (``make test-gpu``, or ``pytest -m gpu tests/gpu``): the worker's CUDA paths, for real.

Each run goes through what production runs: a RunConfig dumped to disk, the local launcher's ``launch``
(torchrun or horovodrun, argv and environment from the one command builder, this machine's
GPU count), the one worker loop with its strategy, then ``pipeline.export_onnx`` on the model.pt the GPUs
wrote, held to the recipe's parity gate on CPU onnxruntime. The evidence is what a run leaves behind: the
rank-0 log line (strategy, world size, backend, device, precision), NCCL's own log of every communicator
(which rank sits on which ``cudaDev``), train_result.json, the TensorBoard curve, DeepSpeed's checkpoint
files, the usage record and the export record.

"All GPUs" is ``torch.cuda.device_count()``: on a one-GPU machine (an H200 box) it is the one-GPU run,
trained once and asserted on by both tests. A DDP world of one has no process group (there is nothing to
average), so NCCL only shows up there through DeepSpeed, which always starts one.

Without a usable CUDA device every test is skipped, and the reason says what is missing. The pinned
requirements install the CPU build of torch on machines whose wheelhouse only has that one; a GPU machine
needs the CUDA build of the same version (see the Dockerfile's TORCH_VARIANT). A whole GPU run of the
group takes a few minutes: three trainings on one GPU (five on several), each a few seconds of GPU work
plus process start-up. With 2 GPUs or more a test also checks that DeepSpeed's workers train on the
GPUs CUDA_VISIBLE_DEVICES names (torchrun passes the variable through to them).
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from trainyard.data.prepare import PreparedData
from trainyard.spec import JobSpec, Tracking
from trainyard.training.loop import window_ends


def cuda_missing() -> str | None:
    """Why this machine cannot run the group, or None. Asks torch only: no CUDA context is created."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return (
            f"needs a CUDA GPU: torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); on a "
            f"GPU machine install the CUDA build of torch {torch.__version__.split('+')[0]} "
            "(https://download.pytorch.org/whl/<cuda variant>, e.g. cu128)"
        )
    return (
        f"needs a CUDA GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) finds none "
        "(no device or driver, or CUDA_VISIBLE_DEVICES hides them)"
    )


MISSING = cuda_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

LIMIT_S = 300  # per training: a hung NCCL collective fails the test (the launcher kills the workers)
EPOCHS = 4
HISTOGRAM_EVERY = 20  # steps between the weight and gradient histograms, copied beside the scalars
GLOBAL_BATCH = 32  # the per-rank batch shrinks with the world, so every world takes about the same steps
# Digits after 4 epochs of SGD at batch 32: ~0.97 val accuracy on CPU (fp32 and bf16); a broken device,
# precision or averaging path lands far below (an untrained model: ~0.1).
MIN_ACCURACY = 0.9
# GPU (TF32 convolutions, other kernels) vs CPU evaluation of the same weights: a few near-tie digits of
# the 336 in val may flip; a model.pt that is not the trained model differs by far more.
CROSS_DEVICE_ACCURACY = 0.015
NCCL_COMM = re.compile(r"rank (\d+) nranks (\d+) cudaDev (\d+)")
NCCL_NVML = re.compile(r"rank \d+ nranks \d+ cudaDev \d+ nvmlDev (\d+)")  # nvmlDev: the physical GPU
ZERO_PARTITION = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


def all_gpus() -> int:
    return torch.cuda.device_count()


@dataclass(frozen=True)
class Run:
    """One training's traces."""

    spec: JobSpec
    out: Path
    lines: list[str]
    result: dict
    nccl: str  # every worker's NCCL log (NCCL_DEBUG=INFO, INIT subsystem), one file per process

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def communicators(self) -> set[tuple[int, int, int]]:
        """(rank, nranks, cudaDev) of every NCCL communicator the workers created."""
        return {tuple(int(g) for g in m.groups()) for m in NCCL_COMM.finditer(self.nccl)}

    def check_trained(self, strategy: str, world: int, prepared: PreparedData) -> None:
        """train_result.json, the usage record and the model file of a complete run on ``world`` GPUs."""
        from trainyard.recipes import load_model
        from trainyard.training import usage

        r = self.result
        per_rank = math.ceil(prepared.counts["train"] / world)  # DistributedSampler pads to equal shards
        steps = EPOCHS * math.ceil(per_rank / self.spec.hyperparameters.batch_size)
        assert (r["strategy"], r["world_size"], r["epochs"], r["steps"]) == (strategy, world, EPOCHS, steps), r
        assert r["val_accuracy"] > MIN_ACCURACY, r
        tries = usage.tries(self.out)
        assert [(t["gpus"], t["where"]) for t in tries] == [(world, "local")], tries
        model = load_model(r["model_path"])  # a plain fp32 module on the CPU, whatever trained it
        assert {p.dtype for p in model.parameters()} == {torch.float32}


@contextlib.contextmanager
def deadline(seconds: int, what: str):
    """Raise in the main thread after ``seconds``: the launcher's interrupt path kills the worker group."""

    def expire(signum, frame):
        raise TimeoutError(f"{what} ran past {seconds}s (a hung NCCL collective?); its workers were killed")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _train(prepared: dict, out: Path, gpus: int, distributed: dict, env: dict[str, str]) -> Run:
    """One training in the run layout the pipeline gives every local run (``pipeline.plan_training``): the
    workers write in ``work/`` only (where a sandbox user may write), their metrics into a file there
    that the launcher's side relays to TensorBoard (``out/tb``), their histograms beside it."""
    from trainyard import pipeline
    from trainyard.spec import parse_spec
    from trainyard.training import metrics
    from trainyard.training.launchers import local
    from trainyard.training.run_config import RunConfig, work_dir

    spec = parse_spec(
        {
            "hyperparameters": {
                "epochs": EPOCHS,
                "batch_size": max(4, GLOBAL_BATCH // gpus),
                "learning_rate": 0.1,
                "seed": 3,
            },
            "distributed": distributed,
            "resources": {"gpus_per_node": gpus},
            "tracking": {"histogram_every_steps": HISTOGRAM_EVERY},
        }
    )
    work = Path(work_dir(str(out)))
    work.mkdir()
    cfg = RunConfig(
        spec=spec,
        data=prepared,
        out_dir=str(work),
        tensorboard_dir=str(out / "tb"),
        metrics_file=str(metrics.metrics_path(out)),
        histogram_dir=str(work / "tensorboard"),
    )
    config = cfg.dump(out / "run_config.json")
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        print(line)  # shown by pytest when the test fails

    # NCCL's init log, one file per process (%p: pid), so the lines of the ranks cannot interleave.
    nccl_env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", "NCCL_DEBUG_FILE": str(work / "nccl.%p.log")}
    what = f"{distributed} on {gpus} GPU(s) {env or ''}"
    with pytest.MonkeyPatch.context() as mp, deadline(LIMIT_S, what):
        for key, value in {**nccl_env, **env}.items():
            mp.setenv(key, value)  # launch() plans from this process's environment, as in production
        local.launch(spec, prepared, run_dir=str(out), config_path=str(config), on_line=on_line)
    metrics.relay(out, None, "", cfg.tensorboard_dir, on_line=on_line, final=True)
    metrics.copy_histograms(out, cfg.tensorboard_dir)
    result = pipeline.built_in_result(out)
    nccl = "\n".join(p.read_text(errors="replace") for p in sorted(work.glob("nccl.*.log")))
    return Run(spec, out, lines, result, nccl)


@pytest.fixture(scope="module")
def train(prepared, tmp_path_factory):
    """``train(gpus, env=None, **distributed) -> Run``: each distinct training once per module (a failure
    too, so every test that needs it reports the one failure instead of training again). ``env`` is added
    to the environment the launcher plans from."""
    runs: dict[tuple, Run | BaseException] = {}

    def get(gpus: int, env: dict[str, str] | None = None, **distributed) -> Run:
        env = env or {}
        key = (gpus, tuple(sorted(distributed.items())), tuple(sorted(env.items())))
        if key not in runs:
            name = "-".join([f"{gpus}gpu", *(str(v) for _, v in key[1])])
            try:
                runs[key] = _train(prepared, tmp_path_factory.mktemp(name), gpus, distributed, env)
            except Exception as err:  # noqa: BLE001 - kept and re-raised for each test that asks
                runs[key] = err
        run = runs[key]
        if isinstance(run, BaseException):
            raise run
        return run

    return get


DDP = {"strategy": "ddp"}
DDP_BF16 = {"strategy": "ddp", "precision": "bf16"}
DEEPSPEED = {"strategy": "deepspeed", "zero_stage": 2, "precision": "bf16"}


def test_ddp_on_one_gpu(train, prepared):
    """One worker on cuda:0, nccl chosen as the backend (a world of one starts no process group)."""
    run = train(1, **DDP)
    assert run.has("strategy=ddp world_size=1 backend=nccl device=cuda:0 precision=fp32"), run.log
    run.check_trained("ddp", 1, prepared)


def test_ddp_over_nccl_on_all_gpus(train, prepared):
    """One worker per GPU, rank r on cuda:r (its device set before its NCCL communicator); rank 0's
    background tracker writes the whole per-step curve from the loss tensors left on the GPU, and the
    GPU's memory and utilisation at every epoch's end."""
    from tensorboard.backend.event_processing.event_accumulator import HISTOGRAMS, EventAccumulator

    world = all_gpus()
    run = train(world, **DDP)
    assert run.has(f"strategy=ddp world_size={world} backend=nccl device=cuda:0 precision=fp32"), run.log
    run.check_trained("ddp", world, prepared)
    # a communicator per rank, on its own GPU; a world of one has no process group, so none (module docstring)
    expected = {(r, world, r) for r in range(world)} if world > 1 else set()
    assert run.communicators() == expected, f"NCCL communicators {sorted(run.communicators())}:\n{run.nccl}"
    events = EventAccumulator(str(run.out / "tb"), size_guidance={HISTOGRAMS: 0})  # 0: every histogram
    events.Reload()
    curve = [(e.step, e.value) for e in events.Scalars("train/loss")]
    steps, per_epoch = run.result["steps"], run.result["steps"] // run.result["epochs"]
    # a point per tracking.log_every_steps window (the default here) and per epoch end
    assert [s for s, _ in curve] == window_ends(steps, per_epoch, Tracking().log_every_steps)
    # the first window's mean (from chance, ~2.3 over 10 digits, downwards: 1.8 on CPU) against the last
    assert curve[-1][1] < curve[0][1] / 4, curve
    # per epoch, the most memory rank 0 held and how busy its GPU was (NVML, through nvidia-ml-py)
    held = [e.value for e in events.Scalars("gpu/memory_gb")]
    busy = [e.value for e in events.Scalars("gpu/utilization")]
    total_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    assert len(held) == run.result["epochs"] and all(0 < gb < total_gb for gb in held), held
    assert len(busy) == run.result["epochs"] and all(0 <= pct <= 100 for pct in busy), busy
    # throughput and time left at every point of the curve, the time left running down to zero
    rate = events.Scalars("samples/per_second")
    eta = [e.value for e in events.Scalars("eta/seconds")]
    assert [e.step for e in rate] == [s for s, _ in curve] and all(e.value > 0 for e in rate), rate
    assert len(eta) == len(curve) and eta[-1] == 0 and all(a >= 0 for a in eta), eta
    # the weights' and gradients' distributions of every layer, at HISTOGRAM_EVERY-th steps (the tracker
    # skips one while its thread still bins earlier ones: not necessarily at every such step)
    histograms = events.Tags()["histograms"]
    layers = {tag.split("/", 1)[1] for tag in histograms if tag.startswith("weights/")}
    assert layers and {f"gradients/{layer}" for layer in layers} <= set(histograms), histograms
    taken = [e.step for e in events.Histograms(f"weights/{sorted(layers)[0]}")]
    assert taken and set(taken) <= set(range(HISTOGRAM_EVERY, steps + 1, HISTOGRAM_EVERY)), taken


def test_bf16_autocast_on_all_gpus(train, prepared):
    """distributed.precision bf16 under DDP: the forward runs under CUDA autocast, model.pt stays fp32."""
    world = all_gpus()
    run = train(world, **DDP_BF16)
    assert run.has(f"strategy=ddp world_size={world} backend=nccl device=cuda:0 precision=bf16"), run.log
    run.check_trained("ddp", world, prepared)


def test_deepspeed_zero2_bf16_over_nccl_on_all_gpus(train, prepared):
    """DeepSpeed under torchrun on CUDA: a ZeRO-2 bf16 engine per GPU over NCCL (DeepSpeed starts a process
    group even for one GPU), its sharded checkpoints sealed, a plain fp32 model.pt."""
    from trainyard.training.strategies.deepspeed import MARKER

    world = all_gpus()
    run = train(world, **DEEPSPEED)
    head = f"strategy=deepspeed world_size={world} zero_stage=2 precision=bf16 backend=nccl device=cuda:0"
    assert run.has(head), run.log
    run.check_trained("deepspeed", world, prepared)
    missing = {(r, world, r) for r in range(world)} - run.communicators()
    assert not missing, f"no NCCL communicator (rank, nranks, cudaDev) {sorted(missing)}:\n{run.nccl}"
    tags = sorted(p for p in (run.out / "work" / "checkpoints").glob("step-*") if p.is_dir())
    assert tags and (tags[-1] / MARKER).is_file(), tags
    partitions = sorted(int(m.group(1)) for p in tags[-1].iterdir() if (m := ZERO_PARTITION.match(p.name)))
    assert partitions == list(range(world)), sorted(p.name for p in tags[-1].iterdir())


@pytest.mark.skipif(MISSING is None and all_gpus() < 2, reason="needs 2 GPUs: one to hide, one to train on")
def test_deepspeed_trains_on_the_gpus_cuda_visible_devices_names(train):
    """A scheduler (or a person) gives the job only the last GPU; DeepSpeed's worker must train there."""
    last = all_gpus() - 1
    # PCI bus order makes CUDA's numbering the NVML numbering that NCCL logs as nvmlDev.
    run = train(1, env={"CUDA_VISIBLE_DEVICES": str(last), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, **DEEPSPEED)
    used = {int(m.group(1)) for m in NCCL_NVML.finditer(run.nccl)}
    assert used == {last}, f"CUDA_VISIBLE_DEVICES={last}, but the worker's NCCL ran on GPU(s) {sorted(used)}"


@pytest.mark.parametrize(
    ("gpus", "distributed"),
    [(1, DDP), ("all", DDP_BF16), ("all", DEEPSPEED)],
    ids=["ddp-1gpu-fp32", "ddp-all-bf16", "deepspeed-zero2-bf16"],
)
def test_gpu_trained_model_passes_the_onnx_export_gate(train, prepared, gpus, distributed):
    """The pipeline's export step on a GPU-trained model.pt: ONNX on CPU onnxruntime within the recipe's
    parity gate and with the same val accuracy as PyTorch on CPU, which is the accuracy the GPUs measured."""
    from trainyard import pipeline

    run = train(all_gpus() if gpus == "all" else gpus, **distributed)
    trained = pipeline.TrainingResult(  # what collect_training would make of the run: the model is what matters
        mlflow_run_id="gpu-test",
        run_dir=str(run.out),
        tensorboard_dir=str(run.out / "tb"),
        wall_seconds=0.0,
        gpu_seconds=0.0,
        tries=1,
        cost=0.0,
        model_path=run.result["model_path"],
    )
    out = pipeline.export_onnx(run.spec, trained, prepared)
    parity = out.parity
    assert parity and parity["passed"] and parity["mismatched"] == 0 and parity["total"] > 0, parity
    assert parity["max_scaled_diff"] <= parity["rtol"], parity
    assert out.metric == "val_accuracy" and out.metric_onnx == out.metric_torch > MIN_ACCURACY, out
    assert abs(out.metric_torch - run.result["val_accuracy"]) <= CROSS_DEVICE_ACCURACY, (out, run.result)
    assert Path(out.onnx_path).is_file()


def test_bf16_forward_runs_in_bf16_on_the_workers_gpu(tmp_path, monkeypatch):
    """In this process, the DDP strategy a worker builds: cuda:0 made current, the forward under its
    autocast gives bf16 logits, the step keeps fp32 weights on the GPU. Last in the module: it is the only
    test that opens a CUDA context in the pytest process itself."""
    import torch.nn.functional as F

    from trainyard.spec import parse_spec
    from trainyard.training.model import SmallCNN
    from trainyard.training.run_config import RunConfig
    from trainyard.training.strategies.ddp import DDPStrategy

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)  # a world of one, as a single worker sees it
    spec = parse_spec({"distributed": {"strategy": "ddp", "precision": "bf16"}, "resources": {"gpus_per_node": 1}})
    strategy = DDPStrategy(RunConfig(spec=spec, out_dir=str(tmp_path)))
    strategy.init()
    try:
        assert (strategy.device, strategy.backend) == (torch.device("cuda", 0), "nccl")
        strategy.prepare(SmallCNN(10, 8, 8).to(strategy.device), total_steps=10)
        x = torch.rand(16, 1, 8, 8, device=strategy.device)
        y = torch.randint(0, 10, (16,), device=strategy.device)
        with strategy.autocast():
            logits = strategy.forward(x)
            loss = F.cross_entropy(logits.float(), y)
        assert logits.dtype == torch.bfloat16
        before = [p.detach().clone() for p in strategy.model.parameters()]
        norm = strategy.step(loss, want_norm=True)
        assert norm is not None and torch.isfinite(norm) and norm.device.type == "cuda"
        params = list(strategy.model.parameters())
        assert {(p.dtype, p.device) for p in params} == {(torch.float32, strategy.device)}
        assert any(not torch.equal(a, b) for a, b in zip(before, params, strict=True)), "the step changed no weight"
    finally:
        strategy.shutdown()
