"""Corpus BLEU and chrF through sacrebleu, with the signatures that make the numbers comparable.

A BLEU score means little without its signature (tokenizer, casing, smoothing, number of references,
sacrebleu version): two runs are only comparable, e.g. for a champion/challenger check, when their
signatures match. So the signatures are returned next to the scores and belong in the run's metrics.
"""

from __future__ import annotations

from collections.abc import Sequence


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        # sacrebleu does not check this: it silently scores a truncated corpus
        raise ValueError(
            f"got {len(hypotheses)} hypotheses but {len(references)} references; need one reference per hypothesis"
        )
    if not hypotheses:
        raise ValueError("no sentences to score: hypotheses and references are empty")
    for name, seq in (("hypotheses", hypotheses), ("references", references)):
        for i, text in enumerate(seq):
            if not isinstance(text, str):
                raise ValueError(f"{name}[{i}] must be a string, got {type(text).__name__}")


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], *, tokenize: str | None = None) -> dict:
    """Corpus BLEU and chrF (both 0..100) of ``hypotheses`` against one reference each.

    ``tokenize`` is sacrebleu's BLEU tokenizer name (None: its default, ``13a``; use ``zh``, ``ja-mecab``
    or ``char`` for languages written without spaces). chrF works on characters and needs none.
    """
    from sacrebleu.metrics import BLEU, CHRF

    _check(hypotheses, references)
    hyps, refs = list(hypotheses), [list(references)]  # sacrebleu takes a list of reference streams
    bleu, chrf = BLEU(tokenize=tokenize), CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hyps, refs), chrf.corpus_score(hyps, refs)
    bleu_signature = bleu.get_signature()
    return {
        "bleu": float(bleu_score.score),
        "chrf": float(chrf_score.score),
        "bleu_signature": str(bleu_signature),
        "chrf_signature": str(chrf.get_signature()),
        "tokenizer": bleu_signature.info["tok"],
    }
