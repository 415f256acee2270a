"""Streamed text: never half a UTF-8 character, never part of a stop string. The tokenizer cases run on the
real default model's tokenizer (byte-level BPE, where emoji and CJK take several tokens)."""

from __future__ import annotations

import pytest
from specexport.runtime.text import Detokenizer

from .conftest import real_bundle

TEXTS = ["Café crème, naïve façade 🙂🚀 — 東京の天気は晴れです。 Ελληνικά ok", "👩‍👩‍👧‍👦 family, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑x²"]


@pytest.fixture(scope="module")
def codec():
    from specexport.runtime import load

    return load(real_bundle("fp32"), threads=1).codec


def _stream(codec, ids: list[int], stop=(), step: int = 1) -> tuple[list[str], Detokenizer]:
    detok = Detokenizer(codec, stop)
    deltas = []
    for i in range(0, len(ids), step):
        deltas.append(detok.push(ids[i:i + step]))
        if detok.stopped:
            break
    else:
        deltas.append(detok.flush())
    return deltas, detok


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_multibyte_characters_are_never_emitted_half(codec, text):
    ids = codec.encode(text)
    assert len(ids) > len(text.split())  # several tokens per character somewhere: the case under test
    for step in (1, 2, 3):
        deltas, detok = _stream(codec, ids, step=step)
        assert "".join(deltas) == text == detok.emitted
        assert not any("\ufffd" in d for d in deltas)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["天気", "🚀", "crème, na", "façade 🙂"])
def test_a_stop_string_split_across_tokens_stops_with_none_of_it_shown(codec, stop):
    text = TEXTS[0]
    ids = codec.encode(text)
    deltas, detok = _stream(codec, ids, stop=[stop])
    assert detok.stopped and detok.emitted == text[:text.index(stop)]
    assert "".join(deltas) == detok.emitted  # nothing of the stop string was streamed, not even its start
    assert len(codec.encode(stop)) > 1  # it does span tokens


def test_held_back_text_is_streamed_when_the_stop_string_does_not_complete():
    class Chars:  # a codec whose tokens are characters
        def decode(self, ids):
            return "".join(map(chr, ids))

    detok = Detokenizer(Chars(), ["STOP"])
    out = [detok.push([ord(c)]) for c in "a STO"]
    assert "".join(out) == "a " and detok.emitted == "a STO"  # "STO" may begin STOP: held
    assert detok.push([ord("P")]) == "" and detok.stopped and detok.emitted == "a "
    detok = Detokenizer(Chars(), ["STOP"])
    out = [detok.push([ord(c)]) for c in "a STOW"]
    assert "".join(out) == "a STOW"  # W: it was not STOP after all
    detok = Detokenizer(Chars(), ["STOP"])
    out = [detok.push([ord(c)]) for c in "end ST"] + [detok.flush()]
    assert "".join(out) == "end ST"  # the request ended: what was held is shown


def test_a_stream_ending_inside_a_character_keeps_the_whole_ones_before_it():
    """The last push ends inside a character after whole ones in the same push: they are the request's text,
    whatever the chunks, as a request read at its end has it."""
    class Bytes:  # a codec whose tokens are UTF-8 bytes
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    ids = [*"aé".encode(), ord("h"), ord("r"), "é".encode()[0]]  # ends on half of another é
    for step in (1, 2, 3, 5):
        deltas, detok = _stream(Bytes(), ids, step=step)
        assert "".join(deltas) == "aéhr" == detok.emitted, step
    deferred = Detokenizer(Bytes(), streaming=False)
    deferred.push(ids)
    assert deferred.flush() == "aéhr"


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_a_request_read_at_its_end_decodes_once_to_the_streamed_text(codec, text):
    ids = codec.encode(text)
    calls = []

    class Counting:
        def decode(self, ids):
            calls.append(len(ids))
            return codec.decode(ids)

    for step in (1, 3):
        deferred = Detokenizer(Counting(), streaming=False)
        calls.clear()
        pushed = [deferred.push(ids[i:i + step]) for i in range(0, len(ids), step)]
        assert pushed == [""] * len(pushed) and calls == []  # nothing decoded along the way
        assert deferred.flush() == text == deferred.emitted and calls == [len(ids)]
    # the ids end inside a character: the text stops before it, as streaming shows it
    cut = next(k for k in range(len(ids), 0, -1) if codec.decode(ids[:k]).endswith("\ufffd"))
    deferred = Detokenizer(codec, streaming=False)
    deferred.push(ids[:cut])
    streamed, _ = _stream(codec, ids[:cut])
    assert deferred.flush() == "".join(streamed) and "\ufffd" not in deferred.emitted
    # a stop string must be watched token by token: such a request still streams
    assert not Detokenizer(codec, ["x"], streaming=False)._deferred
