"""The model families beyond Llama/SmolLM (issue 21), each as a tiny random model from transformers' own config
class (tests/conftest.py's ARCH_CONFIGS): every piece matches PyTorch across cache use in both flavours, greedy
generation is token-identical to transformers' `generate` for 48 tokens (past the sliding window where the family
has one), the speculative modes (self, model, lookup, a token tree) are token-identical to AR of the same bundle,
and the standard flavour passes the TensorRT operator check of every target."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from specexport.runtime import load
from specexport.runtime.decode import target_step
from transformers import AutoModelForCausalLM

from .conftest import ARCH_CONFIGS, REPO, make_arch_checkpoint, make_noisy_drafter

ARCHS = list(ARCH_CONFIGS)
EXIT = 2
CONTEXT = 192
NEW_TOKENS = 48
PROMPTS = ["hash table", "the quick brown fox jumps over the lazy dog. the quick brown fox"]
TARGETS = sorted(p.stem for p in (REPO / "recipes" / "targets").glob("*.toml"))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """PyTorch on these tiny models: one thread is 10-20x faster than two on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """arch -> {checkpoint, drafter, ort, standard}: built once per arch for the module."""
    from specexport.exporter.build import build_bundle

    built: dict[str, dict] = {}

    def get(arch: str) -> dict:
        if arch not in built:
            root = tmp_path_factory.mktemp(f"arch-{arch}")
            ckpt = make_arch_checkpoint(root / "model", arch)
            drafter = make_noisy_drafter(ckpt, root / "drafter")
            out = {"checkpoint": ckpt, "drafter": drafter}
            for flavour in ("ort", "standard"):
                out[flavour] = root / flavour
                build_bundle(out[flavour], model=str(ckpt), drafter=str(drafter), adapter="untrained",
                             exit_layer=EXIT, context=CONTEXT, flavour=flavour)
            built[arch] = out
        return built[arch]

    return get


def _model(checkpoint: Path):
    return AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()


def _close(got: np.ndarray, want: np.ndarray, tol: float = 2e-5) -> None:
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)
    assert err <= tol, err


@pytest.mark.parametrize("flavour", ["ort", "standard"])
@pytest.mark.parametrize("arch", ARCHS)
def test_pieces_match_pytorch_across_cache_use(family, arch, flavour):
    """Prefill, decode, a rolled-back verification and continuations, past the window: against one PyTorch
    forward over the whole sequence."""
    fam = family(arch)
    session = load(fam[flavour], threads=1)
    p = session.pieces
    ids = np.random.default_rng(1).integers(0, 300, size=40).tolist()
    with torch.inference_mode():
        ref = _model(fam["checkpoint"])(torch.tensor([ids]), output_hidden_states=True)
    want_logits, want_h = ref.logits.numpy()[0], ref.hidden_states[EXIT].numpy()[0]
    h, logits = target_step(p, ids[:20], 0, keep=20)
    _close(h[0], want_h[:20])
    _close(logits[0], want_logits[:20])
    _, logits = target_step(p, ids[20:21], 20)
    _close(logits[0, -1], want_logits[20])
    target_step(p, [5, 6, 7, 8, 9, 10], 21, keep=6)  # garbage, rolled back
    _, logits = target_step(p, ids[21:30], 21, keep=9)
    _close(logits[0], want_logits[21:30])
    _, logits = target_step(p, ids[30:40], 30, keep=10)
    _close(logits[0], want_logits[30:40])


