"""The translation model's vocabulary, greedy decoding and ONNX graph."""

import numpy as np
import pytest
import torch

from trainyard.training import seq2seq as s2


def test_vocab_is_deterministic_and_round_trips():
    v = s2.Vocab.build(["b a", "a c", "a"])
    assert v.words[:4] == list(s2.SPECIALS) and v.words[4:] == ["a", "b", "c"]  # by frequency, then alphabet
    assert s2.Vocab.build(["a c", "a", "b a"]).words == v.words
    ids = v.encode("a c zzz", max_len=8)
    assert ids == [s2.BOS, 4, 6, s2.UNK, s2.EOS] and v.decode(ids[1:]) == "a c <unk>"
    assert v.encode("a b c a b c", max_len=4) == [s2.BOS, 4, 5, s2.EOS]  # cut to max_len
    assert s2.Vocab.build(["x y z"], max_size=5).words == [*s2.SPECIALS, "x"]


def test_greedy_decode_stops_at_eos_per_row():
    # a fake model: row 0 says 7 7 EOS, row 1 says 5 EOS
    script = {0: [7, 7, s2.EOS], 1: [5, s2.EOS]}

    def step(src, prefix):
        t = prefix.shape[1] - 1
        logits = np.zeros((len(src), prefix.shape[1], 10))
        for row, words in script.items():
            logits[row, -1, words[min(t, len(words) - 1)]] = 1.0
        return logits

    out = s2.greedy_decode(step, np.zeros((2, 3), np.int64), max_len=10)
    assert out.tolist() == [[7, 7, s2.EOS], [5, s2.EOS, s2.PAD]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from trainyard.export.onnx_export import export

    torch.manual_seed(0)
    model = s2.Seq2SeqTransformer(30, 40, d_model=16, nhead=2, layers=1, ff=32, max_len=12).eval()
    src = torch.randint(4, 30, (2, 6))
    tgt = torch.randint(4, 40, (2, 3))
    dims = {
        "src": {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("src_len", min=2, max=12)},
        "tgt": {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("tgt_len", min=1, max=12)},
    }
    path = export(
        model, (src, tgt), tmp_path_factory.mktemp("s2s") / "m.onnx", input_names=("src", "tgt"), dynamic_shapes=dims
    )
    return model, path


@pytest.mark.parametrize("batch, src_len, tgt_len", [(1, 2, 1), (5, 12, 7), (3, 9, 12)])
def test_onnx_graph_has_dynamic_batch_and_lengths(exported, batch, src_len, tgt_len):
    from trainyard.export.onnx_export import check_parity, onnx_session

    model, path = exported
    src = torch.randint(4, 30, (batch, src_len))
    src[0, src_len - 1 :] = s2.PAD  # padding is masked out, not attended to
    tgt = torch.randint(4, 40, (batch, tgt_len))
    with torch.no_grad():
        ref = model(src, tgt).numpy()
    out = onnx_session(path).run(None, {"src": src.numpy(), "tgt": tgt.numpy()})[0]
    assert check_parity(ref, out).passed


def test_padding_does_not_change_the_translation(exported):
    model, _ = exported
    src = torch.tensor([[s2.BOS, 5, 6, 7, s2.EOS]])
    padded = torch.tensor([[s2.BOS, 5, 6, 7, s2.EOS, s2.PAD, s2.PAD]])
    tgt = torch.tensor([[s2.BOS, 9]])
    with torch.no_grad():
        assert torch.allclose(model(src, tgt), model(padded, tgt), atol=1e-5)


CORPUS = [
    "the big young painter watches a blue painter quickly",
    "a green painter finds the cats",
    "the cats watch the painters slowly",
    "a small dog finds a green ball",
] * 20


def test_subwords_are_learned_deterministically_and_decode_to_the_text():
    a, b = s2.SubwordVocab.build(CORPUS, 60), s2.SubwordVocab.build(CORPUS, 60)
    assert a.state() == b.state()  # the same sentences, the same pieces and ids
    assert [a.sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]  # PAD, BOS, EOS, UNK
    ids = a.encode(CORPUS[0], 64)
    assert ids[0] == s2.BOS and ids[-1] == s2.EOS and len(ids) < len(CORPUS[0].split()) + 2 + 20
    assert a.decode(ids[1:] + [s2.PAD, 17]) == CORPUS[0]  # detokenized, stops at EOS
    # an unseen word is spelled in known pieces, not lost; an unseen character becomes <unk>
    assert a.decode(a.encode("the painted cat", 64)[1:]) == "the painted cat"
    assert s2.UNK in a.encode("the catz", 64)
    assert len(a.encode(CORPUS[0], 5)) == 5  # BOS + 3 pieces + EOS


def test_subwords_survive_pickling_and_model_files(tmp_path):
    import pickle

    vocab = s2.SubwordVocab.build(CORPUS, 60)
    again = pickle.loads(pickle.dumps(vocab))  # what a DataLoader worker receives
    assert again.encode(CORPUS[1], 32) == vocab.encode(CORPUS[1], 32)
    torch.save({"vocab": {"kind": "bpe", "source": vocab.state()}}, tmp_path / "m.pt")
    blob = torch.load(tmp_path / "m.pt", weights_only=True)  # bytes load with weights_only
    assert s2.make_vocab(blob["vocab"]["kind"], blob["vocab"]["source"]).encode(CORPUS[2], 32) == vocab.encode(
        CORPUS[2], 32
    )
    with pytest.raises(ValueError, match="unknown tokenizer 'spaces'"):
        s2.make_vocab("spaces", [])


VOCAB_WORKER = """
import sys
from pathlib import Path
from trainyard.training import seq2seq as s2

cache, kind, log = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])

def sentences():
    with open(log, "a") as fh:  # one line per process that learned the vocabulary
        fh.write("learned\\n")
    return ["the cat sat on the mat", "a dog ran to the cat", "the mat is red"] * 50

vocab = s2.run_vocab(kind, sentences, 40, 7, cache)
print(len(vocab), vocab.encode("the cat ran", 16))
"""


@pytest.mark.parametrize("kind", ["words", "bpe"])
def test_a_runs_vocabulary_is_learned_once_by_concurrent_workers(tmp_path, kind):
    """Four worker processes start at once: one learns the vocabulary, the others wait and read its file,
    and all encode alike."""
    import subprocess
    import sys

    cache, log = tmp_path / "vocab" / f"source-{kind}", tmp_path / "learned.log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", VOCAB_WORKER, str(cache), kind, str(log)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = {p.communicate(timeout=120)[0] for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outputs) == 1  # the same vocabulary in every process
    assert log.read_text().count("learned") == 1
    assert cache.exists()
