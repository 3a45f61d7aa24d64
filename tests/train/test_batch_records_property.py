"""Property tests of the batch records (``Rollout``, ``TrainBatch``) against a slow reference.

Each generated case is a list of groups: a prompt (token ids of any length) and G responses of
any lengths, the pad id possibly equal to the end token. The reference keeps each row as plain
token lists; every record operation the trainer uses (select whole groups or any rows, concat,
the trim inside select, ``TrainBatch.rows`` micro-batches, the model inputs) is checked by
rebuilding each row of its result from its tokens and comparing with the reference, and by
checking the layout every consumer relies on (prompts left-padded and trimmed to the longest,
responses right-padded, masks from the lengths, group ids contiguous from 0).
Issue 33: prompts of different lengths in different groups crashed ``Rollout.concat``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gmts.sampling.rollout import Rollout, rollout_from_responses
from gmts.train.batch import TrainBatch
from gmts.train.scoring import micro_slices

END = 2  # the end token


class _Tokenizer:
    """What rollout_from_responses reads of a tokenizer: batch_decode."""

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [
            " ".join(str(t) for t in row if not (skip_special_tokens and t == END)) for row in rows
        ]


@dataclass(frozen=True)
class Row:
    """One row as plain tokens: the slow reference."""

    prompt: tuple[int, ...]
    response: tuple[int, ...]  # the generated tokens, the end token included when it stopped
    group: int  # the group's index in its record
    prompt_text: str
    answer: str
    logprobs: tuple[float, ...]

    @property
    def finished(self) -> bool:
        return len(self.response) > 0 and self.response[-1] == END


@st.composite
def groups(
    draw: st.DrawFn, max_groups: int = 4
) -> tuple[int, list[tuple[list[int], list[list[int]]]]]:
    """(G, [(prompt ids, G response id lists)]): prompt lengths 1-9, response lengths 1-7 (a
    response ends with END or is cut at its length)."""
    G = draw(st.integers(1, 4))
    out = []
    for _ in range(draw(st.integers(1, max_groups))):
        prompt = draw(st.lists(st.integers(3, 40), min_size=1, max_size=9))
        responses = []
        for _ in range(G):
            body = draw(st.lists(st.integers(3, 40), min_size=0, max_size=6))
            stops = draw(st.booleans()) or not body
            responses.append(body + [END] if stops else body)
        out.append((prompt, responses))
    return G, out


def _record(
    G: int, spec: list, pad: int, with_logprobs: bool, tag: str
) -> tuple[Rollout, list[Row]]:
    """The Rollout of ``spec`` built by the engines' own constructor, and its reference rows."""
    prompts = [f"{tag}-q{i}" for i in range(len(spec))]
    answers = [f"{tag}-a{i}" for i in range(len(spec))]
    responses = [resp for _, rs in spec for resp in rs]
    logprobs = [[-0.01 * (k + 1) - 0.1 * j for k in range(len(r))] for j, r in enumerate(responses)]
    roll = rollout_from_responses(
        _Tokenizer(),
        prompts=prompts,
        answers=answers,
        encoded=[p for p, _ in spec],
        responses=responses,
        num_samples=G,
        stop_ids=[END],
        pad_id=pad,
        engine_logprobs=logprobs if with_logprobs else None,
    )
    rows = [
        Row(
            tuple(p),
            tuple(r),
            q,
            prompts[q],
            answers[q],
            tuple(logprobs[q * G + j]) if with_logprobs else (),
        )
        for q, (p, rs) in enumerate(spec)
        for j, r in enumerate(rs)
    ]
    return roll, rows


def _rows_of(roll: Rollout) -> list[Row]:
    """Each row rebuilt from the record's tensors, checking the layout on the way."""
    B, P = roll.prompt_ids.shape
    T = roll.response_ids.shape[1]
    pad = roll.pad_token_id
    rows = []
    for i in range(B):
        pm, rm = roll.prompt_mask[i].tolist(), roll.response_mask[i].tolist()
        n_p, n_r = sum(pm), int(roll.response_lengths[i])
        assert pm == [False] * (P - n_p) + [True] * n_p, "prompt not left-padded"
        assert rm == [True] * n_r + [False] * (T - n_r), "response mask is not arange < length"
        ids_p, ids_r = roll.prompt_ids[i].tolist(), roll.response_ids[i].tolist()
        assert ids_p[: P - n_p] == [pad] * (P - n_p) and ids_r[n_r:] == [pad] * (T - n_r)
        lp = ()
        if roll.engine_logprobs is not None:
            values = roll.engine_logprobs[i].tolist()
            assert values[n_r:] == [0.0] * (T - n_r), "engine log-probs not 0 on padding"
            lp = tuple(values[:n_r])
        response = tuple(ids_r[:n_r])
        assert bool(roll.finished[i]) == (n_r > 0 and response[-1] == END)
        rows.append(
            Row(
                tuple(ids_p[P - n_p :]),
                response,
                int(roll.group_ids[i]),
                roll.prompts[i],
                roll.answers[i],
                lp,
            )
        )
    if B:  # trimmed: the widths are the longest prompt and response, no wider
        assert max(len(r.prompt) for r in rows) == P
        assert max(len(r.response) for r in rows) == T
        ids = [r.group for r in rows]
        assert ids == sorted(ids) and sorted(set(ids)) == list(range(max(ids) + 1)), ids
        assert roll.num_groups == len(set(ids))
    return rows


