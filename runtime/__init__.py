"""specexport runtime: load a bundle and run (speculative) decoding with numpy, onnxruntime, tokenizers.

    from specexport.runtime import load
    session = load("bundles/smollm2")
    for text in session.stream("Explain how a hash table works.", max_new_tokens=128):
        print(text, end="")
"""

from .errors import RunError, SpecExportError
from .options import OptionError, Options
from .session import Generation, Session, TextStream, load

__all__ = ["Generation", "OptionError", "Options", "RunError", "Session", "SpecExportError", "TextStream", "load"]
