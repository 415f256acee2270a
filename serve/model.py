"""What the server needs to know about the loaded bundle, read in one place (the manifest's layout is the
runtime's business; should it change, only this module follows)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..runtime import Session
from ..runtime.manifest import ChatFormat


@dataclass(frozen=True)
class ModelInfo:
    name: str  # the model id clients send and /v1/models lists
    max_context: int
    vocab_size: int
    default_max_tokens: int  # the bundle's own generation default
    chat: ChatFormat | None  # the runtime's pre-rendered single-turn chat format (None: the model has no template)
    chat_template: str | None  # the model's Jinja template, for conversations of more than one turn
    bos_token: str
    eos_token: str
    created: int

    @classmethod
    def of(cls, session: Session, name: str | None = None) -> ModelInfo:
        manifest = session.bundle.manifest
        tokenizer, model = manifest.tokenizer, manifest.model
        vocab = session.codec.tokenizer

        def token(token_id: int | None) -> str:
            return (vocab.id_to_token(int(token_id)) or "") if token_id is not None else ""

        eos_ids = model.eos_token_ids or tokenizer.eos_token_ids or (None,)
        return cls(name=name or manifest.name or session.bundle.root.name,
                   max_context=session.bundle.max_context, vocab_size=model.dims.vocab,
                   default_max_tokens=manifest.generation.max_new_tokens,
                   chat=session.codec.chat, chat_template=tokenizer.chat_template,
                   bos_token=token(model.bos_token_id), eos_token=token(eos_ids[0]),
                   created=int(time.time()))
