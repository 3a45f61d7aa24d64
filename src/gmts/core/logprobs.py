"""Per-token log-probabilities, entropy and logit-gradient norm, in bounded memory.

Every function here works on ``N`` flattened token positions in blocks of at most
``chunk_size x V`` logits, so that the extra memory is O(chunk_size x V), never O(N x V): the
forward pass keeps a few numbers per token, the backward pass recomputes each block's softmax.
Inputs (logits or hidden states) may be any float dtype; all reductions run in float32, or in
float64 for float64 input.

The hidden-state path cuts its blocks into tiles of (tokens x vocabulary columns) with many
tokens per tile, so that its matmuls have the large shapes of the naive ``hidden @ weight.T``
(a tile of 110 tokens x V ran the forward matmul at half speed). A row's tiles are combined
with a running log-sum-exp (:class:`_RowPartials`); the backward forms the logit gradient
``grad * (onehot - p)`` tile by tile and adds the one-hot part once per block.

Shapes: ``labels`` is any shape ``S`` (usually ``(B, T)``), logits ``S + (V,)``,
hidden states ``S + (H,)``, the output-layer weight ``(V, H)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

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
_MIN_TILE_COLUMNS = 1024  # narrowest vocabulary tile of the from-hidden path


@dataclass(frozen=True)
class TokenStatistics:
    """Per-token statistics of the sampled tokens, all of ``labels.shape``, float32 (float64
    for float64 input).

    Attributes:
        logprobs: log pi(o_t) at the given temperature; the only field that carries gradients.
        entropy: E_t = -sum_j p_j log p_j (no gradient).
        logit_grad_norm: G_t = ||d log p(o_t) / d z_t||_2 = sqrt((1 - p_t)^2 + sum_{j != o_t}
            p_j^2), the exact logit-gradient norm of Proposition 3.1 (no gradient), or None when
            not requested.
            With temperature T the gradient w.r.t. the raw logits is G_t / T; G_t itself is
            reported w.r.t. the tempered logits z / T, as in the paper.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor
    logit_grad_norm: torch.Tensor | None = None


