"""Exact per-token gradient norms over all model parameters.

For every response token ``o_t`` of a sequence we want ``||grad_theta log pi(o_t)||_2`` over
*all* trainable parameters -- the quantity that entropy (ETS) and ``|E * omega|`` (GMTS) stand
in for. In a causal LM token t's log-probability depends on the whole prefix, so the per-token
gradients cannot be read off one backward pass of the summed loss.

The fast path runs ONE forward pass per sequence and then vector-Jacobian products of the
``(N,)`` vector of response log-probabilities against one-hot cotangents, ``C`` at a time, with
``torch.autograd.grad(..., is_grads_batched=True)`` (autograd vmaps the backward over the
cotangent batch). Each chunk's ``C x (#params)`` gradients are reduced to squared norms at once
and dropped, so memory is bounded by the chunk, never by ``N x (#params)``.

The reference path (:func:`loop_grad_norms`) is one plain backward pass per token; tests check
the fast path against it.

The token objective of GRPO/DAPO, ``l_t = min(r A, clip(r) A) - beta * KL_k3``, depends on the
parameters only through ``log pi(o_t)`` (r, and pi_ref / pi inside k3, are functions of it), so
``grad_theta l_t = omega_t * grad_theta log pi(o_t)`` with ``omega_t = dl_t / dlog pi(o_t)`` and
``||grad_theta l_t|| = |omega_t| * ||grad_theta log pi(o_t)||`` exactly (checked by a test
against autograd of ``l_t`` itself, KL term and clipping included).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import torch

# Budget for one chunk of batched per-token gradients (C x #params values, float32).
DEFAULT_MAX_CHUNK_BYTES = 256 * 2**20

__all__ = [
    "DEFAULT_MAX_CHUNK_BYTES",
    "trainable_parameters",
    "auto_chunk_size",
    "batched_grad_norms",
    "loop_grad_norms",
    "unpadded_row",
    "row_response_logprobs",
    "row_gradient_norms",
    "iter_row_gradient_norms",
    "token_gradient_norms",
    "METHODS",
]


def trainable_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters that the norms run over: every ``requires_grad`` parameter, tied ones once."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model: has no parameters with requires_grad=True")
    return params


def auto_chunk_size(
    params: Sequence[torch.Tensor], n: int, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
) -> int:
    """Largest chunk of tokens whose batched gradients fit in ``max_chunk_bytes`` (at least 1)."""
    per_token = sum(p.numel() * p.element_size() for p in params)
    return max(1, min(n, max_chunk_bytes // max(per_token, 1)))


def _squared_norms(grads: Sequence[torch.Tensor | None], rows: int, device) -> torch.Tensor:
    """Sum of squares over every non-batch dim of each gradient, summed over params -> (rows,)."""
    total = torch.zeros(rows, dtype=torch.float64, device=device)
    for g in grads:
        if g is not None:  # a parameter the outputs do not depend on contributes 0
            # per-parameter norms in the gradient's dtype (fp32 pairwise sums are far more
            # precise than the 1e-5 the tests ask for), accumulated across parameters in fp64
            part = torch.linalg.vector_norm(g.reshape(rows, -1), dim=1, dtype=torch.float32)
            total += part.to(torch.float64).square()
    return total


def batched_grad_norms(
    outputs: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    chunk_size: int | None = None,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
    retain_graph: bool = False,
) -> torch.Tensor:
    """Exact ``||d outputs[n] / d params||_2`` for every n, by chunked batched VJPs.

    Args:
        outputs: ``(N,)`` scalars of one autograd graph (e.g. the response log-probs of a sequence).
        params: leaf tensors to differentiate with respect to (the norm runs over all of them).
        chunk_size: cotangents per batched backward pass; None picks the largest chunk whose
            gradients fit in ``max_chunk_bytes``.
        retain_graph: keep the graph after the last chunk (the graph is always kept in between).

    Returns:
        ``(N,)`` float32 norms, on ``outputs.device``.
    """
    if outputs.dim() != 1:
        raise ValueError(f"outputs: expected a 1-D tensor (N,), got shape {tuple(outputs.shape)}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    params = list(params)
    n = outputs.numel()
    if n == 0:
        return outputs.new_zeros(0, dtype=torch.float32)
    if not outputs.requires_grad:
        raise ValueError("outputs: does not require grad (computed under no_grad?)")
    chunk = chunk_size or auto_chunk_size(params, n, max_chunk_bytes)
    squared = torch.zeros(n, dtype=torch.float64, device=outputs.device)
    eye = torch.eye(n, dtype=outputs.dtype, device=outputs.device)  # (N, N) one-hot cotangents
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        grads = torch.autograd.grad(
            outputs,
            params,
            grad_outputs=eye[start:stop],  # (C, N)
            is_grads_batched=True,
            retain_graph=retain_graph or stop < n,
            allow_unused=True,
        )  # each (C, *param.shape)
        squared[start:stop] = _squared_norms(grads, stop - start, outputs.device)
        del grads
    return squared.sqrt().to(torch.float32)


def loop_grad_norms(
    outputs: torch.Tensor, params: Sequence[torch.Tensor], *, retain_graph: bool = False
) -> torch.Tensor:
    """Reference: one backward pass per output; ``(N,)`` float32 norms. Slow, obviously right."""
    if outputs.dim() != 1:
        raise ValueError(f"outputs: expected a 1-D tensor (N,), got shape {tuple(outputs.shape)}")
    params = list(params)
    n = outputs.numel()
    norms = torch.zeros(n, dtype=torch.float64, device=outputs.device)
    for t in range(n):
        grads = torch.autograd.grad(
            outputs[t], params, retain_graph=retain_graph or t < n - 1, allow_unused=True
        )
        norms[t] = sum(float(g.to(torch.float64).pow(2).sum()) for g in grads if g is not None)
    return norms.sqrt().to(torch.float32)


def unpadded_row(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """One sequence without padding, and how many of its last tokens are the response.

    Args:
        input_ids: ``(L,)`` prompt (left-padded) followed by the response (right-padded, last T
            columns).
        attention_mask: ``(L,)`` 1 on real tokens.
        response_mask: ``(T,)`` bool, a prefix of True (built from lengths).

    Returns:
        ``(ids (L_b,), n_response)``; the response is ``ids[-n_response:]``.
    """
    response_mask = response_mask.bool()
    n_resp = int(response_mask.sum())
    if n_resp and not bool(response_mask[:n_resp].all()):
        raise ValueError(
            "response_mask: each row must be a prefix of True values (mask from lengths)"
        )
    T = response_mask.numel()
    P = input_ids.numel() - T
    if P < 1:
        raise ValueError("input_ids: needs at least one prompt column before the response")
    prompt = input_ids[:P][attention_mask[:P].bool()]
    if prompt.numel() == 0:
        raise ValueError("attention_mask: a row has an empty prompt")
    ids = torch.cat([prompt, input_ids[P : P + n_resp]])  # (L_b,)
    return ids, n_resp


def row_response_logprobs(
    model: torch.nn.Module, ids: torch.Tensor, n_response: int, *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward one unpadded sequence; the logits predicting its last ``n_response`` tokens.

    Returns ``(logits (n, V) float32, labels (n,))``; ``logits`` carries the autograd graph.
    """
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    L = ids.numel()
    ones = torch.ones(1, L, dtype=torch.long, device=ids.device)  # no padding in the row
    out = model(input_ids=ids[None], attention_mask=ones, use_cache=False)
    logits = out.logits[0, L - n_response - 1 : L - 1].float() / temperature  # (n, V)
    return logits, ids[L - n_response :]