def _same(actual: list[Row], expected: list[Row]) -> None:
    """Rows equal; log-probs to float32 precision; group ids compared as a partition."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert (a.prompt, a.response, a.prompt_text, a.answer) == (
            e.prompt,
            e.response,
            e.prompt_text,
            e.answer,
        )
        if a.logprobs or e.logprobs:
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(e.logprobs), atol=1e-6)
    first: dict[int, int] = {}
    for a, e in zip(actual, expected):  # same-group rows stay together, different ones apart
        assert first.setdefault(e.group, a.group) == a.group
    assert len(set(first.values())) == len(first)


def _renumber(rows: list[Row]) -> list[Row]:
    order = sorted({r.group for r in rows})
    return [
        Row(r.prompt, r.response, order.index(r.group), r.prompt_text, r.answer, r.logprobs)
        for r in rows
    ]


def _model_inputs_match(record: Rollout | TrainBatch, rows: list[Row]) -> None:
    """input_ids / attention_mask / position_ids of every row: the row's prompt then response,
    positions 0.. over its real tokens (what the sampler used), whatever the padding."""
    ids, mask, pos = record.input_ids, record.attention_mask.bool(), record.position_ids
    for i, row in enumerate(rows):
        real = row.prompt + row.response
        assert ids[i][mask[i]].tolist() == list(real)
        assert pos[i][mask[i]].tolist() == list(range(len(real)))


@settings(max_examples=60, deadline=None)
@given(a=groups(), b=groups(), pad=st.sampled_from([0, END]), with_lp=st.booleans(), data=st.data())
def test_select_concat_and_micro_batches_rebuild_every_row(a, b, pad, with_lp, data) -> None:
    Ga, spec_a = a
    spec_b = [(p, rs[:1] * Ga if len(rs) < Ga else rs[:Ga]) for p, rs in b[1]]  # same G
    roll_a, ref_a = _record(Ga, spec_a, pad, with_lp, "a")
    roll_b, ref_b = _record(Ga, spec_b, pad, with_lp, "b")
    _same(_rows_of(roll_a), ref_a)
    _same(_rows_of(roll_b), ref_b)

    # select whole groups, as DAPO's filter does (rows = keep.repeat_interleave(G))
    keep_a = torch.tensor(
        data.draw(st.lists(st.booleans(), min_size=len(spec_a), max_size=len(spec_a)))
    )
    keep_b = torch.tensor(
        data.draw(st.lists(st.booleans(), min_size=len(spec_b), max_size=len(spec_b)))
    )
    keep_a[0] = keep_b[0] = True
    picked_a = roll_a.select(keep_a.repeat_interleave(Ga))
    picked_b = roll_b.select(keep_b.repeat_interleave(Ga))
    exp_a = _renumber([r for r in ref_a if keep_a[r.group]])
    exp_b = _renumber([r for r in ref_b if keep_b[r.group]])
    _same(_rows_of(picked_a), exp_a)
    _same(_rows_of(picked_b), exp_b)

    # concat (collect's assembly): rows in order, later groups offset
    joined = Rollout.concat([picked_a, picked_b])
    offset = picked_a.num_groups
    expected = exp_a + [
        Row(r.prompt, r.response, r.group + offset, r.prompt_text, r.answer, r.logprobs)
        for r in exp_b
    ]
    _same(_rows_of(joined), expected)
    _model_inputs_match(joined, expected)

    # select any rows (indices, possibly splitting groups) of the joined record
    n = joined.batch_size
    index = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    some = joined.select(index)
    _same(_rows_of(some), _renumber([expected[i] for i in index]))

    # the train batch and its micro-batches (TrainBatch.rows over micro_slices)
    rewards = torch.arange(n, dtype=torch.float32)
    batch = TrainBatch.from_rollout(joined, rewards, -rewards, group_offset=5)
    _model_inputs_match(batch, expected)
    size = data.draw(st.integers(1, n))
    covered = []
    for piece in micro_slices(n, size):
        micro = batch.rows(piece)
        rows = expected[piece]
        _model_inputs_match(micro, rows)
        assert micro.group_ids.tolist() == [r.group + 5 for r in rows]
        assert micro.rewards.tolist() == rewards[piece].tolist()
        for i, row in enumerate(rows):
            length = len(row.response)
            assert micro.response_mask[i].sum() == length
            assert micro.response_ids[i, :length].tolist() == list(row.response)
        covered.extend(range(n)[piece])
    assert covered == list(range(n))


def test_concat_of_groups_whose_prompts_differ_in_length() -> None:
    """The case that crashed training (issue 33): select trims a group whose prompts are
    shorter than the batch's, then concat joins it with a longer one."""
    roll, ref = _record(
        2, [([5, 6, 7, 8], [[9, END], [9, 9]]), ([5], [[9, END], [END]])], 0, False, "x"
    )
    short = roll.select(torch.tensor([False, False, True, True]))
    assert short.prompt_ids.shape == short.prompt_mask.shape == (2, 1)
    joined = Rollout.concat([roll.select(torch.tensor([True, True, False, False])), short])
    _same(_rows_of(joined), ref)
