"""The sampling protocol (gmts.sampling.sampler) on the tiny model: one registry, the capabilities
the samplers declare, the sampler's stop rule ends an answer there, eval's stop rule (the
end-of-turn token in place of eos) samples exactly what the former tokenizer view with a
replaced ``eos_token_id`` sampled, and a call beyond the context is refused before sampling."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gmts.sampling.rollout import generate_rollouts, resolve_stop_ids
from gmts.sampling.sampler import (
    SAMPLERS,
    HoldsWeights,
    Sampler,
    SamplerInputs,
    Sleeps,
    holds_weights,
    make_sampler,
)

PROMPT = "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def tiny_model(chat_tokenizer, make_tiny_qwen):
    return make_tiny_qwen(len(chat_tokenizer)).eval()


def test_registry_holds_both_samplers(chat_tokenizer, tiny_model, monkeypatch):
    assert SAMPLERS.names() == ["hf", "vllm"]
    sampler = make_sampler("hf", SamplerInputs(chat_tokenizer, model=tiny_model))
    assert isinstance(sampler, Sampler) and sampler.name == "hf"
    # the capabilities are the implementations' own, asked of the class before it is built
    assert not isinstance(sampler, HoldsWeights) and not isinstance(sampler, Sleeps)
    assert (holds_weights("hf"), holds_weights("vllm")) == (False, True)
    assert issubclass(SAMPLERS.get("vllm"), Sleeps)
    import gmts.sampling.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    preflight = SamplerInputs(None, vllm=vllm_engine.VLLMConfig())
    SAMPLERS.get("hf").preflight(preflight, who="x")  # nothing to refuse
    with pytest.raises(ValueError, match="who knows needs the vllm package"):
        SAMPLERS.get("vllm").preflight(preflight, who="who knows")
    with pytest.raises(ValueError, match="hf sampler needs SamplerInputs.model"):
        make_sampler("hf", SamplerInputs(chat_tokenizer))
    with pytest.raises(ValueError, match="vllm sampler needs SamplerInputs.model_path"):
        make_sampler("vllm", SamplerInputs(chat_tokenizer))
    with pytest.raises(ValueError, match="unknown sampler 'nope'"):
        make_sampler("nope", SamplerInputs(chat_tokenizer))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_samplers_stop_id_ends_the_answer_there(chat_tokenizer, tiny_model, temperature):
    sampler = make_sampler("hf", SamplerInputs(chat_tokenizer, model=tiny_model))
    assert sampler.stop_token_ids == resolve_stop_ids(chat_tokenizer, tiny_model.generation_config)
    kw = dict(num_samples=1, max_new_tokens=16, temperature=temperature, seed=3)
    free = sampler.sample([PROMPT], **kw)
    tokens = free.response_ids[0, : int(free.response_lengths[0])].tolist()
    assert len(tokens) == 16 and not set(sampler.stop_token_ids) & set(tokens)  # the budget
    stop = tokens[5]
    end = tokens.index(stop) + 1  # the first time the stop id is sampled
    stopper = make_sampler("hf", SamplerInputs(chat_tokenizer, eos_token_id=stop, model=tiny_model))
    assert stopper.stop_token_ids[0] == stop
    stopped = stopper.sample([PROMPT], **kw)
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
    sampler = make_sampler("hf", SamplerInputs(tok, eos_token_id=end_of_turn_id(tok), model=model))
    view = _EosView(tok, turn_end)
    stop = resolve_stop_ids(view, model.generation_config)
    assert sampler.stop_token_ids == stop == [turn_end, tok.eos_token_id]
    kw = dict(num_samples=16, max_new_tokens=32, temperature=1.0, seed=0)
    ours = sampler.sample([PROMPT, "7*6="], **kw)
    theirs = generate_rollouts(model, view, [PROMPT, "7*6="], **kw)
    assert torch.equal(ours.response_ids, theirs.response_ids)
    assert ours.completions == theirs.completions
    assert torch.equal(ours.finished, theirs.finished) and bool(ours.finished.any())
    ended = ours.response_ids.gather(1, (ours.response_lengths - 1)[:, None]).squeeze(1)
    assert bool((ended[ours.finished] == turn_end).any())  # the end-of-turn token stopped one


def test_a_call_beyond_the_context_is_refused_before_sampling(
    chat_tokenizer, tiny_model, monkeypatch
):
    """``SamplerInputs.context``: the longest prompt + max_new_tokens must fit; the model is not
    run for a refused call; None checks nothing (the trainer checks its data up front)."""
    import gmts.sampling.rollout as rollout

    calls = []
    real = rollout.generate_rollouts

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rollout, "generate_rollouts", counting)
    prompt_tokens = len(chat_tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    inputs = SamplerInputs(chat_tokenizer, context=prompt_tokens + 4, model=tiny_model)
    sampler = make_sampler("hf", inputs)
    kw = dict(num_samples=2, temperature=1.0, seed=0)
    assert sampler.sample(["1", PROMPT], max_new_tokens=4, **kw).response_ids.shape[0] == 4
    message = rf"the hf sampler: the longest prompt \({prompt_tokens} tokens\) \+ 5 new"
    with pytest.raises(ValueError, match=message):
        sampler.sample(["1", PROMPT], max_new_tokens=5, **kw)
    assert calls == [1]  # the first call only
    unchecked = make_sampler("hf", SamplerInputs(chat_tokenizer, model=tiny_model))
    unchecked.sample([PROMPT], max_new_tokens=5, **kw)
    assert calls == [1, 1]
