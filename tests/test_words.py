"""perfladder.words: one formatter per unit, the words every page and the CLI print."""
from __future__ import annotations

from perfladder import words


def test_tflops():
    assert words.tflops(331.24) == "331.2" and words.tflops(0.0012) == "0.0012"
    assert words.tflops(None) == "-"


def test_each_unit():
    assert [words.rate(v) for v in (812, 9000, 20_200, 555_000, 2.48e6)] == ["812", "9.00k", "20.2k",
                                                                             "555k", "2.48M"]
    assert words.gib(3 * 2**30) == "3.00 GiB" and words.gib(2**27) == "128 MiB"
    assert words.ms(0.01234) == "12.34 ms" and words.ms(0.5, 0) == "500 ms"
    assert words.percent(0.5) == "50%" and words.percent(0.123, 1) == "12.3%"
    assert words.ratio(1.234) == "1.23x" and words.gbps(3.6e11) == "360" and words.gbps(2.25e9) == "2.25"


def test_nothing_measured_is_a_dash_in_every_unit():
    assert {f(None) for f in (words.rate, words.tflops, words.gbps, words.gib, words.ms,
                              words.percent, words.ratio)} == {"-"}


def test_the_old_import_path_hands_on_the_same_functions():
    import perfladder.pages.words as old
    public = [n for n in vars(words) if not n.startswith("_") and n != "annotations"]
    assert public and all(getattr(old, n) is getattr(words, n) for n in public)
