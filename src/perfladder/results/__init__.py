"""What a ladder run leaves behind (no framework imports): the record (``record``: ``RungResult``,
``LadderResult``), its JSON Schema and upgrades (``schema``), and the committed runs a page reads
(``committed``). The schema version and the error every reader raises live here, below all three."""

SCHEMA_VERSION = 2


class ResultsError(ValueError):
    """A results file does not follow the schema."""
