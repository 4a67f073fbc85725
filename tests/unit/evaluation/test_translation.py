import pytest
import sacrebleu

from trainyard.evaluation.translation import corpus_scores

HYPS = ["the cat sat on the mat", "hello world", "it is raining today in the city"]
REFS = ["the cat sat on a mat", "hello there world", "it rains in the city today"]


def test_matches_sacrebleu_corpus_functions():
    got = corpus_scores(HYPS, REFS)
    assert got["bleu"] == sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert got["chrf"] == sacrebleu.corpus_chrf(HYPS, [REFS]).score
    assert 0 < got["bleu"] < 100 and 0 < got["chrf"] < 100


def test_signatures_recorded():
    got = corpus_scores(HYPS, REFS)
    version = sacrebleu.__version__
    assert got["bleu_signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{version}"
    assert got["chrf_signature"] == f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{version}"
    assert got["tokenizer"] == "13a"


def test_tokenizer_choice_shows_in_signature():
    hyps, refs = ["我喜欢猫"], ["我喜欢狗"]
    got = corpus_scores(hyps, refs, tokenize="zh")
    assert got["tokenizer"] == "zh" and "tok:zh" in got["bleu_signature"]
    assert got["bleu"] == sacrebleu.corpus_bleu(hyps, [refs], tokenize="zh").score


@pytest.mark.parametrize(
    "name, hyps, refs, bleu, chrf",
    [
        ("perfect match", HYPS, HYPS, 100.0, 100.0),
        ("nothing in common", ["aaa bbb ccc ddd"], ["xxx yyy zzz www"], 0.0, 0.0),
    ],
)
def test_known_scores(name, hyps, refs, bleu, chrf):
    got = corpus_scores(hyps, refs)
    assert got["bleu"] == pytest.approx(bleu), name
    assert got["chrf"] == pytest.approx(chrf), name


@pytest.mark.parametrize(
    "name, hyps, refs, error",
    [
        # sacrebleu itself would score these without complaint
        ("fewer references", HYPS, REFS[:2], "got 3 hypotheses but 2 references"),
        ("fewer hypotheses", HYPS[:1], REFS, "got 1 hypotheses but 3 references"),
        ("empty", [], [], "no sentences"),
        ("None hypothesis", ["a", None], ["a", "b"], r"hypotheses\[1\] must be a string"),
        ("None reference", ["a", "b"], [None, "b"], r"references\[0\] must be a string"),
    ],
)
def test_rejects(name, hyps, refs, error):
    with pytest.raises(ValueError, match=error):
        corpus_scores(hyps, refs)
