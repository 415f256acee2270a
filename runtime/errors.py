"""The one exception type the CLI turns into a single sentence and exit code 1."""


class SpecExportError(Exception):
    """A problem with the user's input or environment, phrased as one actionable sentence."""
