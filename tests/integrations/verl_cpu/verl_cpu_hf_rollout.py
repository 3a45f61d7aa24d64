"""Test scaffolding: a transformers-based "hf" rollout for verl 0.9.1 on CPU.

verl registers only GPU inference servers (vLLM, SGLang, TensorRT-LLM). This module, loaded
through ``VERL_USE_EXTERNAL_MODULES``, registers a rollout named "hf" in verl's two registries:

- ``_ROLLOUT_REGISTRY[("hf", "async")]`` -> :class:`HFServerAdapter`, the object the actor
  worker drives (resume / release / update_weights);
- ``RolloutReplicaRegistry`` "hf" -> :class:`HFReplica`, which starts one :class:`HFServer` Ray
  actor per replica. verl's agent loop sends it token-in/token-out ``generate`` requests.

The server samples with plain transformers (temperature, top-k, top-p), returns the sampled
tokens' log-probs, and receives the actor's weights on every weight sync. Not product code.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray
import torch
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput


def _server_name(replica_rank: int) -> str:
    return f"gmts_hf_rollout_server_{replica_rank}"


@ray.remote(num_cpus=0)
class HFServer:
    """One CPU inference server: a transformers causal LM with token-in/token-out sampling."""

    def __init__(self, config: Any, model_config: Any) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        path = model_config.get("local_path", None) or model_config.get("path")  # a DictConfig
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.max_new_tokens = int(config.response_length)
        self.eos = set(_as_list(self.model.generation_config.eos_token_id))
        self.generator = torch.Generator().manual_seed(int(getattr(config, "seed", 0) or 0))
        self.global_steps: int | None = None
        self.lock = asyncio.Lock()

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **_: Any
    ) -> TokenOutput:
        async with self.lock:  # one sequence at a time: a tiny model on a shared CPU
            tokens, logprobs = self._sample(list(prompt_ids), sampling_params)
        return TokenOutput(
            token_ids=tokens,
            log_probs=logprobs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    @torch.no_grad()
    def _sample(
        self, prompt_ids: list[int], params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        temperature = float(params.get("temperature", 1.0))
        top_k, top_p = int(params.get("top_k", -1)), float(params.get("top_p", 1.0))
        ids = torch.tensor([prompt_ids])
        past, tokens, logprobs = None, [], []
        for _ in range(self.max_new_tokens):
            out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()  # (V,)
            if temperature <= 0:  # greedy
                token = int(logits.argmax())
                logprob = float(torch.log_softmax(logits, -1)[token])
            else:
                logits = _filter(logits / temperature, top_k, top_p)
                log_p = torch.log_softmax(logits, -1)
                token = int(torch.multinomial(log_p.exp(), 1, generator=self.generator))
                logprob = float(log_p[token])
            tokens.append(token)
            logprobs.append(logprob)
            if token in self.eos:
                break
            ids = torch.tensor([[token]])
        return tokens, logprobs

    def load_weights(self, state: dict[str, torch.Tensor]) -> int:
        result = self.model.load_state_dict(state, strict=False)
        if result.unexpected_keys or not state:
            raise ValueError(f"weight sync: {len(state)} tensors, unknown {result.unexpected_keys}")
        return len(state)

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # lifecycle calls verl makes on a rollout server; nothing to free on CPU
    async def wake_up(self, *args: Any, **kwargs: Any) -> None: ...
    async def sleep(self, *args: Any, **kwargs: Any) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [int(value)]


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k, then top-p (nucleus) filtering of a (V,) logit vector."""
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, -1).cumsum(-1)
        drop = cumulative - torch.softmax(ordered, -1) > top_p  # keep the first token always
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


class HFServerAdapter(rollout_base.BaseRollout):
    """Runs in the actor worker: pushes the trainer's weights to this replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_leader = rank % world == 0

    async def resume(self, tags: list[str]) -> None: ...
    async def release(self) -> None: ...

    async def update_weights(self, weights: Any, global_steps: int | None = None, **kwargs: Any):
        state = {name: tensor.detach().to("cpu", torch.float32).clone() for name, tensor in weights}
        if not self.is_leader:
            return
        server = ray.get_actor(_server_name(self.replica_rank))
        await server.load_weights.remote(state)
        if global_steps is not None:
            await server.set_global_steps.remote(global_steps)


class HFReplica(RolloutReplica):
    """One HFServer per replica (hybrid mode: colocated with the actor worker)."""

    async def launch_servers(self) -> None:
        server = HFServer.options(
            name=_server_name(self.replica_rank), max_concurrency=self.max_concurrency
        ).remote(self.config, self.model_config)
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"127.0.0.1:{40000 + self.replica_rank}"  # never dialled

    def rollout_worker_use_gpu(self) -> bool:
        return False


rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = f"{__name__}.HFServerAdapter"
RolloutReplicaRegistry.register("hf", lambda: HFReplica)
