"""Batched serving: many requests through the pieces at once, each getting what it would get alone."""

from .request import BatchRequest
from .scheduler import BatchScheduler
from .text import BatchTextStream

__all__ = ["BatchRequest", "BatchScheduler", "BatchTextStream"]
