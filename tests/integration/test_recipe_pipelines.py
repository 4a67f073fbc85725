"""The detection, translation and ResNet recipes through train_pipeline (`dag.test()`): train with torchrun,
evaluate (mAP / BLEU), gate, export to ONNX with parity, sign and register; then champion/challenger
against the registered version, and both COCO evaluators on the trained model's own detections."""

import json
from pathlib import Path

import pytest
from dag_helpers import load_dag, task_states, xcoms

from trainyard.data.prepare import PreparedData

pytestmark = pytest.mark.integration

SHAPES = {
    "name": "shapes",
    "recipe": "centernet_detector",
    "dataset": {"repo": "shapes", "source": "synthetic_shapes"},
    "hyperparameters": {"epochs": 6, "batch_size": 16, "learning_rate": 0.003, "optimizer": "adamw", "seed": 42},
    "gates": [{"metric": "val_map_50", "min": 0.6}, {"metric": "val_map", "min": 0.3}],
    "export": {"metric_tolerance": 0.001},
}
TRANSLATION = {
    "name": "translation",
    "recipe": "transformer_translator",
    "dataset": {"repo": "translation", "source": "synthetic_translation"},
    "hyperparameters": {"epochs": 10, "batch_size": 32, "learning_rate": 0.003, "optimizer": "adamw", "seed": 42},
    # One process, one layer each side, no dropout (on CPU its random masks are most of a step), subwords
    # (the default): measured alone, val_bleu 90.9 after 10 epochs (30.6 after 5: the subword vocabulary,
    # 359 pieces against 51 words, takes longer to learn; whitespace words gave 75.5 after 5). The recipe's
    # other defaults are for real corpora; this synthetic one needs none of it.
    "recipe_options": {"dropout": 0.0, "layers": 1},
    "resources": {"gpus_per_node": 1},
    "gates": [{"metric": "val_bleu", "min": 50}],
    "export": {"metric_tolerance": 0.0, "torchscript": True},
}

PHOTOS = {
    "name": "photos",
    "recipe": "resnet_classifier",
    "dataset": {"repo": "photos", "source": "synthetic_photos"},
    "hyperparameters": {"epochs": 12, "batch_size": 32, "learning_rate": 0.003, "optimizer": "adamw", "seed": 42},
    "recipe_options": {"depth": 10, "width": 16, "image_size": 48},
    "resources": {"gpus_per_node": 1},
    "gates": [{"metric": "val_accuracy", "min": 0.85}, {"metric": "val_macro_f1", "min": 0.85}],
}


@pytest.fixture(scope="module")
def dag():
    return load_dag("train_pipeline")


def _run(dag, conf) -> tuple[dict, object]:
    dr = dag.test(run_conf=json.loads(json.dumps(conf)))
    states = task_states(dr)
    assert dr.state == "success", states
    from trainyard.tracking.mlflow_tracking import client

    c = client()
    mv = c.get_model_version_by_alias(conf["name"], "staging")
    return xcoms(dr), mv


def _common_checks(mv, x, metric):
    from trainyard.registry.signing import trusted_keys
    from trainyard.registry.versions import _stored, verify_version
    from trainyard.tracking.mlflow_tracking import client

    c = client()
    tags = mv.tags
    # the gate result is on the run and on the version: every check, and the verdict
    run_tags = c.get_run(mv.run_id).data.tags
    assert run_tags["gate.passed"] == tags["gate.passed"] == "true"
    gate = json.loads(tags["gate.result"])
    assert gate["passed"] and {r["metric"] for r in gate["checks"]} >= {metric}
    assert tags[f"gate.threshold.{metric}"].startswith("pass: value=")
    assert float(tags[f"metric.{metric}"]) == pytest.approx(x["evaluate"][metric], rel=1e-5)
    # ONNX export: parity on fixed inputs and the same metric through onnxruntime
    ex = x["export_onnx"]
    assert ex["parity"]["passed"] and ex["metric"] == metric and ex["metric_onnx"] == pytest.approx(ex["metric_torch"])
    # signed over every file of the version, the PyTorch weights included
    verify_version(c, mv.name, mv.version, trusted_keys())
    signed, _ = _stored(c.get_model_version(mv.name, mv.version))
    assert {"model.onnx", "pytorch/model.pt"} <= set(signed["files"])
    return c


