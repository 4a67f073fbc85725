"""Inference: onnxruntime against eager PyTorch for each recipe's model, batch 1 and 32, 1 and 2 threads.

Each recipe's model at its default options (untrained weights: speed does not depend on them) is exported
with trainyard's exporter (``trainyard.export.onnx_export.export``, dynamic batch, as the recipes export)
and run on the same inputs by ``torch.no_grad()`` eager PyTorch and by an onnxruntime session. Each
thread count runs in its own process with ``OMP_NUM_THREADS`` set, which both runtimes follow (torch
natively, onnxruntime through ``onnx_session``). Per case: the median latency of ``--iters`` calls
after a warm-up, alternating the two runtimes in rounds; a ratio above 1 means onnxruntime is faster.
The translation model is timed for one decoding step (the source and a 16-token prefix) and for a whole
greedy decoding (31 steps, each re-running the encoder and the prefix, in both runtimes).

    .venv/bin/python bench/inference.py [--threads 1 2] [--batches 1 32] [--iters 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from child_process import child_result


def cases():
    """name -> (model, {input name: example of batch 2 (1 would be taken for a fixed size)}, dynamic shapes)."""
    import torch

    from trainyard.training.centernet import CenterNet
    from trainyard.training.model import SmallCNN
    from trainyard.training.resnet import ResNet
    from trainyard.training.seq2seq import Seq2SeqTransformer

    batch = torch.export.Dim("batch", min=1, max=65536)
    torch.manual_seed(0)
    src_len, tgt_len = torch.export.Dim("src_len", min=2, max=32), torch.export.Dim("tgt_len", min=1, max=32)
    return {
        "digits_cnn (8x8)": (SmallCNN(10, 8, 8), {"input": torch.rand(2, 1, 8, 8)}, {"x": {0: batch}}),
        "centernet_detector (64 px)": (CenterNet(3, 64, 32), {"image": torch.rand(2, 3, 64, 64)}, {"x": {0: batch}}),
        "resnet_classifier (ResNet-18, 64 px)": (
            ResNet(10, depth=18, width=64, image_size=64),
            {"input": torch.rand(2, 3, 64, 64)},
            {"x": {0: batch}},
        ),
        "transformer_translator (one decoding step)": (
            Seq2SeqTransformer(1000, 1000, 64, 4, 2, 128, 32, 0.1),
            {"src": torch.randint(4, 1000, (2, 32)), "tgt": torch.randint(4, 1000, (2, 16))},
            {"src": {0: batch, 1: src_len}, "tgt": {0: batch, 1: tgt_len}},
        ),
    }


def greedy(model, session, src, reps: int) -> dict:
    """Greedy decoding of ``src`` to the model's max_len (untrained: no row stops early) in both runtimes."""
    import torch

    from trainyard.training.seq2seq import greedy_decode

    def torch_step(s, p):
        with torch.no_grad():
            return model(torch.from_numpy(s), torch.from_numpy(p)).numpy()

    def onnx_step(s, p):
        return session.run(None, {"src": s, "tgt": p})[0]

    n = model.config["max_len"]
    times: dict[str, list[float]] = {"torch": [], "onnx": []}
    for _ in range(reps):
        for key, step in (("torch", torch_step), ("onnx", onnx_step)):
            t0 = time.perf_counter()
            greedy_decode(step, src, n)
            times[key].append(time.perf_counter() - t0)
    return {
        "model": f"transformer_translator (greedy, {n - 1} tokens)",
        "batch": len(src),
        "torch_ms": statistics.median(times["torch"]) * 1e3,
        "onnx_ms": statistics.median(times["onnx"]) * 1e3,
    }


def child(batches: list[int], iters: int) -> None:
    import torch

    from trainyard.export.onnx_export import export, onnx_session

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, example, dims) in cases().items():
            model.eval()
            path = export(
                model,
                tuple(example.values()),
                Path(tmp) / "m.onnx",
                input_names=tuple(example),
                output_names=("out",),
                dynamic_shapes=dims,
            )
            session = onnx_session(path)
            for b in batches:
                feeds = {k: v[:1].repeat(b, *([1] * (v.ndim - 1))) for k, v in example.items()}
                np_feeds = {k: v.numpy() for k, v in feeds.items()}
                args = tuple(feeds.values())

                def run_torch(model=model, args=args):
                    with torch.no_grad():
                        model(*args)

                def run_onnx(session=session, np_feeds=np_feeds):
                    session.run(None, np_feeds)

                for _ in range(5):
                    run_torch()
                    run_onnx()
                times: dict[str, list[float]] = {"torch": [], "onnx": []}
                for _ in range(iters):
                    for key, fn in (("torch", run_torch), ("onnx", run_onnx)):
                        t0 = time.perf_counter()
                        fn()
                        times[key].append(time.perf_counter() - t0)
                t, o = statistics.median(times["torch"]), statistics.median(times["onnx"])
                out.append({"model": name, "batch": b, "torch_ms": t * 1e3, "onnx_ms": o * 1e3})
                if "src" in example:
                    out.append(greedy(model, session, np_feeds["src"], max(iters // 10, 3)))
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.batches, args.iters)
        return
    print(f"{'model':45} {'threads':>7} {'batch':>5} {'torch ms':>9} {'onnx ms':>9}  onnxruntime vs torch")
    for threads in args.threads:
        argv = [__file__, "--child", "--iters", str(args.iters), "--batches", *map(str, args.batches)]
        for r in child_result(argv, {**os.environ, "OMP_NUM_THREADS": str(threads)}):
            ratio = r["torch_ms"] / r["onnx_ms"]
            print(
                f"{r['model']:45} {threads:>7} {r['batch']:>5} {r['torch_ms']:>9.3f} {r['onnx_ms']:>9.3f}  "
                f"{ratio:.2f}x {'faster' if ratio >= 1 else 'SLOWER'}",
                flush=True,
            )


if __name__ == "__main__":
    main()
