"""Per-token log-probabilities, entropy and logit-gradient norm, chunked over tokens.

Every function here works on ``N`` flattened token positions in chunks of ``chunk_size`` rows
so that the extra memory is O(chunk_size x V), never O(N x V): the forward pass keeps only
three float32 numbers per token, and the backward pass recomputes each chunk's softmax.
Input logits (or hidden states) may be any float dtype; all reductions run in float32.

Shapes: ``labels`` is any shape ``S`` (usually ``(B, T)``), logits ``S + (V,)``,
hidden states ``S + (H,)``, the output-layer weight ``(V, H)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "TokenStatistics",
    "token_logprobs_and_entropy",
    "token_logprobs_and_entropy_from_hidden",
    "token_statistics",
    "token_statistics_from_hidden",
    "default_chunk_size",
]

# Elements of one (chunk, V) float32 block: 2^24 floats = 64 MiB.
_CHUNK_ELEMENTS = 1 << 24
_MIN_TILE_COLUMNS = 1024  # narrowest vocabulary tile of the from-hidden backward


@dataclass(frozen=True)
class TokenStatistics:
    """Per-token statistics of the sampled tokens, all float32 of ``labels.shape``.

    Attributes:
        logprobs: log pi(o_t) at the given temperature; the only field that carries gradients.
        entropy: E_t = -sum_j p_j log p_j (no gradient).
        logit_grad_norm: G_t = ||d log p(o_t) / d z_t||_2 = sqrt(1 - 2 p_t + sum_j p_j^2), the
            exact logit-gradient norm of Proposition 3.1 (no gradient), or None when not requested.
            With temperature T the gradient w.r.t. the raw logits is G_t / T; G_t itself is
            reported w.r.t. the tempered logits z / T, as in the paper.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor
    logit_grad_norm: torch.Tensor | None = None


def default_chunk_size(vocab_size: int) -> int:
    """Rows per chunk so that one (chunk, V) float32 block holds about 2^24 elements."""
    return max(1, _CHUNK_ELEMENTS // max(1, vocab_size))


def _check_temperature(temperature: float) -> float:
    temperature = float(temperature)
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    return temperature


def _check_chunk_size(chunk_size: int | None, vocab_size: int) -> int:
    if chunk_size is None:
        return default_chunk_size(vocab_size)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    return chunk_size


def _check_labels(labels: torch.Tensor, vocab_size: int, name_of_v: str) -> None:
    if labels.numel() > 0:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"labels must lie in [0, {name_of_v}={vocab_size}), got values in [{lo}, {hi}] "
                "(give masked positions any valid token id, e.g. the pad id)"
            )


