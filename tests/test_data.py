"""perfladder.data against d2l 1.0.3 itself (a fixture recorded by scripts/make_d2l_fixture.py)."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from perfladder import data
from perfladder.data import SHA1, CorpusError, TimeMachine, Vocab, check_batch_size

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "d2l_timemachine.json").read_text())


@pytest.fixture(scope="module")
def tms():
    """perfladder's TimeMachine at the two recorded context lengths (built once)."""
    return {T: TimeMachine(batch_size=2, num_steps=T) for T in (128, 16)}


def _sha256_int64(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a.astype(np.int64)).tobytes()).hexdigest()


def test_fixture_was_made_from_d2l_and_this_text():
    assert FIXTURE["versions"]["d2l"] == "1.0.3"
    assert FIXTURE["text_sha1"] == SHA1
    assert hashlib.sha1(data.corpus_path().read_bytes()).hexdigest() == SHA1


def test_vocab_matches_d2l(tms):
    vocab = tms[128].vocab
    assert vocab.idx_to_token == FIXTURE["idx_to_token"]
    assert len(vocab) == FIXTURE["vocab_len"] == 28
    assert vocab["<unk>"] == vocab.unk == 1 and vocab[" "] == 0 and vocab["z"] == 27
    assert vocab["#"] == vocab.unk                       # unseen token -> <unk>
    assert vocab.to_tokens([2, 3]) == ["a", "b"] and vocab.to_tokens(np.int64(4)) == "c"


def test_corpus_length_matches_d2l(tms):
    corpus = data.preprocess(data.read_corpus())
    assert len(corpus) == FIXTURE["corpus_len"]
    for T, tm in tms.items():
        assert len(tm.X) + T == FIXTURE["corpus_len"]     # one window per start position


@pytest.mark.parametrize("T", [128, 16])
def test_windows_match_d2l(tms, T):
    tm, ref = tms[T], FIXTURE["num_steps"][str(T)]
    assert list(tm.X.shape) == ref["X_shape"] and list(tm.Y.shape) == ref["Y_shape"]
    assert tm.X.dtype == np.int32 and tm.Y.dtype == np.int32
    np.testing.assert_array_equal(tm.X[:3], ref["X_first3"])
    np.testing.assert_array_equal(tm.Y[:3], ref["Y_first3"])
    for i in FIXTURE["rows"]:
        np.testing.assert_array_equal(tm.X[i], ref["X_rows"][str(i)])
        np.testing.assert_array_equal(tm.Y[i], ref["Y_rows"][str(i)])
    assert _sha256_int64(tm.X) == ref["X_sha256_int64"]
    assert _sha256_int64(tm.Y) == ref["Y_sha256_int64"]


def test_splits_follow_d2l_slices(tms):
    tm = tms[16]
    assert (tm.num_train, tm.num_val) == (FIXTURE["num_train"], FIXTURE["num_val"])
    Xt, Yt = tm.train_arrays()
    Xv, Yv = tm.val_arrays()
    assert len(Xt) == 10000 and len(Xv) == 5000
    np.testing.assert_array_equal(Xt[-1], FIXTURE["num_steps"]["16"]["X_rows"]["9999"])
    np.testing.assert_array_equal(Xv[0], FIXTURE["num_steps"]["16"]["X_rows"]["10000"])
    np.testing.assert_array_equal(Yv[-1], FIXTURE["num_steps"]["16"]["Y_rows"]["14999"])
    np.testing.assert_array_equal(Yt[:, :-1], Xt[:, 1:])   # Y is X shifted by one


def test_vocab_from_nested_tokens_and_reserved():
    v = Vocab([["b", "a"], ["a", "c"]], reserved_tokens=["<pad>"])
    assert v.idx_to_token == sorted(["<unk>", "<pad>", "a", "b", "c"])
    assert v.token_freqs[0] == ("a", 2)
    assert Vocab(list("aab"), min_freq=2).idx_to_token == ["<unk>", "a"]


def test_corrupted_copy_is_refused_naming_both_digests(tmp_path):
    bad = tmp_path / "timemachine.txt"
    shutil.copyfile(data.corpus_path(), bad)
    with open(bad, "ab") as f:
        f.write(b"one extra line\n")
    actual = hashlib.sha1(bad.read_bytes()).hexdigest()
    with pytest.raises(CorpusError) as e:
        TimeMachine(batch_size=2, num_steps=16, path=bad)
    assert actual in str(e.value) and SHA1 in str(e.value)


def test_missing_corpus_file(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        data.read_corpus(tmp_path / "nope.txt")


def test_unknown_tokenization_lists_choices():
    with pytest.raises(ValueError, match=r"tokenization='word'.*valid choices.*'char'"):
        TimeMachine(batch_size=2, num_steps=16, tokenization="word")


def test_batch_larger_than_training_split():
    with pytest.raises(ValueError, match=r"batch_size=101 is larger than the 100 training"):
        TimeMachine(batch_size=101, num_steps=16, num_train=100, num_val=10)


def test_splits_larger_than_corpus():
    n_windows = FIXTURE["corpus_len"] - 16
    with pytest.raises(ValueError, match=f"exceeds the {n_windows} windows"):
        TimeMachine(batch_size=2, num_steps=16, num_train=n_windows, num_val=1)
    # exactly all windows is fine
    tm = TimeMachine(batch_size=2, num_steps=16, num_train=n_windows - 1, num_val=1)
    assert len(tm.val_arrays()[0]) == 1


@pytest.mark.parametrize("kw, name", [(dict(batch_size=0), "batch_size"),
                                      (dict(num_steps=-1), "num_steps"),
                                      (dict(num_train=2.5), "num_train"),
                                      (dict(num_val=-1), "num_val"),
                                      (dict(num_val=1.5), "num_val"),
                                      (dict(batch_size=True), "batch_size")])
def test_bad_sizes_are_named(kw, name):
    args = dict(batch_size=2, num_steps=16) | kw
    with pytest.raises(ValueError, match=name):
        TimeMachine(**args)


def test_check_batch_size():
    assert check_batch_size(32, 100) == 3                  # ragged tail of 4 dropped
    with pytest.raises(ValueError, match="larger than the data"):
        check_batch_size(101, 100)
    with pytest.raises(ValueError, match="positive integer"):
        check_batch_size(0, 100)