def test_detection_recipe_end_to_end(dag, trainyard_home, monkeypatch):
    from trainyard import paths, pipeline, recipes
    from trainyard.evaluation.detection import coco_map
    from trainyard.recipes.detection import detections, ground_truth, torch_heads
    from trainyard.spec import JobSpec

    x, mv = _run(dag, SHAPES)
    assert x["evaluate"]["val_map_50"] >= 0.6 and 0.3 <= x["evaluate"]["val_map"] <= x["evaluate"]["val_map_50"]
    c = _common_checks(mv, x, "val_map")
    assert mv.tags["eval.coco_backend"] == "faster_coco_eval"  # the default evaluator

    from mlflow.models import get_model_info

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    sig = get_model_info(mv.source).signature
    assert [tuple(i["tensor-spec"]["shape"]) for i in sig.inputs.to_dict()] == [(-1, 3, 64, 64)]  # dynamic batch
    assert [o["name"] for o in sig.outputs.to_dict()] == ["heatmap", "size", "offset"]

    # pycocotools and faster-coco-eval on the trained model's own val detections: the same AP
    recipe = recipes.get("centernet_detector")
    xv, targets, meta = recipe._tensors(PreparedData.model_validate(x["prepare_data"]), "val")
    heads = torch_heads(recipes.load_model(x["train"]["model_path"]), xv)
    gt, found = ground_truth(targets, meta), detections(heads, targets, meta, top_k=50)
    a, b = coco_map(gt, found, backend="pycocotools"), coco_map(gt, found, backend="faster_coco_eval")
    assert a["map"] == pytest.approx(x["evaluate"]["val_map"])
    for key in a:
        assert (a[key] is None and b[key] is None) or a[key] == pytest.approx(b[key], abs=1e-9), key

    # champion/challenger: the registered version, re-measured through its ONNX file, ties with itself
    c.set_registered_model_alias("shapes", "production", mv.version)
    spec = JobSpec.model_validate({**x["validate_spec"], "champion": [{"metric": "val_map", "margin": 0.0}]})
    tie = pipeline.gate(spec, x["evaluate"], PreparedData.model_validate(x["prepare_data"]))
    assert tie["passed"] and tie["champion_version"] == int(mv.version)
    spec = JobSpec.model_validate({**x["validate_spec"], "champion": [{"metric": "val_map", "margin": 0.05}]})
    assert not pipeline.gate(spec, x["evaluate"], PreparedData.model_validate(x["prepare_data"]))["passed"]


