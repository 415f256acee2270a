"""Shared fixtures: a tiny random Llama (unit and parity tests) and the real default bundle, built once
per exporter version and cached under $SPECEXPORT_CACHE (git-ignored) across sessions."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

# the tiny random Llama and its noisy drafter are `specexport doctor`'s too: one definition, in the package
from specexport.doctor.tiny import CHAT_TEMPLATE, CORPUS, make_noisy_drafter, make_tiny_checkpoint  # noqa: F401
from specexport.doctor.tiny import tiny_tokenizer as _tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("SPECEXPORT_CACHE", str(REPO / ".cache"))

# tiny configs of the other supported families (tests/test_architectures.py); a window smaller than the tests'
# sequences wherever the family has one. Unless set: hidden 64, 4 heads of 16 over 2 KV heads.
ARCH_CONFIGS = {
    # Llama 3.x: frequency-dependent inv_freq (rope_type llama3), tied embeddings
    "llama3": ("LlamaConfig", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64},
                               "tie_word_embeddings": True}),
    # Qwen2/2.5: q/k/v biases, untied head
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False}),
    # Qwen3: per-head q/k RMSNorm; its layers 2 and 3 slide over 8 positions
    "qwen3": ("Qwen3Config", {"head_dim": 16, "tie_word_embeddings": True, "use_sliding_window": True,
                              "sliding_window": 8, "max_window_layers": 2}),
    # Phi-3.5 / Phi-4-mini: fused qkv and gate_up, LongRoPE (short factors below 4096 positions) over the
    # first 16 of 32 features (partial rotary; GroupQueryAttention wants rotary_dim / 2 a multiple of 8)
    "phi3": ("Phi3Config", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.5,
                                                "short_factor": [1.0, 1.05, 1.1, 1.2, 1.3, 1.6, 2.0, 2.5],
                                                "long_factor": [1.0, 1.5, 2.0, 2.5, 4.0, 6.0, 9.0, 12.0],
                                                "original_max_position_embeddings": 4096},
                            "num_attention_heads": 2, "num_key_value_heads": 1,
                            "partial_rotary_factor": 0.5, "max_position_embeddings": 16384,
                            "original_max_position_embeddings": 4096, "sliding_window": None,
                            "tie_word_embeddings": False}),
    # Mistral: every layer slides over 8 positions
    "mistral": ("MistralConfig", {"sliding_window": 8, "tie_word_embeddings": False}),
    # Gemma 3: 2 local layers (window 8, own RoPE base) per global one, q/k norms, (1 + w) norms, sandwich
    # norms, scaled embeddings, GELU-tanh, query_pre_attn_scalar, final logit soft-capping
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
                                         "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                                                         "sliding_attention", "sliding_attention", "full_attention"],
                                         "rope_parameters": {
                                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                                         "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
                                         "tie_word_embeddings": True}),
}


def make_arch_checkpoint(path: Path, arch: str, seed: int = 0, **overrides) -> Path:
    """A tiny random model of one of ARCH_CONFIGS' families from transformers' own config class, with the
    tiny tokenizer; 2-D weights scaled up as in make_tiny_checkpoint, norms and biases randomised so that
    (1 + w) norms and biases are really exercised."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    tok = _tiny_tokenizer(path)
    torch.manual_seed(seed)
    class_name, extra = ARCH_CONFIGS[arch]
    settings = {"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": len(extra.get("layer_types", [])) or 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
                "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
                "pad_token_id": tok.pad_token_id, **extra, **overrides}
    cfg = getattr(transformers, class_name)(**settings)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
            else:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_bundles(tmp_path_factory, tiny_checkpoint):
    """build(flavour, exit_layer, ...) -> bundle path, memoised for the session. `attention` None is the build's
    default (rowwise where the operator is built); 'gqa' the fallback's graphs."""
    from specexport.exporter.build import build_bundle

    root = tmp_path_factory.mktemp("tiny-bundles")
    built: dict[tuple, Path] = {}

    def build(flavour: str = "ort", exit_layer: int = 2, context: int = 256, adapter: str = "none",
              attention: str | None = None) -> Path:
        key = (flavour, exit_layer, context, adapter, attention)
        if key not in built:
            out = root / f"{flavour}-l{exit_layer}-c{context}-{Path(adapter).name}-{attention or 'default'}"
            build_bundle(out, model=str(tiny_checkpoint), exit_layer=exit_layer, context=context,
                         flavour=flavour, adapter=adapter, attention=attention)
            built[key] = out
        return built[key]

    return build


