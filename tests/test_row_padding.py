"""One-row calls checked at load (runtime/row_padding.py): the probe, the session's own two-row calls, and
speculative output identical to AR when the session pads."""

from __future__ import annotations

import numpy as np
import pytest
from specexport.exporter.build import build_bundle
from specexport.runtime import load
from specexport.runtime.backends.common import DeviceStates
from specexport.runtime.engine import open_pieces
from specexport.runtime.row_padding import TwoRowCalls, one_row_calls_match

from .conftest import make_noisy_drafter
from .test_tree_attention import leading_rows_are_ar_bit_for_bit

PROMPTS = ["Explain how a hash table works.", "write a haiku about the sea", "what is seventeen times twenty three"]
SYSTEMS = [{"mode": "self"}, {"mode": "model"}, {"mode": "lookup"}, {"mode": "model", "tree": "4:3:2:0"},
           {"mode": "auto"}, {"mode": "model", "schedule": "pearl"}]


@pytest.fixture(scope="module")
def unpadded(tmp_path_factory, tiny_checkpoint):
    """A tiny bundle whose graphs pad nothing (one_row_padding = "none"), with a drafter for model mode."""
    root = tmp_path_factory.mktemp("unpadded")
    recipe = root / "r.toml"
    recipe.write_text('name = "tiny"\n[export]\nexit_layer = 2\none_row_padding = "none"\nattention = "gqa"\n')
    drafter = make_noisy_drafter(tiny_checkpoint, root / "drafter")  # agrees often, not always
    build_bundle(root / "b", recipe=str(recipe), model=str(tiny_checkpoint), context=128, adapter="untrained",
                 drafter=str(drafter))
    return root / "b"


def _verification_rows(pieces, chunks: list[int]) -> np.ndarray:
    rng = np.random.default_rng(3)
    prefix = rng.standard_normal((1, 12, 64)).astype(np.float32)
    rows = rng.standard_normal((1, sum(chunks), 64)).astype(np.float32)
    pieces.deep.run(prefix, 0)
    outs, done = [], 0
    for n in chunks:
        outs.append(pieces.deep.run(rows[:, done:done + n], 12 + done, keep=n)["logits"].copy())
        done += n
    return np.concatenate(outs, axis=1)


def test_the_probe_finds_one_row_calls_that_round_otherwise_and_the_session_pads_them(unpadded):
    session = load(unpadded)
    assert session.one_row_calls == "session"
    assert session.one_row_calls_note.startswith("run as two rows by the session: this CPU rounds")
    assert isinstance(session.pieces.shallow, TwoRowCalls) and isinstance(session.pieces.deep, TwoRowCalls)
    # the same pieces without the session's padding: GroupQueryAttention's one-row path rounds differently
    raw = open_pieces(session.bundle, pad=False)
    assert not one_row_calls_match(raw, session.bundle.manifest.model.dims.vocab)
    whole = _verification_rows(raw, [6])
    assert not np.array_equal(_verification_rows(raw, [1] * 6), whole)
    # through the session's pieces every split of a call is the same to the bit
    whole = _verification_rows(session.pieces, [6])
    np.testing.assert_array_equal(_verification_rows(session.pieces, [1] * 6), whole)
    np.testing.assert_array_equal(_verification_rows(session.pieces, [1, 2, 1, 2]), whole)
    leading_rows_are_ar_bit_for_bit(session.pieces, 64)


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_speculative_output_is_ar_when_the_session_pads(unpadded, system):
    session = load(unpadded)
    drafted = accepted = 0
    for prompt in PROMPTS:
        ids = session.prompt_ids(prompt, session.options())
        ar = session.generate_ids(ids, max_new_tokens=48, mode="ar").tokens
        out = session.generate_ids(ids, max_new_tokens=48, **system)
        assert out.tokens == ar, prompt
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert accepted > 0
    assert drafted > accepted  # drafts refused too: the verification steps' rejections ran


def test_a_bundle_that_pads_attention_keeps_one_row_calls_exact(tiny_bundles):
    # a gqa build pads attention alone; whichever way the probe decides on this machine, a split
    # verification call must equal the whole one
    session = load(tiny_bundles("ort", attention="gqa"))
    assert session.bundle.pieces["deep"].min_rows == 1
    assert session.one_row_calls in ("attention", "session")
    whole = _verification_rows(session.pieces, [6])
    np.testing.assert_array_equal(_verification_rows(session.pieces, [1] * 6), whole)