def test_translation_recipe_end_to_end(dag, trainyard_home, tmp_path, monkeypatch):
    from trainyard import pipeline
    from trainyard.spec import JobSpec

    x, mv = _run(dag, TRANSLATION)
    assert x["evaluate"]["val_bleu"] >= 50 and x["evaluate"]["val_chrf"] > x["evaluate"]["val_bleu"] / 2
    c = _common_checks(mv, x, "val_bleu")
    # how BLEU was computed travels with the number
    assert mv.tags["eval.bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "nc:6|nw:0" in mv.tags["eval.chrf_signature"]
    # the seq2seq ONNX graph decodes exactly like PyTorch, sentence for sentence
    ex = x["export_onnx"]
    assert ex["details"] == {"decode_mismatches": 0, "decoded_sentences": x["prepare_data"]["counts"]["val"]}
    assert ex["torchscript_parity"]["passed"]
    from trainyard.registry.versions import _stored

    signed, _ = _stored(c.get_model_version(mv.name, mv.version))
    assert "torchscript/model.torchscript.pt" in signed["files"]  # the optional TorchScript file is signed too
    # the SentencePiece models of both sides are files of the version, signed with it, and decode as model.pt
    assert {"tokenizer/source.model", "tokenizer/target.model"} <= set(signed["files"])
    import mlflow
    import sentencepiece as spm

    from trainyard import paths, recipes

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    files = Path(mlflow.artifacts.download_artifacts(mv.source, dst_path=str(tmp_path)))
    target = spm.SentencePieceProcessor(model_file=str(files / "tokenizer" / "target.model"))
    model = recipes.load_model(x["train"]["model_path"])
    assert target.encode("the painters watch") == model.tgt_vocab.sp.encode("the painters watch")

    # champion = this version (ONNX decoding + its vocabularies from pytorch/model.pt): a tie passes
    c.set_registered_model_alias("translation", "production", mv.version)
    spec = JobSpec.model_validate({**x["validate_spec"], "champion": [{"metric": "val_bleu", "margin": 0.0}]})
    tie = pipeline.gate(spec, x["evaluate"], PreparedData.model_validate(x["prepare_data"]))
    assert tie["passed"], tie["message"]
    duel = [r for r in tie["checks"] if r["kind"] == "champion"][0]
    assert duel["champion"] == pytest.approx(x["evaluate"]["val_bleu"])


@pytest.mark.parametrize(
    "job, distributed, floor",
    [
        (SHAPES, {"strategy": "horovod"}, ("val_map_50", 0.2)),
        (TRANSLATION, {"strategy": "deepspeed", "zero_stage": 2}, ("val_token_accuracy", 0.3)),
    ],
    ids=["detection-horovod", "translation-deepspeed"],
)
def test_recipes_train_under_the_other_strategies(trainyard_home, job, distributed, floor):
    """The recipes are strategy-agnostic: the same JobSpec trains under Horovod and DeepSpeed ZeRO."""
    import torch

    from trainyard import pipeline, recipes

    raw = json.loads(json.dumps(job))
    raw["hyperparameters"]["epochs"] = 3
    raw["distributed"] = distributed
    raw["resources"] = {"gpus_per_node": 2}
    spec = pipeline.validate_spec(raw)
    ds = pipeline.resolve_dataset(spec)
    data = pipeline.prepare_data(spec, ds)
    trained = pipeline.train(spec, ds, data, "strategies")
    assert trained.strategy == distributed["strategy"] and trained.world_size == 2
    metric, minimum = floor
    assert trained.final_metrics[metric] > minimum, trained  # learned something (chance is ~0 for both)
    model = recipes.load_model(trained.model_path)  # a plain fp32 module whatever the strategy
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    headline = {"centernet_detector": {"val_map", "val_map_50"}, "transformer_translator": {"val_bleu", "val_chrf"}}
    assert set(pipeline.evaluate(spec, trained, data)) >= headline[spec.recipe]


def test_resnet_recipe_end_to_end_on_an_image_folder(dag, trainyard_home, monkeypatch):
    """Photo-like JPEG/PNG files of any size in a folder per class -> a ResNet that passes its gate,
    exported, signed and registered; champion/challenger through the version's own ONNX file."""
    from mlflow.models import get_model_info

    from trainyard import paths, pipeline
    from trainyard.spec import JobSpec

    x, mv = _run(dag, PHOTOS)
    ev = x["evaluate"]
    assert ev["val_accuracy"] >= 0.85 and ev["val_top5_accuracy"] == 1.0  # four classes: all in the top five
    assert x["validate_data"]["success"]
    c = _common_checks(mv, x, "val_accuracy")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    sig = get_model_info(mv.source).signature
    assert [tuple(i["tensor-spec"]["shape"]) for i in sig.inputs.to_dict()] == [(-1, 3, 48, 48)]
    c.set_registered_model_alias("photos", "production", mv.version)
    spec = JobSpec.model_validate({**x["validate_spec"], "champion": [{"metric": "val_accuracy", "margin": 0.0}]})
    tie = pipeline.gate(spec, ev, PreparedData.model_validate(x["prepare_data"]))
    assert tie["passed"], tie["message"]