@pytest.fixture(scope="session")
def drafting_bundles(tmp_path_factory, tiny_checkpoint):
    """build(flavour) -> the tiny target with an untrained adapter and a drafter piece (the target with 1%
    weight noise, which agrees with it about half the time), memoised for the session: the drafting, sampling,
    batching and serving modules share them."""
    from specexport.exporter.build import build_bundle

    root = tmp_path_factory.mktemp("drafting-bundles")
    built: dict[str, Path] = {}

    def build(flavour: str = "standard") -> Path:
        if flavour not in built:
            if not (root / "drafter").exists():
                make_noisy_drafter(tiny_checkpoint, root / "drafter")
            build_bundle(root / flavour, model=str(tiny_checkpoint), drafter=str(root / "drafter"),
                         adapter="untrained", exit_layer=2, context=256, flavour=flavour)
            built[flavour] = root / flavour
        return built[flavour]

    return build


@pytest.fixture(scope="session")
def drafting_bundle(drafting_bundles) -> Path:
    """drafting_bundles' standard flavour (it batches)."""
    return drafting_bundles("standard")


def exporter_fingerprint() -> str:
    """Changes whenever the exporter, the manifest's schema or the default recipe does, so the cached bundle is
    rebuilt."""
    digest = hashlib.sha256()
    for path in sorted([*(REPO / "exporter").rglob("*.py"), REPO / "runtime" / "manifest.py",
                        *(REPO / "recipes").glob("*.toml"),
                        *(REPO / "recipes").glob("adapters/*/*"), *(REPO / "recipes").glob("drafters/*/*")]):
        digest.update(path.relative_to(REPO).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:12]


REAL_VARIANTS = {  # build_bundle's settings for each cached variant of the real default bundle
    "fp32": {},
    "int8": {"precision": "int8"},
    "int4": {"precision": "int4"},
    # the fp16 standard-flavour pieces a TensorRT build writes (they also run on ONNX Runtime's CPU provider)
    "fp16-standard": {"backend": "tensorrt", "target": "orin-nano", "plan_only": True},
}


def real_bundle(variant: str = "fp32") -> Path:
    """The real SmolLM2-135M-Instruct bundle (default recipe) in one of REAL_VARIANTS, built once per exporter
    version and cached."""
    import shutil

    from specexport.exporter.build import build_bundle
    from specexport.runtime.paths import cache_dir

    name = "smollm2" if variant == "fp32" else f"smollm2-{variant}"
    out = cache_dir("test-bundles") / f"{name}-{exporter_fingerprint()}"
    if not (out / "manifest.json").is_file():
        for stale in out.parent.glob(f"{name}-*"):  # hundreds of MB each: keep only the current one
            if stale.name[len(name) + 1:].isalnum() and len(stale.name) == len(out.name):
                shutil.rmtree(stale, ignore_errors=True)
        # named explicitly so that an adapter (or drafter) which no longer matches the model fails here at
        # once, instead of 'auto' quietly self-distilling a new adapter for an hour or dropping the drafter
        build_bundle(out, force=True, adapter=str(REPO / "recipes" / "adapters" / "smollm2-135m-l2"),
                     drafter=str(REPO / "recipes" / "drafters" / "smollm2-135m-tiny"), **REAL_VARIANTS[variant])
    return out


_real_sessions: dict[str, object] = {}
_real_ar: dict[tuple, list[int]] = {}


def real_session(variant: str = "fp32"):
    """The Session of real_bundle(variant), opened once and shared by every real-model module; one variant's at
    a time (each holds hundreds of MB, and the modules go through the variants one after another)."""
    if variant not in _real_sessions:
        from specexport.runtime import load

        _real_sessions.clear()
        _real_sessions[variant] = load(real_bundle(variant))
    return _real_sessions[variant]


