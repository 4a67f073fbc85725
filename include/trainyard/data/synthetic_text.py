"""The built-in translation dataset: a parallel corpus between two rule-based "languages", made here.

The source side is English-like (subject-verb-object; determiner and adjectives before the noun;
plural by ``-s``). The target side is an invented language with other word order, so a model has to
learn reordering and not just a word list:

* subject-object-verb: ``S V O [ADV]`` becomes ``S' O' V' [ADV']``;
* inside a noun phrase the noun comes first, then its adjectives in reverse order, then the determiner;
* plural is a separate particle ``ri`` after the noun.

Example (seed 0): ``the big red dog sees a cat`` -> ``levego bosufa pusoni pigeba balulo furu nulu``.

The target words come from syllables drawn with the seed, so the lexicon (and so every pair) is the
same for the same arguments. Output is the ``pairs.tsv`` layout of ``trainyard.data.parallel_text``.
"""

from __future__ import annotations

import numpy as np

from trainyard.data.store import Commit, generator_metadata, ingest_files

DETERMINERS = ("the", "a")
ADJECTIVES = ("big", "small", "red", "blue", "old", "young", "happy", "quiet", "fast", "green", "tall", "dark")
NOUNS = (
    "dog",
    "cat",
    "bird",
    "horse",
    "child",
    "farmer",
    "teacher",
    "friend",
    "fish",
    "king",
    "queen",
    "doctor",
    "sailor",
    "painter",
    "wolf",
    "fox",
)
VERBS = ("sees", "likes", "follows", "helps", "finds", "calls", "watches", "meets", "knows", "visits")
ADVERBS = ("today", "again", "often", "quickly", "slowly", "never")
PLURAL = "ri"


def lexicon(seed: int = 0) -> dict[str, str]:
    """source word -> target word; distinct, and none equal to the plural particle."""
    rng = np.random.default_rng(seed)
    onsets, vowels = list("bdfgklmnprstvz"), list("aeiou")
    words = DETERMINERS + ADJECTIVES + NOUNS + VERBS + ADVERBS
    out: dict[str, str] = {}
    used = {PLURAL}
    for word in words:
        while True:
            n = int(rng.integers(2, 4))
            w = "".join(
                onsets[int(rng.integers(len(onsets)))] + vowels[int(rng.integers(len(vowels)))] for _ in range(n)
            )
            if w not in used:
                break
        used.add(w)
        out[word] = w
    return out


def _noun_phrase(rng) -> tuple[str, list[str], str, bool]:
    det = DETERMINERS[int(rng.integers(len(DETERMINERS)))]
    n_adj = int(rng.choice([0, 1, 2], p=[0.4, 0.4, 0.2]))
    adjs = [ADJECTIVES[i] for i in rng.choice(len(ADJECTIVES), size=n_adj, replace=False)]
    noun = NOUNS[int(rng.integers(len(NOUNS)))]
    plural = bool(rng.random() < 0.3) and det == "the"
    return det, adjs, noun, plural


def _source_np(det, adjs, noun, plural) -> list[str]:
    return [det, *adjs, noun + ("s" if plural else "")]


def _target_np(lex, det, adjs, noun, plural) -> list[str]:
    return [lex[noun], *([PLURAL] if plural else []), *(lex[a] for a in reversed(adjs)), lex[det]]


def sentence_pair(rng, lex: dict[str, str]) -> tuple[str, str]:
    subj, obj = _noun_phrase(rng), _noun_phrase(rng)
    verb = VERBS[int(rng.integers(len(VERBS)))]
    adv = ADVERBS[int(rng.integers(len(ADVERBS)))] if rng.random() < 0.3 else None
    src = _source_np(*subj) + [verb] + _source_np(*obj) + ([adv] if adv else [])
    tgt = _target_np(lex, *subj) + _target_np(lex, *obj) + [lex[verb]] + ([lex[adv]] if adv else [])
    return " ".join(src), " ".join(tgt)


def generate(n_pairs: int = 4000, seed: int = 0) -> dict[str, bytes]:
    """The dataset file ``pairs.tsv`` (key, source, target)."""
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be >= 1, got {n_pairs}")
    lex = lexicon(seed)
    rng = np.random.default_rng(seed + 1)
    lines = ["key\tsource\ttarget"]
    for i in range(n_pairs):
        src, tgt = sentence_pair(rng, lex)
        lines.append(f"pair-{i:06d}\t{src}\t{tgt}")
    return {"pairs.tsv": ("\n".join(lines) + "\n").encode()}


def ingest_synthetic_text(store, repo: str, branch: str = "main", **kwargs) -> Commit:
    """Generate the corpus into ``repo``/``branch``; identical bytes commit nothing new."""
    metadata = generator_metadata(__name__, kwargs)
    return ingest_files(store, repo, branch, generate(**kwargs), "ingest synthetic parallel text", metadata)
