"""A small encoder-decoder transformer for the translation recipe, with its vocabularies: BPE subwords
(SentencePiece, the default) or whitespace words.

``forward(src, tgt)`` maps token ids (N, S) and the shifted target (N, T) to next-token logits
(N, T, V): one call is one teacher-forced pass, and greedy decoding calls it once per output token. That
one graph is what goes to ONNX (batch and both lengths dynamic), so ``greedy_decode`` can drive
PyTorch and onnxruntime alike and the two decodings can be compared token for token.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


def content_ids(ids: Iterable[int], size: int) -> list[int]:
    """A decoded row's tokens: up to the first EOS, without PAD and BOS, an id outside the vocabulary as UNK."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS:
            break
        if i not in (PAD, BOS):
            out.append(i if 0 <= i < size else UNK)
    return out


MAX_TRAINING_SENTENCES = 2_000_000  # SentencePiece learns its pieces from at most this many (a sample)


class Vocab:
    """Whitespace words, most frequent first (ties alphabetical), so the same corpus gives the same ids."""

    kind = "words"

    def __init__(self, words: Sequence[str]) -> None:
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, sentences: Iterable[str], max_size: int = 10000, seed: int = 0) -> Vocab:
        """The ``max_size`` most frequent words (``seed`` is unused: counting is deterministic)."""
        counts = Counter(w for s in sentences for w in s.split())
        ranked = sorted(counts, key=lambda w: (-counts[w], w))[: max_size - len(SPECIALS)]
        return cls(list(SPECIALS) + ranked)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, sentence: str, max_len: int) -> list[int]:
        """BOS + ids + EOS, the words cut to ``max_len - 2``."""
        ids = [self.index.get(w, UNK) for w in sentence.split()][: max_len - 2]
        return [BOS, *ids, EOS]

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.words[i] for i in content_ids(ids, len(self.words)))

    def state(self) -> list[str]:
        """What model.pt keeps to rebuild it (``make_vocab``)."""
        return self.words


class SubwordVocab:
    """BPE subwords learned by SentencePiece from the train split (SentencePiece's own model, so any
    SentencePiece runtime reads the same file). Ids 0-3 are PAD, BOS, EOS and UNK, as for words; pieces
    mark a word's start with ``▁``, so decoding restores the text's spaces (detokenized, as BLEU wants it).
    A character unseen in training becomes UNK."""

    kind = "bpe"

    def __init__(self, model_proto: bytes) -> None:
        import sentencepiece as spm

        self.model_proto = bytes(model_proto)
        self.sp = spm.SentencePieceProcessor(model_proto=self.model_proto)

    @classmethod
    def build(cls, sentences: Iterable[str], max_size: int = 10000, seed: int = 0) -> SubwordVocab:
        """At most ``max_size`` pieces (fewer when the corpus has fewer to merge). Deterministic: the same
        sentences and seed give the same pieces and ids (every rank of a run learns the same model; the
        seed picks the sample of a corpus above MAX_TRAINING_SENTENCES)."""
        import io

        import sentencepiece as spm

        spm.set_random_generator_seed(seed)
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=max_size,
            hard_vocab_limit=False,  # a small corpus gives fewer pieces rather than an error
            model_type="bpe",
            character_coverage=1.0,
            pad_id=PAD,
            bos_id=BOS,
            eos_id=EOS,
            unk_id=UNK,
            input_sentence_size=MAX_TRAINING_SENTENCES,
            shuffle_input_sentence=True,
            num_threads=1,
            minloglevel=2,
        )
        return cls(model.getvalue())

    def __getstate__(self) -> dict:  # DataLoader workers get the model bytes, and load them themselves
        return {"model_proto": self.model_proto}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_proto"])  # type: ignore[misc]

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, sentence: str, max_len: int) -> list[int]:
        """BOS + ids + EOS, the pieces cut to ``max_len - 2``."""
        return [BOS, *self.sp.encode(sentence)[: max_len - 2], EOS]

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode(content_ids(ids, len(self)))

    def state(self) -> bytes:
        return self.model_proto


VOCABS: dict[str, type[Vocab] | type[SubwordVocab]] = {"words": Vocab, "bpe": SubwordVocab}


def run_vocab(
    kind: str, sentences: Callable[[], Iterable[str]], max_size: int, seed: int, cache: Path
) -> Vocab | SubwordVocab:
    """The vocabulary of a run, learned once: the first worker to take ``cache``'s lock learns it from
    ``sentences()`` and writes its state there; the other ranks, and a retry of the run, read that file
    (learning it on every rank from the whole split was world_size times the work)."""
    from trainyard.files import atomic_write, file_lock

    with file_lock(cache.with_name(cache.name + ".lock")):
        if cache.exists():
            raw = cache.read_bytes()
            return make_vocab(kind, json.loads(raw) if kind == "words" else raw)
        vocab = VOCABS[kind].build(sentences(), max_size, seed)
        state = vocab.state()
        atomic_write(cache, json.dumps(state).encode() if isinstance(state, list) else state)
        return vocab