METHODS = ("auto", "batched", "loop")


def row_gradient_norms(
    model: torch.nn.Module,
    ids: torch.Tensor,
    n_response: int,
    params: Sequence[torch.Tensor],
    *,
    temperature: float = 1.0,
    method: str = "auto",
    chunk_size: int | None = None,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """One forward pass of an unpadded sequence and the exact norms of its response tokens.

    Args:
        ids: ``(L,)`` the sequence; its last ``n_response`` tokens are the response.
        method: "batched" (chunked batched VJPs), "loop" (one backward per token) or "auto"
            (batched; if the model's backward cannot be vmapped -- a RuntimeError -- warn once and
            redo the row with the loop).

    Returns:
        ``(logits (n, V) float32 detached, labels (n,), norms (n,) float32, method used)``.
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {list(METHODS)}, got {method!r}")
    with torch.enable_grad():
        logits, labels = row_response_logprobs(model, ids, n_response, temperature=temperature)
        logprobs = torch.log_softmax(logits, -1).gather(-1, labels[:, None])[:, 0]  # (n,)
        if method == "loop":
            return logits.detach(), labels, loop_grad_norms(logprobs, params), "loop"
        try:
            norms = batched_grad_norms(
                logprobs, params, chunk_size=chunk_size, max_chunk_bytes=max_chunk_bytes
            )
            return logits.detach(), labels, norms, "batched"
        except RuntimeError as exc:
            if method == "batched":
                raise
            warnings.warn(
                f"batched per-token gradients failed ({str(exc).splitlines()[0][:200]}); "
                "falling back to one backward pass per token",
                RuntimeWarning,
                stacklevel=2,
            )
        logits, labels = row_response_logprobs(model, ids, n_response, temperature=temperature)
        logprobs = torch.log_softmax(logits, -1).gather(-1, labels[:, None])[:, 0]
        return logits.detach(), labels, loop_grad_norms(logprobs, params), "loop"


def token_gradient_norms(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
    method: str = "batched",
) -> torch.Tensor:
    """``||grad_theta log pi(o_t)||_2`` over all trainable parameters, for every response token.

    Each row is run on its own, without padding (positions as in KV-cached generation from a
    left-padded prompt), so padding never leaks into the result.

    Args:
        model: a causal LM returning ``.logits``; put it in eval mode (dropout off) yourself.
        input_ids: ``(B, P + T)`` prompts left-padded, then responses right-padded.
        attention_mask: ``(B, P + T)``.
        response_mask: ``(B, T)`` bool, True on response tokens (EOS included).
        method: "batched", "loop" (the reference) or "auto"; see :func:`row_gradient_norms`.

    Returns:
        ``(B, T)`` float32, 0 where ``response_mask`` is False.
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {list(METHODS)}, got {method!r}")
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids/attention_mask: expected equal (B, L) shapes, got "
            f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
        )
    if response_mask.dim() != 2 or response_mask.shape[0] != input_ids.shape[0]:
        raise ValueError(f"response_mask: expected (B, T), got {tuple(response_mask.shape)}")
    B, T = response_mask.shape
    norms = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
    rows = iter_row_gradient_norms(
        model,
        input_ids,
        attention_mask,
        response_mask,
        trainable_parameters(model),
        temperature=temperature,
        method=method,
        chunk_size=chunk_size,
        max_chunk_bytes=max_chunk_bytes,
    )
    for b, _, _, row, _ in rows:
        norms[b, : row.numel()] = row.to(norms.device)
    return norms


def iter_row_gradient_norms(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    temperature: float = 1.0,
    method: str = "auto",
    chunk_size: int | None = None,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, str]]:
    """:func:`row_gradient_norms` of every row with a non-empty response, unpadded.

    Shapes as in :func:`token_gradient_norms`. Yields ``(b, logits (n, V), labels (n,),
    norms (n,), method used)`` for row ``b``, whose response has ``n`` tokens.
    """
    for b in range(response_mask.shape[0]):
        ids, n = unpadded_row(input_ids[b], attention_mask[b], response_mask[b])
        if n == 0:
            continue
        logits, labels, norms, used = row_gradient_norms(
            model,
            ids,
            n,
            params,
            temperature=temperature,
            method=method,
            chunk_size=chunk_size,
            max_chunk_bytes=max_chunk_bytes,
        )
        yield b, logits, labels, norms, used