@pytest.mark.parametrize("arch", ARCHS)
def test_manifest_records_parity_and_windows(family, arch):
    from transformers import AutoConfig

    fam = family(arch)
    manifest = json.loads((fam["ort"] / "manifest.json").read_text())
    config = AutoConfig.from_pretrained(fam["checkpoint"])
    assert manifest["model"]["architecture"] == config.model_type == arch.removesuffix("3" if arch == "llama3" else "")
    assert set(manifest["pieces"]) == {"shallow", "deep", "adapter", "drafter"}
    for name, piece in manifest["pieces"].items():
        err = piece["parity"]["max_relative_error"]
        assert err and all(v <= piece["parity"]["tolerance"] for v in err.values()), name
    windows = manifest["pieces"]["shallow"]["attention"]["windows"] + manifest["pieces"]["deep"]["attention"]["windows"]
    assert len(windows) == config.num_hidden_layers
    if arch in ("mistral", "qwen3", "gemma3_text"):
        assert 8 in windows  # the tests' window: smaller than their sequences
    else:
        assert set(windows) == {None}
    assert manifest["pieces"]["drafter"]["attention"]["windows"] == windows  # the noisy drafter is the same model
    rope = manifest["pieces"]["deep"]["attention"]["rope"]
    assert rope["rope_type"] == {"llama3": "llama3", "phi3": "longrope"}.get(arch, "default")
    if arch == "phi3":
        assert rope["factors"] == "short" and rope["rotary_dim"] == 16  # a context inside the original window
    if arch == "gemma3_text":
        assert manifest["pieces"]["deep"]["attention"]["rope_tables"] == ["global", "local", "local", "global"]
        assert rope["local_rope_theta"] == 10000.0 and manifest["pieces"]["deep"]["attention"]["arch"] == {
            "activation": "gelu_tanh", "attn_scale": 24 ** -0.5, "sandwich_norms": True, "final_softcap": 30.0}


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_transformers_generate(family, arch):
    fam = family(arch)
    session = load(fam["ort"], threads=1)
    model = _model(fam["checkpoint"])
    eos = set(session.codec.eos_ids)
    lengths = []
    for prompt in PROMPTS:
        ids = session.prompt_ids(prompt, session.options())
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        want = out[0, len(ids):].tolist()
        cut = next((i for i, t in enumerate(want) if t in eos), len(want))
        got = session.generate_ids(ids, max_new_tokens=NEW_TOKENS, mode="ar").tokens
        assert got == want[:cut], (prompt, got, want)
        lengths.append(len(ids) + len(got))
    assert max(lengths) > 8 + NEW_TOKENS // 2  # well past the window


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_modes_equal_ar(family, arch):
    fam = family(arch)
    accepted = [0, 0]
    for flavour, prompts in (("ort", PROMPTS), ("standard", PROMPTS[:1])):
        session = load(fam[flavour], threads=1)
        for prompt in prompts:
            ar = session.generate(prompt, max_new_tokens=NEW_TOKENS, mode="ar").tokens
            for how in ({"mode": "self", "gamma": 3, "eta": 0.0}, {"mode": "self", "gamma": 6, "eta": 0.6},
                        {"mode": "model", "gamma": 3, "eta": 0.0}, {"mode": "lookup"},
                        {"mode": "model", "tree": "4:3:2:10"}):
                out = session.generate(prompt, max_new_tokens=NEW_TOKENS, **how)
                assert out.tokens == ar, (flavour, prompt, how)
                if how["mode"] == "model":  # the noisy drafter is right often, wrong sometimes: both paths run
                    accepted[0] += out.stats.accepted
                    accepted[1] += out.stats.drafted
    assert 0 < accepted[0] < accepted[1], accepted


@pytest.mark.parametrize("arch", ARCHS)
def test_standard_flavour_passes_every_target(family, arch):
    from specexport.exporter.tensorrt.opcheck import require_supported
    from specexport.runtime.bundle import read_manifest

    bundle = family(arch)["standard"]
    pieces = read_manifest(bundle).pieces
    for target in TARGETS:
        assert require_supported(bundle, pieces, target).ok, target