def make_vocab(kind: str, state) -> Vocab | SubwordVocab:
    """A vocabulary from what ``state()`` gave (a word list, or SentencePiece's model bytes)."""
    if kind not in VOCABS:
        raise ValueError(f"unknown tokenizer {kind!r}; known: {sorted(VOCABS)}")
    return VOCABS[kind](state)


def pad(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
    out = np.full((len(rows), length), PAD, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r[:length]
    return out


class _Attention(nn.Module):
    def __init__(self, d_model: int, nhead: int, dropout: float) -> None:
        super().__init__()
        self.nhead, self.dropout = nhead, dropout
        self.q, self.kv, self.proj = (
            nn.Linear(d_model, d_model),
            nn.Linear(d_model, 2 * d_model),
            nn.Linear(d_model, d_model),
        )

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        h = self.nhead
        q = self.q(x).view(n, t, h, d // h).transpose(1, 2)
        k, v = (z.view(n, memory.shape[1], h, d // h).transpose(1, 2) for z in self.kv(memory).chunk(2, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


class _Layer(nn.Module):
    """Pre-norm transformer layer: self-attention, cross-attention (decoder only), feed-forward."""

    def __init__(self, d_model: int, nhead: int, ff: int, dropout: float, cross: bool) -> None:
        super().__init__()
        self.self_attn = _Attention(d_model, nhead, dropout)
        self.cross_attn = _Attention(d_model, nhead, dropout) if cross else None
        self.ff = nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Linear(ff, d_model))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(3 if cross else 2))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, self_mask, memory=None, memory_mask=None):
        y = self.norms[0](x)
        x = x + self.drop(self.self_attn(y, y, self_mask))
        if self.cross_attn is not None:
            x = x + self.drop(self.cross_attn(self.norms[1](x), memory, memory_mask))
        return x + self.drop(self.ff(self.norms[-1](x)))


class Seq2SeqTransformer(nn.Module):
    """Pre-norm encoder-decoder on ``F.scaled_dot_product_attention`` with additive float masks: no
    data-dependent branches (``nn.Transformer``'s nested-tensor fast path has them), so
    ``torch.export`` traces it with dynamic batch and lengths."""

    # Set by the translation recipe when it loads a model file. Declared for the type checker only: a class
    # annotation on a Module is read by TorchScript when the model is traced.
    if TYPE_CHECKING:
        src_vocab: Vocab | SubwordVocab
        tgt_vocab: Vocab | SubwordVocab

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int = 64,
        nhead: int = 4,
        layers: int = 2,
        ff: int = 128,
        max_len: int = 32,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.config = {
            "src_vocab": src_vocab,
            "tgt_vocab": tgt_vocab,
            "d_model": d_model,
            "nhead": nhead,
            "layers": layers,
            "ff": ff,
            "max_len": max_len,
            "dropout": dropout,
        }
        self.src_embed = nn.Embedding(src_vocab, d_model, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model, padding_idx=PAD)
        self.position = nn.Embedding(max_len, d_model)
        self.encoder = nn.ModuleList(_Layer(d_model, nhead, ff, dropout, cross=False) for _ in range(layers))
        self.decoder = nn.ModuleList(_Layer(d_model, nhead, ff, dropout, cross=True) for _ in range(layers))
        self.enc_norm, self.dec_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, tgt_vocab)
        self.scale = d_model**0.5

    def _embed(self, table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return table(ids) * self.scale + self.position(positions)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        t = tgt.shape[1]
        # (N, 1, 1, S): 0 for a real source token, -inf for padding; every row keeps BOS, so never all -inf
        src_mask = torch.zeros(src.shape, device=src.device).masked_fill(src == PAD, float("-inf"))[:, None, None, :]
        causal = torch.triu(torch.full((t, t), float("-inf"), device=tgt.device), diagonal=1)[None, None]
        memory = self._embed(self.src_embed, src)
        for layer in self.encoder:
            memory = layer(memory, src_mask)
        memory = self.enc_norm(memory)
        x = self._embed(self.tgt_embed, tgt)
        for layer in self.decoder:
            x = layer(x, causal, memory, src_mask)
        return self.out(self.dec_norm(x))


def loss(logits: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=PAD)


def greedy_decode(step: Callable[[np.ndarray, np.ndarray], np.ndarray], src: np.ndarray, max_len: int) -> np.ndarray:
    """Token ids (N, <= max_len) by greedy search; ``step(src, prefix) -> logits (N, T, V)`` is the model
    (PyTorch or onnxruntime). Finished rows keep emitting PAD; stops when every row has emitted EOS."""
    n = len(src)
    prefix = np.full((n, 1), BOS, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    for _ in range(max_len - 1):
        logits = step(src, prefix)
        nxt = logits[:, -1, :].argmax(-1).astype(np.int64)
        nxt[done] = PAD
        prefix = np.concatenate([prefix, nxt[:, None]], axis=1)
        done |= nxt == EOS
        if done.all():
            break
    return prefix[:, 1:]