def real_ar(variant: str, ids: list[int], new_tokens: int) -> list[int]:
    """real_session(variant)'s greedy AR output for `ids`, generated once per run: the modules that compare
    against it ask for the same prompts, and greedy AR of one bundle is deterministic."""
    key = (variant, tuple(ids), new_tokens)
    if key not in _real_ar:
        _real_ar[key] = real_session(variant).generate_ids(ids, max_new_tokens=new_tokens, mode="ar").tokens
    return _real_ar[key]


@pytest.fixture(scope="session")
def default_bundle() -> Path:
    """The real SmolLM2-135M-Instruct bundle (default recipe), built once per exporter version."""
    return real_bundle("fp32")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """PyTorch in the tests (the parity references of every build, transformers' `generate`, training) runs on
    one intra-op thread: on a 2-core machine shared with other jobs, two OpenMP threads spin against each other
    and run several times slower than one (a test that wants more sets them itself). Set before every test,
    since the training entry points set their own count and would otherwise leave it for the next test."""
    try:
        import torch
    except ImportError:  # a runtime-only environment
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def genai_python() -> str:
    """An interpreter with the real onnxruntime-genai and its builder's needs (`make bench-env`)."""
    from specexport.bench import ortgenai as bench_ortgenai
    from specexport.bench.systems import Skip

    python = bench_ortgenai.find_python()
    try:
        found = bench_ortgenai.env_versions(python)
    except Skip as exc:
        pytest.skip(str(exc))
    why = bench_ortgenai._builder_ready(found)
    if why:
        pytest.skip(why)
    return python


def fake_genai_library(tmp_path: Path, monkeypatch, module_source: str, ckpt_name: str = "ckpt") -> Path:
    """A fake onnxruntime_genai (`module_source`) on the worker's PYTHONPATH, and a checkpoint whose GenAI
    model is already in the cache as if the builder had run; returns the checkpoint."""
    import sys
    import textwrap

    from specexport.bench import ortgenai as bench_ortgenai

    lib = tmp_path / "lib"
    (lib / "onnxruntime_genai").mkdir(parents=True)
    (lib / "onnxruntime_genai" / "__init__.py").write_text(textwrap.dedent(module_source))
    meta = lib / "onnxruntime_genai-0.0.1.dist-info"
    meta.mkdir()
    meta.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-genai\nVersion: 0.0.1\n")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path / "cache"))
    ckpt = tmp_path / ckpt_name
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    found = bench_ortgenai.env_versions(sys.executable)
    built = bench_ortgenai.model_dir(ckpt, "sha", "fp32", found)
    built.mkdir(parents=True)
    (built / "genai_config.json").write_text("{}")
    return ckpt


def run_in_chunks(piece, prefix: np.ndarray, rows: np.ndarray, chunks: list[int], output: str) -> np.ndarray:
    """`rows` run after `prefix` in calls of `chunks` rows; the piece's `output` for every row."""
    piece.run(prefix, 0)
    outs, done = [], 0
    for n in chunks:
        outs.append(piece.run(rows[:, done:done + n], prefix.shape[1] + done, keep=n)[output].copy())
        done += n
    return np.concatenate(outs, axis=1)


# a real server of each kind over the tiny bundles, for the serving tests' HTTP clients (imports kept inside:
# the serve extra may be missing, and then only those tests skip)
@pytest.fixture()
def one_at_a_time(tiny_bundles):
    from specexport.runtime import load
    from specexport.serve import create_app

    from .test_serve import ThreadServer

    server = ThreadServer(create_app(load(tiny_bundles())))
    yield server
    server.stop()


@pytest.fixture()
def batching(drafting_bundle):
    from specexport.runtime import load
    from specexport.serve import create_app

    from .test_serve import ThreadServer

    server = ThreadServer(create_app(load(drafting_bundle), batch=2))
    yield server
    server.stop()
