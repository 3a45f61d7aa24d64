"""The sampling protocol (gmts.sampling.sampler) on the tiny model: the caller's stop ids end an
answer there, and eval's stop rule (the end-of-turn token in place of eos) samples exactly what
the former tokenizer view with a replaced ``eos_token_id`` sampled."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gmts.sampling.rollout import generate_rollouts, resolve_stop_ids
from gmts.sampling.sampler import SAMPLERS, Sampler, SamplerInputs, eos_stop_ids, make_sampler

PROMPT = "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def tiny_model(chat_tokenizer, make_tiny_qwen):
    return make_tiny_qwen(len(chat_tokenizer)).eval()


def test_registry_holds_both_samplers(chat_tokenizer, tiny_model):
    assert SAMPLERS.names() == ["hf", "vllm"]
    sampler = make_sampler("hf", SamplerInputs(chat_tokenizer, model=tiny_model))
    assert isinstance(sampler, Sampler) and sampler.name == "hf"
    with pytest.raises(ValueError, match="hf sampler needs SamplerInputs.model"):
        make_sampler("hf", SamplerInputs(chat_tokenizer))
    with pytest.raises(ValueError, match="vllm sampler needs SamplerInputs.model_path"):
        make_sampler("vllm", SamplerInputs(chat_tokenizer))
    with pytest.raises(ValueError, match="unknown sampler 'nope'"):
        make_sampler("nope", SamplerInputs(chat_tokenizer))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_stop_id_passed_ends_the_answer_there(chat_tokenizer, tiny_model, temperature):
    sampler = make_sampler("hf", SamplerInputs(chat_tokenizer, model=tiny_model))
    kw = dict(num_samples=1, max_new_tokens=16, temperature=temperature, seed=3)
    eos = chat_tokenizer.eos_token_id
    free = sampler.sample([PROMPT], stop_token_ids=[eos], **kw)
    tokens = free.response_ids[0, : int(free.response_lengths[0])].tolist()
    assert len(tokens) == 16 and eos not in tokens  # the budget ended it, not eos
    stop = tokens[5]
    end = tokens.index(stop) + 1  # the first time the stop id is sampled
    stopped = sampler.sample([PROMPT], stop_token_ids=[stop], **kw)
    assert stopped.response_ids[0, : int(stopped.response_lengths[0])].tolist() == tokens[:end]
    assert bool(stopped.finished[0]) and not bool(free.finished[0])
    assert stopped.completions == [chat_tokenizer.decode(tokens[:end], skip_special_tokens=True)]


class _EosView:
    """The former eval wrapper: the tokenizer seen with another ``eos_token_id``."""

    def __init__(self, tokenizer: Any, eos_token_id: int) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = eos_token_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)


def test_eval_stop_rule_is_the_former_eos_view(make_byte_tokenizer, tiny_model):
    """A base model's tokenizer (eos <|endoftext|>) with a ChatML template: eval's stop list
    and samples equal those of the former view whose eos was <|im_end|>."""
    from gmts.data.prompts import CHATML_TEMPLATE
    from gmts.eval.backends import end_of_turn_id

    tok = make_byte_tokenizer(CHATML_TEMPLATE)
    tok.eos_token = "<|endoftext|>"
    turn_end = tok.convert_tokens_to_ids("<|im_end|>")
    # the model stops at <|endoftext|> too, and samples <|im_end|> as often as it
    model = tiny_model
    model.generation_config.eos_token_id = tok.eos_token_id
    with torch.no_grad():
        embeddings = model.get_output_embeddings().weight
        embeddings[turn_end] = embeddings[tok.eos_token_id]
    sampler = make_sampler("hf", SamplerInputs(tok, model=model))
    stop = eos_stop_ids(sampler, end_of_turn_id(tok))
    view = _EosView(tok, turn_end)
    assert stop == resolve_stop_ids(view, model.generation_config) == [turn_end, tok.eos_token_id]
    kw = dict(num_samples=16, max_new_tokens=32, temperature=1.0, seed=0)
    ours = sampler.sample([PROMPT, "7*6="], stop_token_ids=stop, **kw)
    theirs = generate_rollouts(model, view, [PROMPT, "7*6="], **kw)
    assert torch.equal(ours.response_ids, theirs.response_ids)
    assert ours.completions == theirs.completions
    assert torch.equal(ours.finished, theirs.finished) and bool(ours.finished.any())
    ended = ours.response_ids.gather(1, (ours.response_lengths - 1)[:, None]).squeeze(1)
    assert bool((ended[ours.finished] == turn_end).any())  # the end-of-turn token stopped one
