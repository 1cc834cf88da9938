"""What a ladder run leaves behind (no framework imports): the record (``record``: ``RungResult``,
``LadderResult``, whose ``read`` is the reader), its JSON Schema and upgrades (``schema``), and
the committed runs a page reads (``committed``); the format's version and the error every reader
raises in ``version``, below all three.

The names a user imports come from here::

    from perfladder.results import LadderResult
    result = LadderResult.read("_build/results/torch.json")
"""
from perfladder.measure.learning import LearningCheck
from perfladder.results.record import LadderResult, RungResult
from perfladder.results.version import SCHEMA_VERSION, ResultsError

__all__ = ["LadderResult", "RungResult", "LearningCheck", "ResultsError", "SCHEMA_VERSION"]