def test_longrope_past_the_original_window_takes_the_long_factors(tmp_path):
    """A context beyond original_max_position_embeddings: the tables are transformers' long-factor ones at every
    position (the manifest says so), and the build's parity check against PyTorch pinned to them passed."""
    from specexport.exporter.build import build_bundle
    from specexport.runtime.manifest import MANIFEST
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {**ARCH_CONFIGS["phi3"][1]["rope_parameters"], "original_max_position_embeddings": 16}
    ckpt = make_arch_checkpoint(tmp_path / "model", "phi3", rope_parameters=rope, original_max_position_embeddings=16)
    build_bundle(tmp_path / "b", model=str(ckpt), adapter="none", exit_layer=EXIT, context=64, flavour="standard")
    manifest = json.loads((tmp_path / "b" / MANIFEST).read_text())
    info = manifest["pieces"]["deep"]["attention"]["rope"]
    assert info["rope_type"] == "longrope" and info["factors"] == "long" and info["rotary_dim"] == 16
    model = _model(ckpt)
    long, scaling = ROPE_INIT_FUNCTIONS["longrope"](model.config, None, seq_len=17)
    assert info["attention_factor"] == pytest.approx(scaling) and scaling > 1.0
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(tmp_path / "b" / "deep.onnx"))
    cos = next(numpy_helper.to_array(t) for t in graph.graph.initializer if t.name == "rope_cos")
    np.testing.assert_allclose(cos[40], np.cos(40 * long.numpy().astype(np.float64)) * scaling, atol=1e-6)
    # and a sequence past the original window matches transformers' own forward (which takes the long factors)
    session = load(tmp_path / "b", threads=1)
    ids = np.random.default_rng(2).integers(0, 300, size=40).tolist()
    with torch.inference_mode():
        want = model(torch.tensor([ids])).logits.numpy()[0]
    _close(target_step(session.pieces, ids, 0, keep=40)[1][0], want)


def test_unsupported_model_type_is_one_sentence(tmp_path):
    from specexport.exporter.model_source import SUPPORTED_ARCHITECTURES, resolve
    from specexport.runtime.errors import SpecExportError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "falcon"}))
    with pytest.raises(SpecExportError) as exc:
        resolve(tmp_path)
    message = str(exc.value)
    assert "'falcon'" in message and ". " not in message
    assert all(name in message for name in set(SUPPORTED_ARCHITECTURES.values()))


@pytest.mark.parametrize("target", ["orin-nano", "rtx-4090"])  # swap-mode caches; in place (TensorScatter, opset 24)
@pytest.mark.parametrize("arch", ARCHS)
def test_tensorrt_plan_only_build_in_fp16(family, arch, target, tmp_path):
    """What a TensorRT build writes: fp16 standard-flavour pieces, operator-checked for the target inside the
    build, within the fp16 parity tolerance of the fp32 PyTorch model (ONNX Runtime CPU runs them)."""
    from specexport.exporter.build import build_bundle

    fam = family(arch)
    build_bundle(tmp_path / "trt", model=str(fam["checkpoint"]), drafter=str(fam["drafter"]), adapter="untrained",
                 exit_layer=EXIT, context=CONTEXT, backend="tensorrt", target=target, plan_only=True)
    manifest = json.loads((tmp_path / "trt" / "manifest.json").read_text())
    assert manifest["graph"]["precision"] == "fp16" and manifest["graph"]["flavour"] == "standard"
    for name, piece in manifest["pieces"].items():
        err = piece["parity"]["max_relative_error"]
        assert err and all(v <= piece["parity"]["tolerance"] for v in err.values()), (name, err)


# two interleaved branches from one root, 10 deep: slots run ahead of positions, and past the 8-token window
DEEP_TREE = [-1, 0, *range(0, 19)]


@pytest.mark.parametrize("flavour", ["ort", "standard"])
@pytest.mark.parametrize("arch", ["mistral", "gemma3_text"])
def test_a_tree_deeper_than_the_window_equals_each_branch_as_a_chain(family, arch, flavour):
    pieces = load(family(arch)[flavour], threads=1).pieces
    n = len(DEEP_TREE)
    for _, _, _, got, want in tree_rows_beside_chains(pieces, (n - 2, n - 1, 9, 4)):
        _close(got, want, 1e-5)


