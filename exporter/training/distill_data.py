"""Self-distillation data: the target model's own greedy responses to a prompt set.

A Kangaroo adapter learns to predict the target's next token from an early hidden state, so it should
be trained on text the target itself would produce (its greedy continuations), not on human text.
This module runs the target once over the training prompts and stores prompt + response token ids in
small ``.npz`` shards that the trainer reads back with :func:`load_sequences`.

Shard layout (``out_dir/shard_00000.npz``, ...), one shard per ``shard_size`` consecutive prompts:

- ``tokens``      int32, every sequence (prompt tokens then response tokens) concatenated
- ``offsets``     int64, length n + 1, sequence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``
- ``prompt_lens`` int32, number of prompt (chat-template) tokens of each sequence
- ``ids``         str, the prompt ids

Responses end with the EOS token when the model finished within ``max_new_tokens``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SHARD_GLOB = "shard_*.npz"
META_NAME = "meta.json"


def _shard_path(out_dir: Path, index: int) -> Path:
    return out_dir / f"shard_{index:05d}.npz"


def chat_text(tokenizer: Any, prompt: str) -> str:
    """One user turn as the target reads it, up to where its answer starts."""
    if not getattr(tokenizer, "chat_template", None):
        # a base model (Gemma 3 270M): the prompt as the bundle formats it, its tokenizer's BOS before the text
        from ..chat import chat_format

        plain = chat_format(tokenizer)
        return plain.user_prefix + prompt + plain.user_suffix if plain else prompt
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """All token ids that end a response (generation config may list several)."""
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else source)
    if not ids:
        raise ValueError("the model has no EOS token; cannot cut responses")
    return ids


def cut_after_eos(tokens: Sequence[int], eos_ids: set[int]) -> list[int]:
    """Keep tokens up to and including the first EOS (the rest is padding from finished rows)."""
    out: list[int] = []
    for tok in tokens:
        out.append(int(tok))
        if tok in eos_ids:
            break
    return out


def write_shard(path: Path, records: list[tuple[str, list[int], int]]) -> None:
    """Write one shard atomically: a temp file renamed into place, so readers never see half a shard."""
    lengths = [len(seq) for _, seq, _ in records]
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.fromiter((t for _, seq, _ in records for t in seq), dtype=np.int32, count=int(offsets[-1]))
    arrays = {
        "tokens": tokens,
        "offsets": offsets,
        "prompt_lens": np.asarray([p for _, _, p in records], dtype=np.int32),
        # A fixed-width unicode array loads without allow_pickle.
        "ids": np.asarray([i for i, _, _ in records], dtype=np.str_),
    }
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _prompts_digest(prompts: list[dict]) -> str:
    """Fingerprint of the prompt list, so a resumed run cannot mix shards of two different prompt sets."""
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(json.dumps([p["id"], p["prompt"]], ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def _check_meta(out_dir: Path, meta: dict[str, Any]) -> None:
    """Refuse to resume into a directory whose shards were made with settings that change their contents."""
    path = out_dir / META_NAME
    if path.exists() and any(out_dir.glob(SHARD_GLOB)):
        old = json.loads(path.read_text())
        # Keys an older meta.json lacks cannot be checked; the ones it has must agree.
        keys = [k for k in ("shard_size", "max_new_tokens", "num_prompts", "prompts_sha256") if k in old]
        diff = {k: (old[k], meta[k]) for k in keys if old[k] != meta[k]}
        if diff:
            raise ValueError(f"{out_dir} was generated with different settings {diff}; use a new out_dir")
        return
    # Without shards there is nothing to protect: (re)write the settings of this run.
    path.write_text(json.dumps(meta, indent=2) + "\n")


def generate_responses(
    model_dir: str | Path,
    prompts: list[dict],
    out_dir: str | Path,
    *,
    max_new_tokens: int = 192,
    batch_size: int = 16,
    shard_size: int = 256,
    seed: int = 0,
    threads: int | None = None,
    device: str | None = "auto",
) -> Path:
    """Generate the model's greedy response to every prompt and write token shards to ``out_dir``.

    ``prompts`` are dicts with ``id`` and ``prompt``. Existing shards are kept (resume). Returns ``out_dir``.
    ``device``: auto | cpu | cuda (batched generation under autocast on a GPU).
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads or os.cpu_count() or 1)
    torch.manual_seed(seed)

    num_shards = (len(prompts) + shard_size - 1) // shard_size
    _check_meta(
        out_dir,
        {
            "model_dir": str(model_dir),
            "num_prompts": len(prompts),
            "prompts_sha256": _prompts_digest(prompts),
            "shard_size": shard_size,
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "seed": seed,
        },
    )
    todo = [i for i in range(num_shards) if not _shard_path(out_dir, i).exists()]
    if not todo:
        return out_dir

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    from .device import resolve_device

    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev.torch)
    model.eval()
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)

    done_prompts = len(prompts) - sum(len(prompts[i * shard_size : (i + 1) * shard_size]) for i in todo)
    bar = tqdm(total=len(prompts), initial=done_prompts, unit="prompt", dynamic_ncols=True, mininterval=5.0)
    resp_tokens = 0
    start = time.perf_counter()
    for shard in todo:
        chunk = prompts[shard * shard_size : (shard + 1) * shard_size]
        texts = [chat_text(tokenizer, p["prompt"]) for p in chunk]
        # Batching prompts of similar length cuts padding; a stable sort keeps the order reproducible.
        lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        order = sorted(range(len(chunk)), key=lambda i: lengths[i])
        results: dict[int, tuple[list[int], int]] = {}
        for b in range(0, len(order), batch_size):
            rows = order[b : b + batch_size]
            # The chat template already carries the special tokens; do not let the tokenizer add a BOS.
            enc = tokenizer(
                [texts[i] for i in rows], add_special_tokens=False, padding=True, return_tensors="pt"
            )
            with torch.inference_mode(), dev.autocast():
                out = model.generate(
                    input_ids=enc["input_ids"].to(dev.torch),
                    attention_mask=enc["attention_mask"].to(dev.torch),
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad_id,
                    eos_token_id=sorted(eos_ids),
                )
            width = enc["input_ids"].shape[1]
            for r, i in enumerate(rows):
                mask = enc["attention_mask"][r].bool()
                prompt_ids = enc["input_ids"][r][mask].tolist()
                response = cut_after_eos(out[r, width:].cpu().tolist(), eos_ids)
                results[i] = (prompt_ids + response, len(prompt_ids))
                resp_tokens += len(response)
            bar.update(len(rows))
            bar.set_postfix(resp_tok_s=f"{resp_tokens / (time.perf_counter() - start):.1f}", shard=shard)
        records = [(chunk[i]["id"], *results[i]) for i in range(len(chunk))]
        write_shard(_shard_path(out_dir, shard), records)
        # One plain line per shard: the tqdm bar alone is hard to read in a log file.
        elapsed = time.perf_counter() - start
        bar.write(
            f"shard {shard + 1}/{num_shards} written: {resp_tokens} response tokens so far, "
            f"{resp_tokens / elapsed:.1f} tok/s, {elapsed / 60:.1f} min"
        )
    bar.close()
    elapsed = time.perf_counter() - start
    print(
        f"generated {resp_tokens} response tokens in {elapsed:.1f}s "
        f"({resp_tokens / max(elapsed, 1e-9):.1f} tok/s) into {out_dir}",
        flush=True,
    )
    return out_dir


