"""The decode engine: one set of pieces with a cache row per sequence, one sequence (a Session) or many (the
batch scheduler), each running the one decoding loop on its view of the pieces."""

from .calls import Engine, SequenceClock
from .pieces import BACKENDS, open_pieces, sequence_pieces

__all__ = ["BACKENDS", "Engine", "SequenceClock", "open_pieces", "sequence_pieces"]
