"""The exception types the CLI turns into a single sentence and exit code 1."""


class SpecExportError(Exception):
    """A problem with the user's input or environment, phrased as one actionable sentence."""


class RunError(SpecExportError):
    """A piece that failed while it ran (ONNX Runtime, TensorRT or CUDA refused a call the runtime had checked):
    the machine's or the bundle's fault, never the request's, so a server answers it as its own failure."""