def _chunk_forward(
    z: torch.Tensor, labels: torch.Tensor, temperature: float, want_g: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Statistics of one chunk of raw logits ``z`` (n, V) -> (logprob, entropy, lse, G), each (n,)."""
    z = z.float()  # (n, V) fp32 accumulation for bf16/fp16 input
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)  # (n,)
    logp_all = z - lse[:, None]  # (n, V)
    p = logp_all.exp()  # (n, V)
    entropy = -torch.einsum("nv,nv->n", p, logp_all)  # (n,); a batched dot, no (n, V) temp
    logprob = logp_all.gather(-1, labels[:, None]).squeeze(-1)  # (n,)
    g = None
    if want_g:
        p_t = logprob.exp()
        sum_p2 = torch.einsum("nv,nv->n", p, p)  # (n,)
        g = (1.0 - 2.0 * p_t + sum_p2).clamp_min(0.0).sqrt()
    return logprob, entropy, lse, g


def _check_finite(logprob: torch.Tensor, entropy: torch.Tensor, lse: torch.Tensor) -> None:
    """One device sync after all chunks: any inf/nan logit makes lse, entropy or the log-prob
    non-finite (+inf/nan -> lse; -inf -> entropy is nan (0 * -inf) or logprob is -inf)."""
    finite = torch.isfinite(lse).all() & torch.isfinite(entropy).all()
    if not bool(finite & torch.isfinite(logprob).all()):
        raise ValueError("logits must be finite; found inf or nan (or the log-softmax overflowed)")


def _chunk_grad_z(
    z: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    temperature: float,
    col_start: int = 0,
) -> torch.Tensor:
    """d(sum_t grad_t * logprob_t) / d raw logits for one block: grad * (onehot - p) / T, fp32.

    ``z`` (n, c) holds the raw logits of vocabulary columns ``[col_start, col_start + c)``
    (all of them by default); a label outside those columns adds nothing to the block.
    """
    z = z.float()
    if temperature != 1.0:
        z = z / temperature
    dz = (z - lse[:, None]).exp_().mul_(-grad[:, None])  # (n, c) = -grad * p
    local = labels - col_start  # (n,) label column inside the block
    inside = (local >= 0) & (local < z.shape[1])
    # + grad at the label (0 where the label lies in another block); no host sync
    dz.scatter_add_(-1, local.clamp(0, z.shape[1] - 1)[:, None], (grad * inside)[:, None])
    if temperature != 1.0:
        dz.div_(temperature)
    return dz


Block = tuple[slice, slice]


def _blocks(rows: int, cols: int, chunk: int) -> list[Block]:
    """(row slice, column slice) blocks of at most ``chunk`` tokens covering a (rows, cols) grid.

    Whole rows are grouped when a row fits in a chunk, otherwise rows are cut along the
    columns, so a block of a sliced (B, T, V) tensor such as ``logits[:, :-1]`` is either a
    small copy or a contiguous view, never a copy of the whole tensor.
    """
    if rows == 0 or cols == 0:
        return []
    if cols <= chunk:
        per = chunk // cols
        return [(slice(r, min(rows, r + per)), slice(0, cols)) for r in range(0, rows, per)]
    return [
        (slice(r, r + 1), slice(c, min(cols, c + chunk)))
        for r in range(rows)
        for c in range(0, cols, chunk)
    ]


def _forward_blocks(
    block_logits: Callable[[slice, slice], torch.Tensor],
    labels: torch.Tensor,
    temperature: float,
    chunk_size: int,
    want_g: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Forward pass shared by both autograd functions: ``(logprob, entropy, lse, G)``, each
    float32 ``(B, T)`` like ``labels``. ``block_logits(rs, cs)`` returns the raw logits
    ``(n, V)`` of the block ``labels[rs, cs]`` (flattened); only one block exists at a time."""
    logprob = torch.empty(labels.shape, dtype=torch.float32, device=labels.device)  # (B, T)
    entropy, lse = torch.empty_like(logprob), torch.empty_like(logprob)
    g = torch.empty_like(logprob) if want_g else None
    for rs, cs in _blocks(*labels.shape, chunk_size):
        block = labels[rs, cs]
        lp, ent, ls, gg = _chunk_forward(
            block_logits(rs, cs), block.reshape(-1), temperature, want_g
        )
        logprob[rs, cs] = lp.view(block.shape)
        entropy[rs, cs] = ent.view(block.shape)
        lse[rs, cs] = ls.view(block.shape)
        if g is not None:
            g[rs, cs] = gg.view(block.shape)
    _check_finite(logprob, entropy, lse)
    return logprob, entropy, lse, g


class _LogitsStats(torch.autograd.Function):
    """logits (B, T, V), labels (B, T) -> logprob, entropy, G (B, T); backward recomputes."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_size, want_g):  # type: ignore[override]
        vocab = logits.shape[-1]
        logprob, entropy, lse, g = _forward_blocks(
            lambda rs, cs: logits[rs, cs].reshape(-1, vocab),  # (n, V)
            labels,
            temperature,
            chunk_size,
            want_g,
        )
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(entropy, lse)
        if want_g:
            ctx.mark_non_differentiable(g)
        return logprob, entropy, g

    @staticmethod
    def backward(ctx, grad_logprob, _grad_entropy, _grad_g):  # type: ignore[override]
        logits, labels, lse = ctx.saved_tensors
        if grad_logprob is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        vocab = logits.shape[-1]
        for rs, cs in _blocks(*labels.shape, ctx.chunk_size):
            dz = _chunk_grad_z(
                logits[rs, cs].reshape(-1, vocab),
                labels[rs, cs].reshape(-1),
                lse[rs, cs].reshape(-1),
                grad_logprob[rs, cs].reshape(-1),
                ctx.temperature,
            )  # (n, V) float32
            grad_logits[rs, cs] = dz.view(grad_logits[rs, cs].shape).to(logits.dtype)
        return grad_logits, None, None, None, None


class _HiddenStats(torch.autograd.Function):
    """hidden (B, T, H), weight (V, H), labels (B, T) -> logprob, entropy, G (B, T), never
    building the (B, T, V) logits."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_size, want_g):  # type: ignore[override]
        width = hidden.shape[-1]
        logprob, entropy, lse, g = _forward_blocks(
            lambda rs, cs: hidden[rs, cs].reshape(-1, width) @ weight.T,  # (n, V), input dtype
            labels,
            temperature,
            chunk_size,
            want_g,
        )
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(entropy, lse)
        if want_g:
            ctx.mark_non_differentiable(g)
        return logprob, entropy, g

    @staticmethod
    def backward(ctx, grad_logprob, _grad_entropy, _grad_g):  # type: ignore[override]
        hidden, weight, labels, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_logprob is None or not (need_h or need_w):
            return None, None, None, None, None, None
        width, vocab = hidden.shape[-1], weight.shape[0]
        grad_hidden = (
            torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_h else None
        )
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        )  # (V, H) float32 accumulator over token blocks
        # Tiles of (tokens x vocabulary columns) with as many elements as a forward block. Many
        # tokens per tile keep the large (V, H) gradient to one pass per token block (a single
        # block for typical N), instead of one read-modify-write of it per chunk of tokens.
        elements = ctx.chunk_size * vocab
        min_cols = min(vocab, _MIN_TILE_COLUMNS)
        for rs, cs in _blocks(*labels.shape, max(1, elements // min_cols)):
            h = hidden[rs, cs].reshape(-1, width)  # (n, H)
            n = h.shape[0]
            block_labels = labels[rs, cs].reshape(-1)
            block_lse = lse[rs, cs].reshape(-1)
            block_grad = grad_logprob[rs, cs].reshape(-1)
            dh = torch.zeros(n, width, dtype=torch.float32, device=h.device) if need_h else None
            cols = max(min_cols, elements // max(n, 1))
            for v0 in range(0, vocab, cols):
                w = weight[v0 : v0 + cols]  # (c, H)
                dz = _chunk_grad_z(
                    h @ w.T, block_labels, block_lse, block_grad, ctx.temperature, v0
                ).to(hidden.dtype)  # (n, c), matmuls in the input dtype as autograd would
                if need_h and dz.dtype == torch.float32:
                    dh.addmm_(dz, w)  # (n, H)
                elif need_h:
                    dh += (dz @ w).float()
                if need_w and dz.dtype == torch.float32:
                    grad_weight[v0 : v0 + cols].addmm_(dz.T, h)  # (c, H), in place
                elif need_w:
                    grad_weight[v0 : v0 + cols] += (dz.T @ h).float()
            if need_h:
                grad_hidden[rs, cs] = dh.view(grad_hidden[rs, cs].shape).to(hidden.dtype)
        if need_w:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _wrap(
    lp: torch.Tensor, ent: torch.Tensor, g: torch.Tensor | None, shape: torch.Size
) -> TokenStatistics:
    """Reshape to ``shape``; entropy and G never carry gradients."""
    return TokenStatistics(
        lp.view(shape),
        ent.detach().view(shape),
        g.detach().view(shape) if g is not None else None,
    )


def _as_3d(
    x: torch.Tensor, labels: torch.Tensor, name: str, last: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate and view ``x`` (S + (D,)) and ``labels`` (S) as (B, T, D) and (B, T).

    Two-dimensional ``S`` (the usual (B, T)) is used as is, so sliced model outputs are not
    copied; 1-D ``S`` becomes (1, N); higher ranks flatten their leading dimensions.
    """
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point torch.Tensor")
    if x.dim() != labels.dim() + 1 or tuple(x.shape[:-1]) != tuple(labels.shape):
        raise ValueError(
            f"{name} must have shape labels.shape + ({last},) = {tuple(labels.shape)} + ({last},), "
            f"got {tuple(x.shape)}"
        )
    labels = labels.long()
    if labels.dim() == 0:
        return x.reshape(1, 1, -1), labels.reshape(1, 1)
    if labels.dim() == 1:
        return x.unsqueeze(0), labels.unsqueeze(0)
    cols = labels.shape[-1]
    return x.reshape(-1, cols, x.shape[-1]), labels.reshape(-1, cols)


def token_statistics(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    logit_grad_norm: bool = False,
) -> TokenStatistics:
    """Log-prob, entropy and (optionally) logit-gradient norm of each labelled token.

    Args:
        logits: ``S + (V,)`` raw logits (any float dtype) predicting ``labels``; divided by
            ``temperature`` before the softmax.
        labels: ``S`` integer token ids in [0, V).
        temperature: > 0.
        chunk_size: tokens per block (default: about 2^24 / V, a 64 MiB float32 block).
        logit_grad_norm: also compute G_t (Proposition 3.1) in the same pass.

    Returns:
        TokenStatistics with float32 tensors of shape ``S``; gradients flow to ``logits``
        through ``logprobs`` only. Neither the forward nor the backward pass holds more than one
        (chunk_size, V) float32 block besides the input and its gradient.
    """
    temperature = _check_temperature(temperature)
    logits3, labels2 = _as_3d(logits, labels, "logits", "V")  # (B, T, V), (B, T)
    _check_labels(labels2, logits3.shape[-1], "V")
    chunk = _check_chunk_size(chunk_size, logits3.shape[-1])
    lp, ent, g = _LogitsStats.apply(logits3, labels2, temperature, chunk, logit_grad_norm)
    return _wrap(lp, ent, g, labels.shape)


def token_statistics_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    logit_grad_norm: bool = False,
) -> TokenStatistics:
    """Like :func:`token_statistics` but from final hidden states and the output-layer weight.

    Args:
        hidden: ``S + (H,)`` final hidden states (after the last norm), any float dtype.
        lm_head_weight: ``(V, H)`` output-layer weight (logits = hidden @ weight.T, no bias),
            same dtype as ``hidden``.
        labels: ``S`` integer token ids in [0, V).

    Returns:
        TokenStatistics of shape ``S``. The full (N, V) logits are never built, neither in the
        forward nor in the backward pass; gradients flow to ``hidden`` and ``lm_head_weight``
        through ``logprobs``.
    """
    temperature = _check_temperature(temperature)
    hidden3, labels2 = _as_3d(hidden, labels, "hidden", "H")  # (B, T, H), (B, T)
    if not isinstance(lm_head_weight, torch.Tensor) or lm_head_weight.dim() != 2:
        raise ValueError("lm_head_weight must be a 2-D tensor of shape (V, H)")
    if lm_head_weight.shape[1] != hidden3.shape[-1]:
        raise ValueError(
            f"lm_head_weight must have shape (V, H={hidden3.shape[-1]}), "
            f"got {tuple(lm_head_weight.shape)}"
        )
    if lm_head_weight.dtype != hidden3.dtype:
        raise ValueError(
            f"lm_head_weight dtype {lm_head_weight.dtype} must equal hidden dtype {hidden3.dtype}"
        )
    vocab = lm_head_weight.shape[0]
    _check_labels(labels2, vocab, "V")
    chunk = _check_chunk_size(chunk_size, vocab)
    lp, ent, g = _HiddenStats.apply(
        hidden3, lm_head_weight, labels2, temperature, chunk, logit_grad_norm
    )
    return _wrap(lp, ent, g, labels.shape)


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, entropy)``, float32 of ``labels.shape``; see :func:`token_statistics`."""
    stats = token_statistics(logits, labels, temperature=temperature, chunk_size=chunk_size)
    return stats.logprobs, stats.entropy


def token_logprobs_and_entropy_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs, entropy)`` from hidden states; see :func:`token_statistics_from_hidden`."""
    stats = token_statistics_from_hidden(
        hidden, lm_head_weight, labels, temperature=temperature, chunk_size=chunk_size
    )
    return stats.logprobs, stats.entropy
