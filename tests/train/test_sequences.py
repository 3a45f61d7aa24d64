"""Rollout and TrainBatch share one definition of the model inputs (gmts.sampling.sequences)."""

from __future__ import annotations

import torch

from gmts.sampling.rollout import Rollout
from gmts.sampling.sequences import position_ids_from_mask
from gmts.train.batch import TrainBatch


def test_rollout_and_train_batch_give_the_model_the_same_inputs() -> None:
    prompt_ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 4]])  # left-padded with 0
    prompt_mask = prompt_ids != 0
    response_ids = torch.tensor([[3, 2, 0], [1, 0, 0]])  # right-padded
    response_mask = torch.tensor([[True, True, False], [True, False, False]])
    roll = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        response_lengths=torch.tensor([2, 1]),
        finished=torch.tensor([True, True]),
        group_ids=torch.tensor([0, 0]),
        prompts=["a", "b"],
        completions=["c", "d"],
        answers=["e", "f"],
        num_samples=2,
    )
    batch = TrainBatch.from_rollout(roll, torch.zeros(2), torch.zeros(2))
    for name in ("input_ids", "attention_mask", "position_ids"):
        assert torch.equal(getattr(roll, name), getattr(batch, name)), name
    assert batch.input_ids.tolist() == [[0, 0, 5, 6, 3, 2, 0], [7, 8, 9, 4, 1, 0, 0]]
    # left padding gets position 0; real tokens count from 0; padding after the answer keeps
    # the last position (never read: masked)
    assert batch.position_ids.tolist() == [[0, 0, 0, 1, 2, 3, 3], [0, 1, 2, 3, 4, 4, 4]]
    assert torch.equal(batch.position_ids, position_ids_from_mask(batch.attention_mask))