def test_the_probe_reads_the_lm_heads_rows_as_verification_does(tmp_path, tiny_checkpoint):
    # int4 LM head in blocks of 128: MLAS may round its one-row call otherwise than a row of a many-row call
    # even where every layer's one-row call matches (an AVX-512 VNNI x86 does). A verification call keeps
    # every row's logits, so the probe must compare those, not a whole call that keeps its last row only
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "tiny"\n[export]\nexit_layer = 2\nprecision = "int4"\nattention = "gqa"\n'
                      'matmul = "mlas"\n[export.quantize]\nlm_head_block_size = 128\n')
    build_bundle(tmp_path / "b", recipe=str(recipe), model=str(tiny_checkpoint), context=128, adapter="untrained")
    session = load(tmp_path / "b")
    raw = open_pieces(session.bundle, pad=False)
    exact = np.array_equal(_verification_rows(raw, [1] * 6), _verification_rows(raw, [6]))
    assert one_row_calls_match(raw, session.bundle.manifest.model.dims.vocab) == exact
    assert session.one_row_calls == ("attention" if exact else "session")
    whole = _verification_rows(session.pieces, [6])
    np.testing.assert_array_equal(_verification_rows(session.pieces, [1] * 6), whole)
    for prompt in PROMPTS:
        ids = session.prompt_ids(prompt, session.options())
        ar = session.generate_ids(ids, max_new_tokens=32, mode="ar").tokens
        assert session.generate_ids(ids, max_new_tokens=32, mode="lookup").tokens == ar, prompt


class RecordingPiece:
    """A test double for a backend piece: records each call and returns per-row outputs that name the row."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.keep_max = 7

    def run(self, x, start, keep=1, tree=None):
        self.calls.append((x, start, keep, tree))
        n = x.shape[1]
        kept = n if keep <= 0 else min(keep, n)
        rows = np.arange(start, start + n, dtype=np.float32)[None, :, None]
        return {"hidden": np.repeat(rows, 3, axis=2), "logits": rows[:, n - kept:]}


def test_two_row_calls_append_a_copy_at_the_next_position_and_drop_its_results():
    piece = RecordingPiece()
    wrapped = TwoRowCalls(piece, max_context=10)
    out = wrapped.run(np.array([[42]]), 4)
    x, start, keep, tree = piece.calls[-1]
    assert x.tolist() == [[42, 42]] and start == 4 and keep == 2 and tree is None
    assert out["hidden"].shape == (1, 1, 3) and out["hidden"][0, 0, 0] == 4
    assert out["logits"].shape == (1, 1, 1) and out["logits"][0, 0, 0] == 4  # the row's, not the copy's
    assert wrapped.keep_max == 7  # everything else is the piece's


def test_two_row_calls_leave_many_row_tree_and_last_slot_calls_alone():
    piece = RecordingPiece()
    wrapped = TwoRowCalls(piece, max_context=10)
    for x, start, tree in ((np.array([[1, 2, 3]]), 0, None), (np.array([[5]]), 9, None),
                           (np.array([[5]]), 3, object())):
        wrapped.run(x, start, 1, tree)
        assert piece.calls[-1][0] is x and piece.calls[-1][1] == start and piece.calls[-1][3] is tree


def test_two_row_calls_widen_device_states_to_the_next_row():
    class Store:  # only what DeviceStates reads
        hidden, ptr, row_bytes, device = 3, 0, 12, "cuda"

    piece = RecordingPiece()
    piece.run = lambda x, start, keep=1, tree=None: piece.calls.append((x, start, keep, tree)) or {
        "logits": np.zeros((1, 2, 5), np.float32)}
    out = TwoRowCalls(piece, max_context=10).run(DeviceStates(Store(), 4, 1), 4)
    states = piece.calls[-1][0]
    assert isinstance(states, DeviceStates) and (states.first, states.n) == (4, 2)
    assert out["logits"].shape == (1, 1, 5)