def default_chunk_size(vocab_size: int) -> int:
    """Rows per chunk so that one (chunk, V) float32 block holds about 2^24 elements."""
    return max(1, _CHUNK_ELEMENTS // max(1, vocab_size))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of every reduction: float64 stays float64, any other float is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


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


class _Scratch:
    """Reusable flat buffers, one per name: every tile of a call is a view of the same memory,
    so no (n, c) block is allocated (and page-faulted in) per tile."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._flat: dict[str, torch.Tensor] = {}

    def view(self, name: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous ``(rows, cols)`` tensor of ``dtype`` whose contents are undefined."""
        flat = self._flat.get(name)
        if flat is None or flat.numel() < rows * cols or flat.dtype != dtype:
            flat = torch.empty(rows * cols, dtype=dtype, device=self.device)
            self._flat[name] = flat
        return flat[: rows * cols].view(rows, cols)


def _tempered(z: torch.Tensor, temperature: float, out: torch.Tensor) -> torch.Tensor:
    """``out = z / temperature`` in ``out``'s dtype (``out`` may be ``z`` itself).

    The upcast comes first and the division runs in ``out``'s dtype, as ``z.float() / T``.
    """
    if out is not z:
        out.copy_(z)
    if temperature != 1.0:
        out.div_(temperature)
    return out


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(-1)`` of two (n, c) tensors without an (n, c) temporary: (n,)."""
    return torch.einsum("nc,nc->n", a, b)


@dataclass
class _RowPartials:
    """Sums over the vocabulary tiles of one block of ``n`` tokens, combined by :meth:`finish`.

    Tile k holds the tempered logits z of some columns; with its row maximum m_k and
    y = z - m_k <= 0 it contributes s_k = sum e^y, t_k = sum e^y y and q_k = sum e^(2y). With
    M = max_k m_k and w_k = e^(m_k - M):

        S = sum_k w_k s_k,   p_j = e^(z_j - M) / S,   log p_label = (z_label - M) - log S,
        entropy = log S - sum_k w_k (t_k + (m_k - M) s_k) / S,   sum_j p_j^2 = sum_k w_k^2 q_k / S^2.

    Nothing is computed from ``lse = M + log S``: in float32 that number carries the rounding
    of the logits' magnitude (6e-5 at logits near 1e3), and ``z - lse`` would carry it into
    every probability; ``z - M`` is exact near the maximum, where the probabilities are large.
    Both terms of the entropy are >= 0, so it has no cancellation either.
    """

    label_logit: torch.Tensor  # (n,) tempered logit of each token's label
    maxes: list[torch.Tensor] = field(default_factory=list)  # m_k, each (n,)
    sums: list[torch.Tensor] = field(default_factory=list)  # s_k
    weighted: list[torch.Tensor] = field(default_factory=list)  # t_k
    squares: list[torch.Tensor] = field(default_factory=list)  # q_k (only with G)
    lowest: list[torch.Tensor] = field(default_factory=list)  # row minima: -inf / nan checks

    def add(
        self,
        y: torch.Tensor,
        col_start: int,
        labels: torch.Tensor,
        want_g: bool,
        exp_out: torch.Tensor,
    ) -> None:
        """Fold in the tile ``y`` (n, c): tempered logits of columns ``[col_start, +c)``,
        overwritten here. ``exp_out`` is an (n, c) scratch tensor of y's dtype."""
        cols = y.shape[1]
        local = labels - col_start  # (n,) the label's column inside this tile
        inside = (local >= 0) & (local < cols)
        picked = y.gather(1, local.clamp(0, cols - 1)[:, None]).squeeze(1)  # (n,)
        self.label_logit = torch.where(inside, picked, self.label_logit)
        row_max = y.amax(1)  # (n,); nan propagates
        self.lowest.append(y.amin(1))  # -inf anywhere shows here
        y.sub_(row_max[:, None])  # (n, c) <= 0
        e = torch.exp(y, out=exp_out)  # (n, c)
        self.maxes.append(row_max)
        self.sums.append(e.sum(1))
        self.weighted.append(_row_dot(e, y))
        if want_g:
            self.squares.append(_row_dot(e, e))

    def finish(
        self, want_g: bool
    ) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor
    ]:
        """``(logprob, entropy, M, S, G or None, all_finite)``, each (n,) but the 0-d flag."""
        m = torch.stack(self.maxes)  # (K, n)
        top = m.amax(0)  # (n,) M
        w = torch.exp(m - top)  # (K, n)
        s = torch.stack(self.sums)  # (K, n)
        total = (w * s).sum(0)  # (n,) S
        t = torch.stack(self.weighted)  # (K, n)
        log_total = torch.log(total)
        entropy = log_total - (w * (t + (m - top) * s)).sum(0) / total
        logprob = (self.label_logit - top) - log_total
        g = None
        if want_g:
            sum_p2 = (w * w * torch.stack(self.squares)).sum(0) / (total * total)  # (n,)
            # G^2 = (1 - p)^2 + sum_{j != y} p_j^2, the second term in [0, (1 - p)^2]. Written
            # as 1 - 2p + sum p_j^2 it cancels to 0 in float32 for a confident token (p =
            # 0.99993 gave G = 0 < 1 - p); -expm1 gives 1 - p to full precision, and the
            # clamp keeps G in its exact bounds [1 - p, sqrt(2) (1 - p)].
            p = logprob.exp()
            q = -torch.expm1(logprob)  # 1 - p
            rest = torch.minimum((sum_p2 - p * p).clamp_min(0.0), q * q)
            g = (q * q + rest).sqrt()
        finite = torch.isfinite(torch.stack(self.lowest)).all() & torch.isfinite(top).all()
        return logprob, entropy, top, total, g, finite


TileSource = Callable[[slice, slice, _Scratch], Iterator[tuple[int, torch.Tensor]]]
"""``tiles(rs, cs, scratch)`` yields ``(col_start, y)`` for the block ``labels[rs, cs]``: the
tempered logits (n, c) of vocabulary columns ``[col_start, col_start + c)``, in the compute
dtype, in a tensor the caller may overwrite."""