def tree_rows_beside_chains(pieces, rows: tuple[int, ...]):
    """DEEP_TREE's call after a random prompt, then each of `rows` as its branch run as a chain after the same
    prompt: yields (row, the tree's shallow state, the chain's, the tree's deep logits, the chain's) per row."""
    from specexport.runtime.backends.common import TreeMask
    from specexport.runtime.decode import ids_array

    rng = np.random.default_rng(3)
    prompt, tokens = rng.integers(0, 300, size=12).tolist(), rng.integers(0, 300, size=len(DEEP_TREE)).tolist()

    def prefill() -> None:
        pieces.deep.run(pieces.shallow.run(ids_array(prompt), 0)["hidden"], 0)

    prefill()
    pos, tree = len(prompt), TreeMask.from_parents(DEEP_TREE, len(prompt))
    assert tree.depth.max() > 8
    hidden = pieces.shallow.run(ids_array(tokens), pos, tree=tree)["hidden"].copy()
    got = pieces.deep.run(hidden, pos, keep=len(tokens), tree=tree)["logits"][0].copy()
    for i in rows:
        path = [i]
        while DEEP_TREE[path[-1]] >= 0:
            path.append(DEEP_TREE[path[-1]])
        prefill()
        chain_hidden = pieces.shallow.run(ids_array([tokens[j] for j in path[::-1]]), pos)["hidden"].copy()
        want = pieces.deep.run(chain_hidden, pos, keep=len(path))["logits"][0, -1]
        yield i, hidden[0, i], chain_hidden[0, -1], got[i], want


@pytest.mark.parametrize("arch", ["qwen3", "phi3", "gemma3_text"])
def test_int4_build_passes_parity_and_stays_lossless(family, arch, tmp_path):
    """MatMulNBits weights (Phi-3's fused projections split and repacked, Gemma's sandwich norms, Qwen3's q/k norms):
    the build's checks against PyTorch running the same rounded weights pass, and speculation equals AR."""
    from specexport.exporter.build import build_bundle

    fam = family(arch)
    build_bundle(tmp_path / "int4", model=str(fam["checkpoint"]), drafter=str(fam["drafter"]), adapter="untrained",
                 exit_layer=EXIT, context=CONTEXT, precision="int4")
    session = load(tmp_path / "int4", threads=1)
    ar = session.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, mode="ar").tokens
    for how in ({"mode": "self", "gamma": 3, "eta": 0.0}, {"mode": "model", "tree": "4:3:2:10"}):
        assert session.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, **how).tokens == ar, how


def test_parity_runs_the_prompts_as_the_bundle_encodes_them(tmp_path, monkeypatch):
    """A Gemma 3 without a chat template whose tokenizer adds a BOS, as the 270M's GGUF: the bundle prefixes every
    prompt with that BOS (exporter/chat.py), so the parity check must run its prompts with it. The 270M without
    its BOS is out of its range, and its int4 build failed parity on that alone (docs/journal/2026-11-25.md)."""
    from specexport.exporter import parity
    from specexport.exporter.build import build_bundle
    from tokenizers import processors
    from transformers import AutoTokenizer

    ckpt = make_arch_checkpoint(tmp_path / "model", "gemma3_text")
    tok = AutoTokenizer.from_pretrained(ckpt)
    (ckpt / "chat_template.jinja").unlink()
    tok.chat_template = None
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)])
    tok.save_pretrained(ckpt)
    seen: list[list[int]] = []
    run_checks = parity.run_checks

    def recording(root, pieces, checks, sequences, *args, **kwargs):
        seen.extend(sequences)
        return run_checks(root, pieces, checks, sequences, *args, **kwargs)

    monkeypatch.setattr(parity, "run_checks", recording)
    build_bundle(tmp_path / "int4", model=str(ckpt), adapter="none", drafter="none", exit_layer=EXIT,
                 context=CONTEXT, precision="int4")
    session = load(tmp_path / "int4", threads=1)
    prompts = [session.prompt_ids(p, session.options()) for p in parity.PARITY_PROMPTS]
    assert all(ids[0] == tok.bos_token_id for ids in prompts)
    assert seen[1:] == prompts
