"""Every model gmts loads gets a contiguous output-layer input: torch's CPU linear on a sliced
(``logits_to_keep``) 3-D input with a frozen weight otherwise materialises the weight once per
row (131 MB for 8 rows of a 32k x 256 head; tens of GB at Qwen2.5's size), which the memory
plan never counts. The check is exact: no operation of the forward makes a tensor larger than
the logits."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gmts.models.loading import load_model


class _Largest(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.largest = max(self.largest, out.numel())
        return out


def _saved_qwen2(path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=4096,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def test_a_frozen_model_never_copies_its_head_per_row(tmp_path):
    path = _saved_qwen2(tmp_path / "model")
    model = load_model(path, training=False).requires_grad_(False)  # a frozen reference
    ids = torch.randint(0, 100, (8, 16))
    with torch.no_grad():
        probe = _Largest()
        with probe:
            logits = model(input_ids=ids, logits_to_keep=1).logits  # (8, 1, 4096)
    vocab, hidden = 4096, 64
    assert probe.largest < 8 * vocab * hidden  # the per-row copy of the head would be this
    assert probe.largest == max(logits.numel(), vocab * hidden)  # the logits or the head itself

    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(path).eval().requires_grad_(False)
    with torch.no_grad():
        probe = _Largest()
        with probe:
            expected = plain(input_ids=ids, logits_to_keep=1).logits
    assert probe.largest >= 8 * vocab * hidden  # torch's fallback, without the hook
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)  # another kernel
    # ... and now the same kernel as a trainable head's, bit for bit (a frozen reference and
    # the policy it starts equal to give the same log-probs: KL exactly 0 at the first step)
    with torch.no_grad():
        trainable = plain.requires_grad_(True)(input_ids=ids, logits_to_keep=1).logits
    torch.testing.assert_close(logits, trainable, rtol=0, atol=0)
