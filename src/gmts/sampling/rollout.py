"""Batched, KV-cached sampling of G completions per prompt, for any Hugging Face causal LM.

Prompts are left-padded with an attention mask and explicit position ids (``cumsum(mask) - 1``),
so prompts of different lengths sample exactly as they would alone. Each row stops at its first
EOS; the response mask is built from the lengths (EOS included), never from token values, so a
pad token equal to EOS is safe. Sampling draws from one ``torch.Generator`` seeded per call:
the same seed gives the same rollouts.

The sampler is a hand-written loop that feeds one token per step against a KV cache sized for
the prompt plus the generation budget up front (:mod:`gmts.sampling.kv_cache`: no copy of the
cache per step, the same values as ``transformers.DynamicCache``). It samples the plain softmax
at the temperature, with none of a model's generation_config defaults. The loop passes the cache
object under the name the model's ``forward`` declares (``cache`` in current transformers,
``past_key_values`` up to about 5.2x, where ``past_key_values`` now raises a FutureWarning) and
never reads the deprecated output field: the cache is updated in place. Rows that have stopped
leave the batch (:data:`DROP_ROWS_AT`); each step still draws the random numbers of the whole
chunk (:mod:`gmts.sampling.draws`), so the tokens are those of the loop that keeps them, up to
the rounding of kernels that depend on the batch's size (see :func:`_sample_cache_loop`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from gmts.sampling.draws import DRAWS, Draw
from gmts.sampling.packed_linear import prepacked_linears
from gmts.sampling.sequences import PromptResponse, distinct_prompts, position_ids_from_mask


@dataclass
class Rollout(PromptResponse):
    """G sampled completions for each of Q prompts; B = Q * G rows, a group's rows contiguous.

    Attributes:
        prompt_ids: (B, P) long, left-padded with ``pad_token_id``.
        prompt_mask: (B, P) bool, True on real prompt tokens.
        response_ids: (B, T) long, right-padded with ``pad_token_id`` after the EOS.
        response_mask: (B, T) bool, ``arange(T) < response_lengths`` (EOS included).
        response_lengths: (B,) long, tokens generated including the EOS.
        finished: (B,) bool, True where the row produced EOS within the budget.
        group_ids: (B,) long, index of the row's prompt, 0..Q-1.
        prompts, completions, answers: B strings each; completions are decoded without special
            tokens (so without the EOS).
        num_samples: G.
        pad_token_id: the id used for padding (may equal the EOS id).
        engine_logprobs: (B, T) float32 log-probs of the sampled tokens under the tempered
            distribution, as the sampling engine computed them (vLLM records them; 0 on
            padding), or None when the engine did not record them (the KV-cached sampler here).

    ``input_ids``, ``attention_mask`` and ``position_ids`` (the model's inputs) come from
    :class:`gmts.sampling.sequences.PromptResponse`.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    response_lengths: torch.Tensor
    finished: torch.Tensor
    group_ids: torch.Tensor
    prompts: list[str] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    num_samples: int = 1
    pad_token_id: int = 0
    engine_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rows = self.prompt_ids.shape[0]
        for name in ("prompt_mask", "response_ids", "response_mask", "response_lengths"):
            if getattr(self, name).shape[0] != rows:
                raise ValueError(f"{name} has {getattr(self, name).shape[0]} rows, expected {rows}")
        if (
            self.engine_logprobs is not None
            and self.engine_logprobs.shape != self.response_ids.shape
        ):
            raise ValueError(
                f"engine_logprobs has shape {tuple(self.engine_logprobs.shape)}, expected "
                f"{tuple(self.response_ids.shape)} (the response_ids')"
            )
        for name in ("finished", "group_ids", "prompts", "completions", "answers"):
            if len(getattr(self, name)) != rows:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, expected {rows}")

    # ---- views ---------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return self.prompt_ids.shape[0]

    @property
    def num_groups(self) -> int:
        """Q, the number of prompts (groups)."""
        return int(self.group_ids.max().item()) + 1 if self.batch_size else 0

    @property
    def prompt_length(self) -> int:
        """P, the padded prompt length (response token t sits at position P + t)."""
        return self.prompt_ids.shape[1]

    # ---- manipulation --------------------------------------------------------------------------
    def to(self, device: torch.device | str) -> Rollout:
        """A copy with every tensor on ``device`` (strings are shared)."""
        values = {
            f.name: (v.to(device) if isinstance(v, torch.Tensor) else v)
            for f in fields(self)
            for v in [getattr(self, f.name)]
        }
        return Rollout(**values)

    def select(self, rows: torch.Tensor | Sequence[int]) -> Rollout:
        """The rows ``rows`` (indices or a (B,) bool mask), group ids renumbered 0..Q'-1.

        Keep whole groups (e.g. ``rows = keep.repeat_interleave(G)`` for a (Q,) bool ``keep``) to
        keep group statistics meaningful; the padded widths P and T shrink to what is used.
        """
        index = torch.as_tensor(rows, device=self.prompt_ids.device)
        if index.dtype == torch.bool:
            if index.shape != (self.batch_size,):
                raise ValueError(
                    f"bool rows must have shape ({self.batch_size},), got {tuple(index.shape)}"
                )
            index = index.nonzero().flatten()
        index = index.long()
        picked = index.tolist()
        _, group_ids = torch.unique(self.group_ids[index], return_inverse=True)
        out = Rollout(
            prompt_ids=self.prompt_ids[index],
            prompt_mask=self.prompt_mask[index],
            response_ids=self.response_ids[index],
            response_mask=self.response_mask[index],
            response_lengths=self.response_lengths[index],
            finished=self.finished[index],
            group_ids=group_ids.reshape(-1),
            prompts=[self.prompts[i] for i in picked],
            completions=[self.completions[i] for i in picked],
            answers=[self.answers[i] for i in picked],
            num_samples=self.num_samples,
            pad_token_id=self.pad_token_id,
            engine_logprobs=None if self.engine_logprobs is None else self.engine_logprobs[index],
        )
        return out._trimmed()

    @staticmethod
    def concat(rollouts: Sequence[Rollout]) -> Rollout:
        """Rows of all ``rollouts`` in order, re-padded (prompts left, responses right); group ids
        of later rollouts are offset so that groups stay distinct."""
        if not rollouts:
            raise ValueError("rollouts must not be empty")
        first = rollouts[0]
        width_p = max(r.prompt_length for r in rollouts)
        width_t = max(r.response_ids.shape[1] for r in rollouts)
        pad = first.pad_token_id
        with_logprobs = first.engine_logprobs is not None
        prompt_ids, prompt_mask, response_ids, response_mask, group_ids = [], [], [], [], []
        logprobs = []
        offset = 0
        for r in rollouts:
            if r.num_samples != first.num_samples or r.pad_token_id != pad:
                raise ValueError("rollouts must share num_samples and pad_token_id")
            if (r.engine_logprobs is not None) != with_logprobs:
                raise ValueError("rollouts must all have engine_logprobs or all not")
            lp = width_p - r.prompt_length
            rt = width_t - r.response_ids.shape[1]
            prompt_ids.append(torch.nn.functional.pad(r.prompt_ids, (lp, 0), value=pad))
            prompt_mask.append(torch.nn.functional.pad(r.prompt_mask, (lp, 0), value=False))
            response_ids.append(torch.nn.functional.pad(r.response_ids, (0, rt), value=pad))
            response_mask.append(torch.nn.functional.pad(r.response_mask, (0, rt), value=False))
            if r.engine_logprobs is not None:
                logprobs.append(torch.nn.functional.pad(r.engine_logprobs, (0, rt), value=0.0))
            group_ids.append(r.group_ids + offset)
            offset += r.num_groups
        return Rollout(
            prompt_ids=torch.cat(prompt_ids),
            prompt_mask=torch.cat(prompt_mask),
            response_ids=torch.cat(response_ids),
            response_mask=torch.cat(response_mask),
            response_lengths=torch.cat([r.response_lengths for r in rollouts]),
            finished=torch.cat([r.finished for r in rollouts]),
            group_ids=torch.cat(group_ids),
            prompts=[s for r in rollouts for s in r.prompts],
            completions=[s for r in rollouts for s in r.completions],
            answers=[s for r in rollouts for s in r.answers],
            num_samples=first.num_samples,
            pad_token_id=pad,
            engine_logprobs=torch.cat(logprobs) if with_logprobs else None,
        )

    def _trimmed(self) -> Rollout:
        """Drop all-padding prompt columns on the left and response columns on the right."""
        if self.batch_size == 0:
            return self
        used_p = int(self.prompt_mask.sum(dim=1).max().item())
        used_t = int(self.response_lengths.max().item())
        first = self.prompt_length - used_p  # read before prompt_ids (and so P) changes
        self.prompt_ids = self.prompt_ids[:, first:]
        self.prompt_mask = self.prompt_mask[:, first:]
        self.response_ids = self.response_ids[:, :used_t]
        self.response_mask = self.response_mask[:, :used_t]
        if self.engine_logprobs is not None:
            self.engine_logprobs = self.engine_logprobs[:, :used_t]
        return self


def _prompt_and_answer(problem: Any) -> tuple[str, str]:
    if isinstance(problem, str):
        return problem, ""
    if isinstance(problem, Mapping) and "prompt" in problem:
        answer = problem.get("answer")
        return str(problem["prompt"]), "" if answer is None else str(answer)
    if not hasattr(problem, "prompt"):
        raise ValueError(
            "problems must be strings, mappings with 'prompt', or objects with a .prompt "
            f"attribute; got {type(problem).__name__}"
        )
    answer = getattr(problem, "answer", None)
    return str(problem.prompt), "" if answer is None else str(answer)


def _left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = True
    return ids, mask


def _next_token(
    logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator,
    draw: Draw,
    rows: torch.Tensor,
    batch: int,
) -> torch.Tensor:
    """(a, V) logits of the rows ``rows`` ((a,) long) of a batch of ``batch`` -> (a,) tokens;
    temperature 0 means greedy. The draw consumes the random numbers of the whole batch.

    ``logits`` is consumed: a float32 input is divided by the temperature in place (the values
    ``logits / temperature`` would give; no pass at all at temperature 1, where dividing is
    exact), one (a, V) copy less per step."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    scaled = logits.float()  # (a, V): the input itself when it is float32
    if temperature != 1.0:
        scaled.div_(temperature)
    probs = torch.softmax(scaled, dim=-1)  # (a, V)
    return draw(probs, generator, rows, batch)


def resolve_stop_ids(
    tokenizer: Any, generation_config: Any, stop_token_ids: Sequence[int] | None = None
) -> list[int]:
    """The ids that end a row, eos first: ``stop_token_ids`` when given, else the tokenizer's
    eos plus ``generation_config.eos_token_id`` (an int or a list; ``generation_config`` may be
    None). Every sampling engine stops on exactly this list."""
    if stop_token_ids is not None:
        stop = [int(i) for i in stop_token_ids]
        if not stop:
            raise ValueError("stop_token_ids must not be empty")
        return list(dict.fromkeys(stop))
    return stop_ids_from_eos(tokenizer.eos_token_id, generation_config)


def stop_ids_from_eos(eos_token_id: int | None, generation_config: Any) -> list[int]:
    """``eos_token_id`` then ``generation_config.eos_token_id`` (an int or a list;
    ``generation_config`` may be None), without repeats."""
    if eos_token_id is None:
        raise ValueError("tokenizer must define an eos token (or pass stop_token_ids)")
    stop = [eos_token_id]
    extra = getattr(generation_config, "eos_token_id", None) if generation_config else None
    if isinstance(extra, int):
        stop.append(extra)
    elif extra is not None:
        stop.extend(int(i) for i in extra)
    return list(dict.fromkeys(stop))


def encode_prompts(
    tokenizer: Any, problems: Sequence[Any], *, add_special_tokens: bool = False
) -> tuple[list[str], list[str], list[list[int]]]:
    """``(prompts, answers, token ids)`` of Q problems (see :func:`generate_rollouts` for the
    accepted forms); a prompt that encodes to no tokens raises."""
    if len(problems) == 0:
        raise ValueError("problems must not be empty")
    prompts, answers = zip(*(_prompt_and_answer(p) for p in problems))
    encoded = tokenizer(list(prompts), add_special_tokens=add_special_tokens)["input_ids"]
    for text, ids in zip(prompts, encoded):
        if not ids:
            raise ValueError(f"prompt {text!r} encodes to no tokens")
    return list(prompts), list(answers), [list(ids) for ids in encoded]


def rollout_from_responses(
    tokenizer: Any,
    *,
    prompts: Sequence[str],
    answers: Sequence[str],
    encoded: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]] | torch.Tensor,
    lengths: torch.Tensor | None = None,
    num_samples: int,
    stop_ids: Sequence[int],
    pad_id: int,
    device: torch.device | str = "cpu",
    engine_logprobs: Sequence[Sequence[float]] | None = None,
) -> Rollout:
    """The :class:`Rollout` of Q prompts x G sampled responses (rows grouped by prompt), the
    one definition of its masks shared by every sampling engine.

    Args:
        prompts, answers, encoded: Q prompt strings, answers and prompt token ids.
        responses: B = Q * G rows of sampled ids: lists (each as long as the row generated,
            its end token included), or a ``(B, T)`` tensor with ``lengths``.
        lengths: ``(B,)`` tokens generated per row when ``responses`` is a tensor.
        stop_ids: the ids that end a row; a row is finished when its last token is one.
        engine_logprobs: B lists of the sampled tokens' log-probs as the engine computed them
            (the same lengths as the responses), or None.
    """
    prompt_ids, prompt_mask = _prompt_rows(encoded, num_samples, pad_id, device)  # (B, P)
    group_ids = torch.arange(len(encoded), device=device).repeat_interleave(num_samples)  # (B,)
    if isinstance(responses, torch.Tensor):
        if lengths is None:
            raise ValueError("a responses tensor needs lengths")
        response_ids, lengths = responses.to(device), lengths.to(device)
    else:
        lengths = torch.tensor([len(r) for r in responses], dtype=torch.long, device=device)
        response_ids = _right_pad(responses, pad_id, int(lengths.max()), torch.long, device)
    if response_ids.shape[0] != prompt_ids.shape[0]:
        raise ValueError(
            f"{response_ids.shape[0]} responses for {len(encoded)} prompts x {num_samples}"
        )
    width = response_ids.shape[1]
    positions = torch.arange(width, device=device)
    response_mask = positions[None, :] < lengths[:, None]  # (B, T)
    # Everything after the end token is padding, whatever the sampler wrote there.
    response_ids = torch.where(response_mask, response_ids, torch.full_like(response_ids, pad_id))
    last = response_ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=device)
    finished = torch.isin(last, stop) & (lengths > 0)
    kept = response_ids.tolist()
    completions = tokenizer.batch_decode(
        [ids[:n] for ids, n in zip(kept, lengths.tolist())], skip_special_tokens=True
    )
    logprobs = None
    if engine_logprobs is not None:
        logprobs = _right_pad(engine_logprobs, 0.0, width, torch.float32, device)
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        response_lengths=lengths,
        finished=finished,
        group_ids=group_ids,
        prompts=[p for p in prompts for _ in range(num_samples)],
        completions=completions,
        answers=[a for a in answers for _ in range(num_samples)],
        num_samples=num_samples,
        pad_token_id=pad_id,
        engine_logprobs=logprobs,
    )


def _right_pad(
    rows: Sequence[Sequence[Any]], value: Any, width: int, dtype: torch.dtype, device: Any
) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out.to(device)


def _forward_parameters(model: torch.nn.Module) -> Mapping[str, inspect.Parameter]:
    """The named parameters of ``model.forward`` ({} when its signature cannot be read); of the
    wrapped model's for a peft model (whose own forward passes ``**kwargs`` through)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return {}


DROP_ROWS_AT = 0.75
"""The sampler drops the rows that have stopped from its batch (the KV cache, attention mask
and positions) before a decoding step where the rows still generating are at most this
fraction of the rows in the batch. Dropping copies the kept rows' cache once (about what one
step's attention reads); from then on every step skips the dropped rows' whole forward (at
least a quarter of the batch). The rule drops at most about log(b) / log(4/3) times per chunk
(11 times for 24 rows), so the copies stay a small part of a rollout; dropping at every finished
row would copy the cache once per answer."""


@dataclass(frozen=True)
class _Decoding:
    """How a call samples each chunk (:func:`_sample_cache_loop`'s settings): the same for every
    chunk, the one generator included."""

    max_new_tokens: int
    temperature: float  # 0: greedy
    generator: torch.Generator
    draw: Draw
    stop_ids: torch.Tensor  # (s,) long: the ids that end a row
    pad_id: int
    drop_rows: bool = True  # rows that have stopped leave the batch (DROP_ROWS_AT)


@dataclass
class _Batch:
    """The rows of one chunk still in the sampler's batch, and what its forward reads of them."""

    kv_cache: Any  # pre-sized (:mod:`gmts.sampling.kv_cache`), written in place
    cache: dict[str, Any]  # {the name ``forward`` declares for its cache: kv_cache}
    full_mask: torch.Tensor  # (a, P + max_new_tokens) long: the prompt's mask, then ones
    next_position: torch.Tensor  # (a, 1) the position of the token fed next
    in_batch: torch.Tensor  # (a,) the chunk's rows in the batch, increasing
    can_drop: bool  # whether every layer of the cache can drop rows

    def drop_finished(self, finished: torch.Tensor, generating: int) -> None:
        """Keep only the rows still generating (cache, mask, positions) when the rule of
        :data:`DROP_ROWS_AT` says so; ``finished``: (b,) bool over the chunk's rows."""
        in_batch = len(self.in_batch)
        if not (self.can_drop and generating < in_batch and generating <= DROP_ROWS_AT * in_batch):
            return
        keep = (~finished[self.in_batch]).nonzero().squeeze(1)  # (a',) positions in the batch
        self.kv_cache.batch_select_indices(keep)
        self.full_mask = self.full_mask[keep]  # (a', P + max_new_tokens)
        self.next_position = self.next_position[keep]  # (a', 1)
        self.in_batch = self.in_batch[keep]  # (a',)

    def forward(self, model: torch.nn.Module, token: torch.Tensor, width: int) -> torch.Tensor:
        """Feed ``token`` ((b,) over the chunk's rows) of the rows in the batch, attending to
        the first ``width`` columns -> the next logits (a, V)."""
        out = model(
            input_ids=token[self.in_batch, None],
            attention_mask=self.full_mask[:, :width],  # (a, width)
            position_ids=self.next_position,
            use_cache=True,
            **self.cache,
        )
        self.next_position = self.next_position + 1
        return out.logits[:, -1, :]


def _prefill(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    share: bool = True,
) -> tuple[torch.Tensor, _Batch]:
    """The prompt's forward into a fresh cache sized for the prompt plus ``max_new_tokens`` ->
    the last position's logits (b, V) and the batch of every row.

    With ``share`` (and a cache whose rows can be selected), each DISTINCT prompt row runs
    once (a group's G rows share one) and the cache's rows and the logits are then copied out
    to every row that has it: the prefill computes ``u`` rows instead of ``b``, the values
    are those of the distinct row (a kernel may round a row differently in a batch of another
    size: see :func:`_sample_cache_loop`)."""
    from gmts.sampling.kv_cache import can_drop_rows, presized_cache

    rows, prompt_width = prompt_ids.shape
    device = prompt_ids.device
    capacity = prompt_width + max_new_tokens
    # (b, P + max_new_tokens): the prompt's mask, then ones (a stopped row still in the batch
    # keeps attending to its pads, as the model would); step s sees the first P + s + 1 columns
    full_mask = torch.ones((rows, capacity), dtype=torch.long, device=device)
    full_mask[:, :prompt_width] = prompt_mask
    attention_mask = full_mask[:, :prompt_width]  # (b, P)
    positions = position_ids_from_mask(attention_mask)  # (b, P)
    parameters = _forward_parameters(model)
    # transformers renamed the cache argument from past_key_values to cache (the old name warns)
    cache_name = "cache" if "cache" in parameters else "past_key_values"
    kv_cache = presized_cache(model.config, capacity)
    cache = {cache_name: kv_cache}
    extra = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
    fed_ids, fed_mask, copies = prompt_ids, attention_mask, None
    if share and rows > 1 and can_drop_rows(kv_cache):
        row_prompt, prompt_rows = distinct_prompts(prompt_ids, attention_mask)  # (b,), (u,)
        if prompt_rows.shape[0] < rows:
            fed_ids, fed_mask = prompt_ids[prompt_rows], attention_mask[prompt_rows]  # (u, P)
            copies = row_prompt
    out = model(
        input_ids=fed_ids,
        attention_mask=fed_mask,
        position_ids=position_ids_from_mask(fed_mask),
        use_cache=True,
        **cache,
        **extra,
    )
    logits = out.logits[:, -1, :]  # (u, V)
    if copies is not None:
        kv_cache.batch_select_indices(copies)  # (u, ...) -> (b, ...): each row its prompt's
        logits = logits.index_select(0, copies)  # (b, V)
    batch = _Batch(
        kv_cache=kv_cache,
        cache=cache,
        full_mask=full_mask,
        next_position=positions[:, -1:] + 1,  # (b, 1)
        in_batch=torch.arange(rows, device=device),
        can_drop=can_drop_rows(kv_cache),
    )
    return logits, batch


def _sample_cache_loop(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    draw: Draw,
    stop_ids: torch.Tensor,
    pad_id: int,
    drop_rows: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk with a hand-written KV-cache loop -> response_ids (b, T), lengths (b,).

    The prompt fills a fresh cache in one forward; each later forward feeds the last token of
    the rows in the batch and writes their keys/values into the same cache object. The cache
    and the attention mask are sized for the prompt plus ``max_new_tokens`` up front
    (:mod:`gmts.sampling.kv_cache`), so a step copies neither; the model sees the views of the
    filled positions.

    Each distinct prompt is prefilled once (:func:`_prefill`), and rows that have stopped
    leave the batch by the rule of :data:`DROP_ROWS_AT` (rows of the cache, mask and
    positions selected; a cache with a layer kind that cannot select rows, see
    :func:`gmts.sampling.kv_cache.can_drop_rows`, or ``drop_rows`` False, computes and keeps
    every row as before). Every step
    draws the random numbers of all ``b`` rows (:mod:`gmts.sampling.draws`) and a row attends
    only to itself, so a row gets the tokens of the loop that keeps every row wherever the
    kernels compute its row the same in a smaller batch. They need not: a matrix product's
    kernel may depend on the number of rows (measured on this project's CPU: MKL at 1 thread
    for a 1-row product, at 2 threads below 14 rows, attention at 2 threads; SmolLM2's logits
    then moved by up to 4e-5), and a token differs where its draw falls within that rounding
    (the same distribution; the same kind of difference ``batch_size`` or the thread count
    already made). The tests check equal tokens on the tiny models (1 thread; 2 by hand).
    """
    rows, prompt_width = prompt_ids.shape
    device = prompt_ids.device
    logits, batch = _prefill(model, prompt_ids, prompt_mask, max_new_tokens, share=drop_rows)
    batch.can_drop = batch.can_drop and drop_rows
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    lengths = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)
    tokens: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        drawn = _next_token(logits, temperature, generator, draw, batch.in_batch, rows)  # (a,)
        token = torch.full((rows,), pad_id, dtype=torch.long, device=device)  # (b,)
        token[batch.in_batch] = drawn
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        tokens.append(token)
        stopped_now = torch.isin(token, stop_ids) & ~finished
        lengths = torch.where(stopped_now, torch.full_like(lengths, step + 1), lengths)
        finished = finished | stopped_now
        generating = rows - int(finished.sum())
        if step == max_new_tokens - 1 or generating == 0:
            break
        batch.drop_finished(finished, generating)
        logits = batch.forward(model, token, prompt_width + step + 1)
    return torch.stack(tokens, dim=1), lengths


@torch.no_grad()
def generate_rollouts(
    model: torch.nn.Module,
    tokenizer: Any,
    problems: Sequence[Any],
    *,
    num_samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    batch_size: int | None = None,
    seed: int | None = None,
    add_special_tokens: bool = False,
    stop_token_ids: Sequence[int] | None = None,
    prepack: bool = False,
    draw: str = "multinomial",
    drop_finished_rows: bool = True,
) -> Rollout:
    """Sample ``num_samples`` completions for each problem.

    Args:
        model: any Hugging Face causal LM (put in eval mode while sampling, then restored).
        tokenizer: its tokenizer; needs an eos token (pad falls back to eos).
        problems: Q items, each a ``str`` prompt, a mapping with "prompt" (and optionally
            "answer"), or an object with ``.prompt`` (and optionally ``.answer``); answers are
            copied into ``Rollout.answers`` ("" when absent).
        num_samples: G >= 1 samples per problem; rows of a group are contiguous.
        max_new_tokens: generation budget per row (EOS included).
        temperature: softmax temperature; 0 samples greedily.
        batch_size: rows per forward chunk (None: all B = Q * G rows at once).
        seed: seeds the sampling generator; None draws one from torch's global RNG.
        add_special_tokens: passed to the tokenizer when encoding prompts (True adds e.g. a BOS).
        stop_token_ids: ids that end a row (the end token is kept in the response and mask).
            None: the tokenizer's eos plus the model's ``generation_config.eos_token_id`` (chat
            models often stop on several ids, e.g. an end-of-turn token).
        prepack: on a CPU, sample with oneDNN-prepacked copies of the float32 linear weights
            (:mod:`gmts.sampling.packed_linear`: faster steps, one more copy of those weights,
            logits equal up to rounding); a no-op on other devices and builds.
        draw: a name in :data:`gmts.sampling.draws.DRAWS` (``multinomial``:
            ``torch.multinomial``, every earlier release's stream; ``inverse_cdf``: one uniform
            per row, cheaper on a large vocabulary, other tokens for a seed).
        drop_finished_rows: a prompt prefilled once per group, stopped rows leave the batch
            (:func:`_sample_cache_loop`); False: the every-row loop before issue 34.

    Returns: a ``Rollout`` of B = Q * G rows on the model's device.
    """
    check_sampling(num_samples, max_new_tokens, temperature, batch_size)
    draw_token = DRAWS.get(draw)
    stop, pad_id = _stop_and_pad(model, tokenizer, stop_token_ids)
    prompts, answers, encoded = encode_prompts(
        tokenizer, problems, add_special_tokens=add_special_tokens
    )
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = _prompt_rows(encoded, num_samples, pad_id, device)  # (B, P)
    response_ids, lengths = _sample_chunks(
        model,
        prompt_ids,
        prompt_mask,
        _Decoding(
            max_new_tokens=max_new_tokens,
            temperature=float(temperature),
            generator=_sampling_generator(seed, device),
            draw=draw_token,
            stop_ids=torch.tensor(stop, dtype=torch.long, device=device),
            pad_id=pad_id,
            drop_rows=drop_finished_rows,
        ),
        chunk=batch_size or prompt_ids.shape[0],
        prepack=prepack,
    )
    return rollout_from_responses(
        tokenizer,
        prompts=prompts,
        answers=answers,
        encoded=encoded,
        responses=response_ids,
        lengths=lengths,
        num_samples=num_samples,
        stop_ids=stop,
        pad_id=pad_id,
        device=device,
    )


def _stop_and_pad(
    model: torch.nn.Module, tokenizer: Any, stop_token_ids: Sequence[int] | None
) -> tuple[list[int], int]:
    """The ids that end a row (:func:`resolve_stop_ids`) and the padding id (the tokenizer's,
    else the first stop id)."""
    if tokenizer.eos_token_id is None and not stop_token_ids:
        raise ValueError("tokenizer must define an eos token (or pass stop_token_ids)")
    stop = resolve_stop_ids(tokenizer, getattr(model, "generation_config", None), stop_token_ids)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    return stop, pad_id


def _prompt_rows(
    encoded: Sequence[Sequence[int]], num_samples: int, pad_id: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q encoded prompts -> ids and mask (B, P), left-padded, each repeated G times in a row."""
    prompt_ids, prompt_mask = _left_pad([list(e) for e in encoded], pad_id)  # (Q, P)
    prompt_ids = prompt_ids.repeat_interleave(num_samples, dim=0).to(device)  # (B, P)
    prompt_mask = prompt_mask.repeat_interleave(num_samples, dim=0).to(device)  # (B, P)
    return prompt_ids, prompt_mask


def _sampling_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """The call's one generator on ``device``, seeded by ``seed`` (None: a seed drawn from
    torch's global RNG)."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _sample_chunks(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    decoding: _Decoding,
    *,
    chunk: int,
    prepack: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row, ``chunk`` rows at a time (:func:`_sample_cache_loop`), with the model in eval
    mode (and prepacked with ``prepack``) meanwhile -> response ids (B, T), right-padded to the
    longest chunk's width, and lengths (B,)."""
    was_training = model.training
    model.eval()
    packing = prepacked_linears(model, chunk) if prepack else contextlib.nullcontext()
    try:
        with packing:
            pieces = [
                _sample_cache_loop(
                    model,
                    prompt_ids[start : start + chunk],
                    prompt_mask[start : start + chunk],
                    max_new_tokens=decoding.max_new_tokens,
                    temperature=decoding.temperature,
                    generator=decoding.generator,
                    draw=decoding.draw,
                    stop_ids=decoding.stop_ids,
                    pad_id=decoding.pad_id,
                    drop_rows=decoding.drop_rows,
                )
                for start in range(0, prompt_ids.shape[0], chunk)
            ]
    finally:
        model.train(was_training)
    width = max(ids.shape[1] for ids, _ in pieces)
    response_ids = torch.cat(
        [
            torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=decoding.pad_id)
            for ids, _ in pieces
        ]
    )  # (B, T)
    return response_ids, torch.cat([lengths for _, lengths in pieces])


def check_sampling(
    num_samples: int, max_new_tokens: int, temperature: float, batch_size: int | None = None
) -> None:
    """Refuse sampling settings that cannot work, before any prompt is encoded (every sampler's
    check: ``generate_rollouts`` and the vLLM engine)."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
