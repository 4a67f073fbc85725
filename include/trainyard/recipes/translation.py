"""``transformer_translator``: translation on parallel text with a small encoder-decoder transformer.

Data: any dataset commit in the parallel-text layout of :mod:`trainyard.data.parallel_text`
(``pairs.tsv`` or ``pairs.jsonl``): the built-in synthetic language pair or a user's corpus. Text is
cut into BPE subwords by a SentencePiece model per side, learned from the train split only
(``tokenizer: bpe``, the default: an unseen word is spelled in known pieces), or into whitespace words
(``tokenizer: words``: an unseen word becomes ``<unk>``). The vocabularies travel inside model.pt, and
the SentencePiece models are also registered as files next to the ONNX one (``tokenizer/source.model``,
``tokenizer/target.model``), readable by any SentencePiece runtime. BLEU scores the decoded, detokenized
text against the references as written.

Evaluation decodes greedily and scores corpus BLEU and chrF with sacrebleu, recording both signatures
(tokenizer ``bleu_tokenize``, default 13a). The ONNX file is the one-step graph (src, tgt prefix) ->
logits with dynamic batch and lengths; the export check compares the logits, the greedy decoding token
for token, and BLEU re-computed with onnxruntime doing the decoding.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from trainyard.recipes.base import Options, Recipe
from trainyard.recipes.shared import companion_model, read_split, save_input_example, verify_export
from trainyard.training.common import to_device

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData

BATCH = 256


def sentences(records, side: str, batch: int = 4096) -> Iterator[str]:
    """One side ("source" or "target") of every pair of a split, read ``batch`` records at a time."""
    from trainyard.data.records import batches

    for part in batches(records, batch):
        for pair in part.targets:
            yield pair[side]


def encode(vocab, sentences: list[str], max_len: int) -> torch.Tensor:
    """Sentences -> (N, max_len) ids, BOS and EOS added, padded: the one encoding of training, evaluation
    and export."""
    from trainyard.training.seq2seq import pad

    return torch.from_numpy(pad([vocab.encode(s, max_len) for s in sentences], max_len))


def pairs_batch(batch, src_vocab, tgt_vocab, max_len: int) -> list[torch.Tensor]:
    """A RecordBatch of sentence pairs -> [source ids, target ids], each (N, max_len) padded."""
    src = encode(src_vocab, [t["source"] for t in batch.targets], max_len)
    return [src, encode(tgt_vocab, [t["target"] for t in batch.targets], max_len)]


class TranslationOptions(Options):
    """``recipe_options`` of transformer_translator."""

    d_model: int = Field(64, ge=1, le=4096, description="width of the transformer, a multiple of nhead")
    nhead: int = Field(4, ge=1, le=64, description="attention heads")
    layers: int = Field(2, ge=1, le=24, description="encoder and decoder layers each, in 1..24")
    ff: int = Field(128, ge=1, le=65536, description="width of the feed-forward blocks")
    max_len: int = Field(32, ge=4, le=512, description="tokens per sentence (longer ones are cut), in 4..512")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout probability")
    tokenizer: Literal["bpe", "words"] = Field(
        "bpe", description="bpe: SentencePiece subwords learned from the train split; words: whitespace words"
    )
    max_vocab: int = Field(
        10000, ge=8, le=1_000_000, description="subwords (or words) per vocabulary, learned from the train split"
    )
    bleu_tokenize: str = Field("13a", description="sacrebleu's BLEU tokenizer (e.g. 13a, intl, zh, char, none)")

    @field_validator("bleu_tokenize")
    @classmethod
    def _known_tokenizer(cls, name: str) -> str:
        from sacrebleu.metrics.bleu import _TOKENIZERS

        if name not in _TOKENIZERS:
            raise ValueError(f"must be a sacrebleu tokenizer, one of {sorted(_TOKENIZERS)}")
        return name

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TranslationOptions:
        if self.d_model % self.nhead:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of nhead ({self.nhead})")
        return self


class TransformerTranslator(Recipe[TranslationOptions]):
    name = "transformer_translator"
    data_kind = "parallel_text"
    options_model = TranslationOptions
    metrics = ("bleu", "chrf")
    epoch_metrics = ("loss", "token_accuracy")

    # -- data ----------------------------------------------------------------------------------------------
    def validate(self, dataset_dir, docs_dir):
        from trainyard.data.parallel_text import validate_parallel_text

        return validate_parallel_text(dataset_dir, docs_dir=docs_dir)

    def samples(self, dataset_dir, options):
        from trainyard.data.parallel_text import load_pairs

        pairs = {p.key: p for p in load_pairs(dataset_dir)}
        empty = np.zeros((0, 0), dtype=np.uint8)  # text records carry no array

        def record(key: str) -> tuple:
            return key, 0, empty, {"source": pairs[key].source, "target": pairs[key].target}

        return list(pairs), record, {"kind": self.data_kind}

    # -- training ------------------------------------------------------------------------------------------
    @staticmethod
    def pairs(data: PreparedData, split: str) -> tuple[list[str], list[str]]:
        targets = read_split(data, split)[4]
        return [t["source"] for t in targets], [t["target"] for t in targets]

    def load(self, cfg):
        from trainyard.training.data import RecordDataset, load_split
        from trainyard.training.seq2seq import run_vocab

        opts = self.opts(cfg.spec)
        cache_mb = cfg.spec.dataset.memory_cache_mb
        train, val = load_split(cfg.data, "train", cache_mb), load_split(cfg.data, "val", cache_mb)
        # learned once per run from the whole train split (the first rank; the others read its file)
        seed = cfg.spec.hyperparameters.seed
        digest = hashlib.sha256(cfg.data.train.encode()).hexdigest()[:12]

        def vocab(side: str):
            cache = Path(cfg.out_dir) / "vocab" / f"{side}-{opts.tokenizer}-{opts.max_vocab}-{seed}-{digest}"
            return run_vocab(opts.tokenizer, lambda: sentences(train, side), opts.max_vocab, seed, cache)

        src_vocab, tgt_vocab = vocab("source"), vocab("target")
        meta = {"tokenizer": opts.tokenizer, "src_vocab": src_vocab, "tgt_vocab": tgt_vocab}
        collate = functools.partial(pairs_batch, src_vocab=src_vocab, tgt_vocab=tgt_vocab, max_len=opts.max_len)
        return RecordDataset(train, collate), RecordDataset(val, collate), meta

    def build_model(self, meta, options: TranslationOptions):
        from trainyard.training.seq2seq import Seq2SeqTransformer

        return Seq2SeqTransformer(
            len(meta["src_vocab"]),
            len(meta["tgt_vocab"]),
            options.d_model,
            options.nhead,
            options.layers,
            options.ff,
            options.max_len,
            options.dropout,
        )

    def loss(self, model, batch):
        from trainyard.training.seq2seq import loss

        src, tgt = batch
        return loss(model(src, tgt[:, :-1]), tgt[:, 1:])

    def val_metrics(self, model, val, device, dtype=torch.float32):
        """Teacher-forced loss and next-token accuracy (cheap, every epoch); BLEU comes at evaluation."""
        from trainyard.training.seq2seq import PAD, loss

        was_training = model.training
        model.eval()
        total, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for batch in val.batches(BATCH):
                s, t = to_device(batch, device, dtype)
                logits = model(s, t[:, :-1]).float()
                gold = t[:, 1:]
                keep = gold != PAD
                total += float(loss(logits, gold)) * int(keep.sum())
                correct += int(((logits.argmax(-1) == gold) & keep).sum())
                count += int(keep.sum())
        model.train(was_training)
        return {"val_loss": total / max(count, 1), "val_token_accuracy": correct / max(count, 1)}

    def model_blob(self, model, meta):
        vocab = {"kind": meta["tokenizer"], "source": meta["src_vocab"].state(), "target": meta["tgt_vocab"].state()}
        return {**super().model_blob(model, meta), "vocab": vocab}

    def model_from_blob(self, blob):
        from trainyard.training.seq2seq import Seq2SeqTransformer, make_vocab

        model = Seq2SeqTransformer(**blob["config"])
        model.load_state_dict(blob["state_dict"])
        kind = blob["vocab"].get("kind", "words")  # versions registered before subwords hold word lists
        model.src_vocab = make_vocab(kind, blob["vocab"]["source"])
        model.tgt_vocab = make_vocab(kind, blob["vocab"]["target"])
        return model.eval()

    # -- evaluation and export -----------------------------------------------------------------------------
    @staticmethod
    def torch_step(model):
        def step(src: np.ndarray, prefix: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return model(torch.from_numpy(src), torch.from_numpy(prefix)).numpy()

        return step

    @staticmethod
    def onnx_step(session):
        return lambda src, prefix: session.run(None, {"src": src, "tgt": prefix})[0]

    @staticmethod
    def translate(step, model, src: np.ndarray) -> np.ndarray:
        """Greedy token ids for every row of ``src``, in batches, padded to one width."""
        from trainyard.training.seq2seq import PAD, greedy_decode

        n = model.config["max_len"]
        parts = [greedy_decode(step, src[i : i + BATCH], n) for i in range(0, len(src), BATCH)]
        out = np.full((len(src), max((p.shape[1] for p in parts), default=0)), PAD, dtype=np.int64)
        for i, p in zip(range(0, len(src), BATCH), parts, strict=True):
            out[i : i + len(p), : p.shape[1]] = p
        return out

    def _scores(
        self, model, ids: np.ndarray, references: list[str], split: str, options: TranslationOptions
    ) -> tuple[dict, dict]:
        from trainyard.evaluation.translation import corpus_scores

        hyps = [model.tgt_vocab.decode(row) for row in ids]
        s = corpus_scores(hyps, references, tokenize=options.bleu_tokenize)
        info = {k: s[k] for k in ("bleu_signature", "chrf_signature", "tokenizer")}
        return {f"{split}_bleu": s["bleu"], f"{split}_chrf": s["chrf"]}, info

    def _source_ids(self, model, data, split) -> tuple[np.ndarray, list[str]]:
        src, refs = self.pairs(data, split)
        return encode(model.src_vocab, src, model.config["max_len"]).numpy(), refs

    def evaluate(self, model_path, data, split, options):
        from trainyard.recipes import load_model

        model = load_model(model_path)
        src, refs = self._source_ids(model, data, split)
        return self._scores(model, self.translate(self.torch_step(model), model, src), refs, split, options)

    def export(self, model_path, data, out_dir, export, options):
        from trainyard.export.onnx_export import export as to_onnx
        from trainyard.export.onnx_export import onnx_session
        from trainyard.recipes import load_model

        model = load_model(model_path)
        n = model.config["max_len"]
        src, refs = self._source_ids(model, data, "val")
        tgt = encode(model.tgt_vocab, refs, n).numpy()
        dims = {
            "src": {0: torch.export.Dim("batch", min=1, max=65536), 1: torch.export.Dim("src_len", min=2, max=n)},
            "tgt": {0: torch.export.Dim("batch", min=1, max=65536), 1: torch.export.Dim("tgt_len", min=1, max=n)},
        }
        example = (torch.from_numpy(src[:2]), torch.from_numpy(tgt[:2, :-1]))
        onnx_path = to_onnx(
            model,
            example,
            Path(out_dir) / "model.onnx",
            input_names=("src", "tgt"),
            output_names=("logits",),
            dynamic_shapes=dims,
        )
        session = onnx_session(onnx_path)
        fixed_src, fixed_tgt = src[:32], tgt[:32, :-1]
        logits_torch = self.torch_step(model)(fixed_src, fixed_tgt)
        logits_onnx = self.onnx_step(session)(fixed_src, fixed_tgt)
        ids_torch = self.translate(self.torch_step(model), model, src)
        ids_onnx = self.translate(self.onnx_step(session), model, src)
        if ids_torch.shape == ids_onnx.shape:
            differ = int(sum(not np.array_equal(a, b) for a, b in zip(ids_torch, ids_onnx, strict=True)))
        else:
            differ = len(src)
        problems = [f"greedy decoding differs on {differ}/{len(src)} val sentences"] if differ else []
        bleu_torch = self._scores(model, ids_torch, refs, "val", options)[0]["val_bleu"]
        bleu_onnx = self._scores(model, ids_onnx, refs, "val", options)[0]["val_bleu"]
        artifacts = self._tokenizer_files(model, Path(out_dir))
        return verify_export(
            onnx_path=onnx_path,
            torch_outputs=[logits_torch],
            onnx_outputs=[logits_onnx],
            export=export,
            default_rtol=self.export_rtol,
            metric="val_bleu",
            torch_metric=bleu_torch,
            onnx_metric=bleu_onnx,
            model=model,
            inputs=(torch.from_numpy(fixed_src), torch.from_numpy(fixed_tgt)),
            out_dir=out_dir,
            problems=problems,
            extra={
                "decode_mismatches": differ,
                "decoded_sentences": len(src),
                "input_example": save_input_example(out_dir, {"src": src[:1], "tgt": tgt[:1, :-1]}),
                **({"artifacts": artifacts} if artifacts else {}),
            },
        )

    @staticmethod
    def _tokenizer_files(model, out_dir: Path) -> dict[str, str]:
        """The SentencePiece models as files, to be registered beside the ONNX graph (whose inputs and
        outputs are their ids): {"tokenizer": folder}; none for a word vocabulary (model.pt has it)."""
        from trainyard.training.seq2seq import SubwordVocab

        if not isinstance(model.src_vocab, SubwordVocab):
            return {}
        folder = out_dir / "tokenizer"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "source.model").write_bytes(model.src_vocab.state())
        (folder / "target.model").write_bytes(model.tgt_vocab.state())
        return {"tokenizer": str(folder)}

    def onnx_metrics(self, onnx_path, data, options):
        from trainyard.export.onnx_export import onnx_session

        # the vocabularies and max_len live in the model file registered next to the ONNX one
        model = companion_model(onnx_path)
        src, refs = self._source_ids(model, data, "val")
        ids = self.translate(self.onnx_step(onnx_session(onnx_path)), model, src)
        return self._scores(model, ids, refs, "val", options)[0]