def _forward_blocks(
    tiles: TileSource,
    labels: torch.Tensor,
    block_tokens: int,
    want_g: bool,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Forward pass shared by both autograd functions: ``(logprob, entropy, M, S, G)``, each
    ``(B, T)`` like ``labels``, in ``dtype``; M is the row maximum of the tempered logits and
    S = sum_j e^(z_j - M), so that p = e^(z - M) / S. Only one tile (and its exp) exists at
    a time."""
    logprob = torch.empty(labels.shape, dtype=dtype, device=labels.device)  # (B, T)
    entropy, row_max, total = (torch.empty_like(logprob) for _ in range(3))
    g = torch.empty_like(logprob) if want_g else None
    scratch = _Scratch(labels.device)
    flags = []
    for rs, cs in _blocks(*labels.shape, block_tokens):
        block = labels[rs, cs]
        flat = block.reshape(-1)  # (n,)
        partials = _RowPartials(torch.zeros(flat.shape, dtype=dtype, device=flat.device))
        for col_start, y in tiles(rs, cs, scratch):
            exp_out = scratch.view("exp", y.shape[0], y.shape[1], dtype)
            partials.add(y, col_start, flat, want_g, exp_out)
        lp, ent, top, tot, gg, finite = partials.finish(want_g)
        logprob[rs, cs] = lp.view(block.shape)
        entropy[rs, cs] = ent.view(block.shape)
        row_max[rs, cs] = top.view(block.shape)
        total[rs, cs] = tot.view(block.shape)
        if g is not None:
            g[rs, cs] = gg.view(block.shape)
        flags.append(finite)
    # One device sync after all blocks: any inf/nan logit shows in a row maximum or minimum,
    # and an overflow in S, the entropy or the log-prob.
    finite = torch.isfinite(total).all() & torch.isfinite(entropy).all()
    finite = finite & torch.isfinite(logprob).all()
    for flag in flags:
        finite = finite & flag
    if not bool(finite):
        raise ValueError("logits must be finite; found inf or nan (or the log-softmax overflowed)")
    return logprob, entropy, row_max, total, g


class _LogitsStats(torch.autograd.Function):
    """logits (B, T, V), labels (B, T) -> logprob, entropy, G (B, T); backward recomputes."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_size, want_g):  # type: ignore[override]
        vocab = logits.shape[-1]
        dtype = _compute_dtype(logits.dtype)

        def tiles(rs: slice, cs: slice, scratch: _Scratch) -> Iterator[tuple[int, torch.Tensor]]:
            z = logits[rs, cs].reshape(-1, vocab)  # (n, V) a view, or a chunk-sized copy
            yield 0, _tempered(z, temperature, scratch.view("y", z.shape[0], vocab, dtype))

        logprob, entropy, row_max, total, g = _forward_blocks(
            tiles, labels, chunk_size, want_g, dtype
        )
        ctx.save_for_backward(logits, labels, row_max, total)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(entropy)
        if want_g:
            ctx.mark_non_differentiable(g)
        return logprob, entropy, g

    @staticmethod
    def backward(ctx, grad_logprob, _grad_entropy, _grad_g):  # type: ignore[override]
        logits, labels, row_max, total = ctx.saved_tensors
        if grad_logprob is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        vocab, temperature = logits.shape[-1], ctx.temperature
        scratch = _Scratch(logits.device)
        for rs, cs in _blocks(*labels.shape, ctx.chunk_size):
            z = logits[rs, cs].reshape(-1, vocab)  # (n, V)
            block_labels = labels[rs, cs].reshape(-1)  # (n,)
            dtype = total.dtype
            coef = grad_logprob[rs, cs].reshape(-1).to(dtype) / temperature  # (n,)
            dz = _tempered(z, temperature, scratch.view("dz", z.shape[0], vocab, dtype))
            # -coef * p = e^(z - M) * (-coef / S)
            dz.sub_(row_max[rs, cs].reshape(-1, 1)).exp_()
            dz.mul_((-coef / total[rs, cs].reshape(-1))[:, None])
            dz.scatter_add_(1, block_labels[:, None], coef[:, None])  # + coef at the label
            grad_logits[rs, cs] = dz.view(grad_logits[rs, cs].shape)  # cast to the input dtype
        return grad_logits, None, None, None, None


def _accumulate_mm(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, first: bool) -> None:
    """``out = a @ b`` when ``first``, else ``out += a @ b``; in place, no product temporary
    when the operands have ``out``'s dtype (else the product is made in theirs, then added)."""
    if a.dtype != out.dtype:
        product = a @ b
        if first:
            out.copy_(product)
        else:
            out.add_(product)
    elif first:
        torch.mm(a, b, out=out)
    else:
        out.addmm_(a, b)


def _tile_columns(tokens: int, elements: int, vocab: int) -> int:
    """Vocabulary columns per tile of ``tokens`` rows: about ``elements`` logits a tile."""
    return max(1, min(vocab, max(_MIN_TILE_COLUMNS, elements // max(1, tokens))))


class _HiddenStats(torch.autograd.Function):
    """hidden (B, T, H), weight (V, H), labels (B, T) -> logprob, entropy, G (B, T), never
    building the (B, T, V) logits.

    Blocks of up to ``chunk_size * V / 1024`` tokens, each cut into tiles of (all its tokens x
    about ``chunk_size * V / tokens`` columns), so a tile holds as many logits as a
    ``(chunk_size, V)`` block. Matmuls run in the input dtype, like the model's ``lm_head``.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_size, want_g):  # type: ignore[override]
        width, vocab = hidden.shape[-1], weight.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        elements = chunk_size * vocab

        def tiles(rs: slice, cs: slice, scratch: _Scratch) -> Iterator[tuple[int, torch.Tensor]]:
            h = hidden[rs, cs].reshape(-1, width)  # (n, H)
            n = h.shape[0]
            cols = _tile_columns(n, elements, vocab)
            for v0 in range(0, vocab, cols):
                w = weight[v0 : v0 + cols]  # (c, H)
                y = scratch.view("y", n, w.shape[0], dtype)
                if hidden.dtype == dtype:
                    torch.mm(h, w.T, out=y)  # (n, c)
                else:  # logits rounded to the input dtype, as the model's lm_head returns them
                    y.copy_(torch.mm(h, w.T, out=scratch.view("z", n, w.shape[0], hidden.dtype)))
                yield v0, _tempered(y, temperature, y)

        block_tokens = max(1, elements // min(vocab, _MIN_TILE_COLUMNS))
        logprob, entropy, row_max, total, g = _forward_blocks(
            tiles, labels, block_tokens, want_g, dtype
        )
        ctx.save_for_backward(hidden, weight, labels, row_max, total)
        ctx.temperature, ctx.elements, ctx.block_tokens = temperature, elements, block_tokens
        ctx.mark_non_differentiable(entropy)
        if want_g:
            ctx.mark_non_differentiable(g)
        return logprob, entropy, g

    @staticmethod
    def backward(ctx, grad_logprob, _grad_entropy, _grad_g):  # type: ignore[override]
        hidden, weight, labels, row_max, total = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_logprob is None or not (need_h or need_w):
            return None, None, None, None, None, None
        width, vocab, temperature = hidden.shape[-1], weight.shape[0], ctx.temperature
        dtype = total.dtype  # of the reductions; matmuls run in the input dtype
        low = hidden.dtype != dtype  # bf16 / fp16 input
        blocks = _blocks(*labels.shape, ctx.block_tokens)
        grad_hidden = (
            torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_h else None
        )
        # The first block writes every row of the weight gradient, later blocks add to it.
        make_weight_grad = torch.empty if blocks else torch.zeros
        grad_weight = (
            make_weight_grad(weight.shape, dtype=dtype, device=weight.device) if need_w else None
        )  # (V, H)
        scratch = _Scratch(hidden.device)
        for index, (rs, cs) in enumerate(blocks):
            h = hidden[rs, cs].reshape(-1, width)  # (n, H)
            n = h.shape[0]
            block_labels = labels[rs, cs].reshape(-1)  # (n,)
            block_max = row_max[rs, cs].reshape(-1, 1)  # (n, 1) M
            coef = grad_logprob[rs, cs].reshape(-1).to(dtype) / temperature  # (n,) d/d z_label
            # d logits = coef * (onehot - p), p = e^(z - M) / S: the tiles form
            # e^(z - M) * (-coef / S); the one-hot part is added after the tiles.
            neg_coef = (-coef / total[rs, cs].reshape(-1))[:, None]  # (n, 1)
            dh = torch.empty(n, width, dtype=dtype, device=h.device) if need_h else None
            cols = _tile_columns(n, ctx.elements, vocab)
            for tile, v0 in enumerate(range(0, vocab, cols)):
                w = weight[v0 : v0 + cols]  # (c, H)
                c = w.shape[0]
                p = scratch.view("p", n, c, dtype)
                if low:
                    p.copy_(torch.mm(h, w.T, out=scratch.view("z", n, c, hidden.dtype)))
                else:
                    torch.mm(h, w.T, out=p)  # (n, c) the logits again
                _tempered(p, temperature, p).sub_(block_max).exp_()  # (n, c) e^(z - M)
                if low:  # rounded to the input dtype, as autograd of the naive path does
                    dz = torch.mul(p, neg_coef, out=scratch.view("dz", n, c, hidden.dtype))
                else:
                    dz = p.mul_(neg_coef)
                if need_h:
                    _accumulate_mm(dh, dz, w, first=tile == 0)  # (n, H) += (n, c) @ (c, H)
                if need_w:  # (c, H) += (c, n) @ (n, H)
                    _accumulate_mm(grad_weight[v0 : v0 + c], dz.T, h, first=index == 0)
            # the one-hot part: + coef at each token's label, exactly (not rounded)
            if need_h:
                dh.add_(weight[block_labels].to(dtype) * coef[:, None])
                grad_hidden[rs, cs] = dh.view(grad_hidden[rs, cs].shape)  # input dtype
            if need_w:
                grad_weight.index_add_(0, block_labels, h.to(dtype) * coef[:, None])
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