SHARD_KEYS = ("tokens", "offsets", "prompt_lens", "ids")


def iter_shards(out_dir: str | Path, keys: Sequence[str] = SHARD_KEYS) -> Iterator[dict[str, np.ndarray]]:
    """Yield the arrays (`keys` of them) of every shard in ``out_dir`` in shard order (temp files are ignored)."""
    for path in sorted(Path(out_dir).glob(SHARD_GLOB)):
        with np.load(path) as data:
            yield {k: data[k] for k in keys}


def load_records(out_dir: str | Path) -> list[tuple[str, np.ndarray, int]]:
    """``(prompt id, token ids int64 of prompt + response, prompt_len)`` for every stored sequence, in order."""
    records: list[tuple[str, np.ndarray, int]] = []
    for shard in iter_shards(out_dir):
        tokens = shard["tokens"].astype(np.int64)
        offsets = shard["offsets"]
        for i, plen in enumerate(shard["prompt_lens"]):
            records.append((str(shard["ids"][i]), tokens[offsets[i] : offsets[i + 1]], int(plen)))
    return records


def load_sequences(out_dir: str | Path) -> list[tuple[np.ndarray, int]]:
    """Return ``(token ids int64 of prompt + response, prompt_len)`` for every stored sequence, in order."""
    return [(tokens, plen) for _, tokens, plen in load_records(out_dir)]


def load_prompt_ids(out_dir: str | Path) -> list[str]:
    """The prompt id of every stored sequence, in :func:`load_sequences` order (only the ids are read)."""
    return [str(i) for shard in iter_shards(out_dir, ("ids",)) for i in shard["ids"]]


def read_prompts(path: str | Path) -> list[dict]:
    """Read a prompt JSONL file (one ``{"id", "category", "prompt"}`` object a line)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: generate (or resume generating) the distillation shards."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF checkpoint directory of the target model")
    ap.add_argument("--prompts", required=True, help="prompt JSONL, one {id, category, prompt} a line")
    ap.add_argument("--out", required=True, help="output directory for the shards")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--shard-size", type=int, default=256)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: all cores); use 1 when other jobs share the CPU, since oversubscribed "
        "OpenMP threads spin and can run several times slower",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    prompts = read_prompts(args.prompts)
    if args.limit is not None:
        prompts = prompts[: args.limit]
    generate_responses(
        args.model,
        prompts,
        args.out,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        seed=args.seed,
        threads=args.threads,
    )


if __name__ == "__main__":
    main()
