"""The results format's version and the error every reader of it raises: below the record, its
schema and the committed runs, which all import them from here."""

SCHEMA_VERSION = 2


class ResultsError(ValueError):
    """A results file does not follow the schema."""
