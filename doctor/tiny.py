"""A tiny random Llama (4 layers, hidden 64, a 300-token byte-level BPE) and a noisy copy of it as a drafter:
the model `specexport doctor` builds engines for, made exactly as tests/conftest.py's make_tiny_checkpoint
and make_noisy_drafter make theirs. Nothing is downloaded; it needs the exporter extra (torch, transformers).
"""

from __future__ import annotations

from pathlib import Path

from ..runtime.errors import SpecExportError

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "the quick brown fox jumps over the lazy dog", "a hash table maps keys to values",
    "speculative decoding drafts tokens and verifies them", "write a haiku about the sea",
    "what is seventeen times twenty three", "explain how a hash table works",
] * 20


def require_export_extra() -> None:
    """One sentence when torch or transformers is missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise SpecExportError(f"the tiny model needs the exporter extra ({exc.name} is missing); install it with"
                              " `pip install 'specexport[export]'`, or pass --no-tiny and check only --bundle"
                              ) from None


def tiny_tokenizer(path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


def make_tiny_checkpoint(path: Path, layers: int = 4, seed: int = 0) -> Path:
    """A Hugging Face checkpoint of a tiny random Llama at ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer(path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    # random init makes every logit near-equal; larger weights give peaked, tie-free distributions
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    model.save_pretrained(path)
    return Path(path)


def make_noisy_drafter(checkpoint: Path, out: Path) -> Path:
    """A drafter that agrees with the target about half the time: the target with 1% weight noise (an
    independently initialised model never agrees with a random target, so no draft would be accepted)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * 0.01)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(out)
    return Path(out)
