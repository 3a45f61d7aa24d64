"""Exact top-k / bottom-k token selection per scope unit, optionally global across ranks.

Algorithm (linear in N, exact, no sorting of tokens, no torch.quantile):

1. Map each float score to an integer key with the same order (float32 -> 32-bit keys,
   float64 -> 64-bit keys; -0.0 and +0.0 are the same key). For bottom selection the keys are
   bit-inverted, so "largest key" always means "selected first".
2. Radix-select the k-th largest key of every scope unit: one histogram over
   (unit, 8-bit digit) per digit, most significant first, keeping only the candidates that
   still match the threshold prefix. With a process group the histograms are all-reduced, so
   every rank finds the same global thresholds.
3. Select every token above its unit's threshold, and among the tokens equal to the threshold
   the first ones in row-major order of the global batch (the ranks' batches concatenated in
   rank order), until the unit holds exactly k tokens (k = ceil(ratio * N_unit) by default).

In a single process with scope "batch" (one unit, no communication), the k-th best score is
instead an exact order statistic: a fixed-seed sample brackets it, one pass counts the scores
beyond the bracket and gathers the few inside it, and ``torch.kthvalue`` finishes on that band
(see ``_kth_best``). The mask is then one comparison with it (plus, only when ties straddle
the cut, the first ties in row-major order): the same mask as the radix path, in a few passes
over (B, T) (see ``_select_single_batch``).

Tie rule (documented, deterministic): among equal scores, the token that comes first in
row-major order of the global batch is selected first (``ties="first"``), or the one that comes
last (``ties="last"``: the authors' GMTS code, whose stable ascending sort removes the first
ties).

Two further count rules keep every token at or beyond a threshold instead of an exact count
(scope 'batch' only): ``quantile`` (TRL's ``top_entropy_quantile``: ``torch.quantile`` of the
valid scores at ``1 - ratio``, linear interpolation in float32, reproduced exactly at any N and
over ranks from two exact order statistics) and ``index`` (the authors' ETS code: the
``floor((1 - ratio) N)``-th smallest valid score).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import torch

from gmts.core import distributed as dist_utils
from gmts.core._config_utils import check_choice

__all__ = [
    "COUNT_RULES",
    "SCOPES",
    "TIE_RULES",
    "score_quantile",
    "select_top_count",
    "select_tokens",
    "selection_threshold",
    "selection_count",
]

SCOPES = ("batch", "group", "sequence")
COUNT_RULES = ("ceil", "floor", "quantile", "index")
"""How many tokens a unit of N valid tokens keeps: ``ceil`` = exactly ceil(ratio * N), at
least 1 (the paper, ETS code); ``floor`` = exactly floor(ratio * N) = N - ceil((1 - ratio) N),
possibly 0 (the authors' GMTS code, which removes the ceil((1 - ratio) N) lowest-scored tokens);
``quantile`` = every token with score >= torch.quantile(valid scores, 1 - ratio) (TRL; all
ties kept, N - ceil((1 - ratio)(N - 1)) tokens when scores are distinct); ``index`` = every token
with score >= the floor((1 - ratio) N)-th smallest valid score (the authors' ETS code; all ties
kept, N - floor((1 - ratio) N) + 1 tokens when distinct). The last two: scope 'batch' only."""
THRESHOLD_RULES = ("quantile", "index")
TIE_RULES = ("first", "last")
"""Which of equal scores at the cut an exact count takes first: the earliest in row-major order
of the global batch (``first``) or the latest (``last``, the authors' GMTS code)."""
_DIGIT_BITS = 8
_RADIX = 1 << _DIGIT_BITS


def _ratio_fraction(ratio: float) -> Fraction:
    """The ratio as the exact decimal the user wrote (its shortest repr), so 0.1 * 10 -> 1."""
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real):  # numpy scalars too
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
    value = float(ratio)
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
    try:  # str() is the shortest decimal in the number's own precision (np.float32(0.2) -> 0.2)
        return Fraction(str(ratio))
    except ValueError:
        return Fraction(repr(value))


def selection_count(n: int, ratio: float, count: str = "ceil") -> int:
    """k for ``n`` valid tokens, computed exactly on the decimal value of ``ratio``.

    ``count='ceil'``: ceil(ratio * n), at least 1 if n > 0; ``'floor'``: floor(ratio * n)
    (see :data:`COUNT_RULES`; the threshold rules have no fixed k and raise). Examples: ``selection_count(10, 0.2) == 2``,
    ``selection_count(10, 0.1) == 1``, ``selection_count(7, 0.2) == 2``,
    ``selection_count(7, 0.2, "floor") == 1``, ``selection_count(0, 0.5) == 0``.
    """
    check_choice("count", count, COUNT_RULES)
    return _count_of(n, _ratio_fraction(ratio), count)


def _count_of(n: int, frac: Fraction, count: str) -> int:
    """k of one unit (see :func:`selection_count`); 0 if n <= 0."""
    if n <= 0:
        return 0
    if count not in ("ceil", "floor"):
        raise ValueError(f"count={count!r} keeps a threshold's ties: it has no fixed k")
    if count == "floor":
        return frac.numerator * n // frac.denominator
    return max(1, -(-frac.numerator * n // frac.denominator))


def _counts_to_k(counts: torch.Tensor, frac: Fraction, count: str) -> torch.Tensor:
    """Per-unit k of :func:`selection_count` for ``(U,)`` counts, exact integer arithmetic."""
    p, q = frac.numerator, frac.denominator
    n_max = int(counts.max()) if counts.numel() else 0
    round_up = q - 1 if count == "ceil" else 0
    if p * max(n_max, 1) < (1 << 62):
        k = torch.div(counts * p + round_up, q, rounding_mode="floor")
    else:  # huge decimal expansions: exact Python integers
        k = torch.tensor([(p * n + round_up) // q for n in counts.tolist()], dtype=torch.int64)
        k = k.to(counts.device)
    if count == "ceil":
        k = k.clamp_min(1)
    return torch.where(counts > 0, k, torch.zeros_like(k))


_KEY_TYPES = {
    # float dtype of the working copy -> (int view dtype, bits, mask of the non-sign bits)
    torch.float32: (torch.int32, 32, 0x7FFFFFFF),
    torch.float64: (torch.int64, 64, 0x7FFFFFFFFFFFFFFF),
}


def _working_scores(scores: torch.Tensor, wide: bool) -> torch.Tensor:
    """float32 (float64 if ``wide``) copy with -0.0 turned into +0.0 (they are equal)."""
    return scores.to(torch.float64 if wide else torch.float32) + 0.0


def _order_keys(values: torch.Tensor, largest: bool) -> torch.Tensor:
    """Integer keys (int32 for float32, int64 for float64) whose signed order is the float
    order of ``values`` (reversed for ``largest=False``), so 'larger key' = 'selected first'."""
    int_dtype, nbits, low = _KEY_TYPES[values.dtype]
    bits = values.contiguous().view(int_dtype)
    keys = bits ^ ((bits >> (nbits - 1)) & low)  # flip the magnitude bits of negative floats
    return keys if largest else ~keys  # ~ reverses the order without overflow


def _keys_to_values(keys: torch.Tensor, dtype: torch.dtype, largest: bool) -> torch.Tensor:
    """Inverse of :func:`_order_keys` (the bit flip is an involution)."""
    int_dtype, nbits, low = _KEY_TYPES[dtype]
    keys = keys.to(int_dtype)
    keys = keys if largest else ~keys
    return (keys ^ ((keys >> (nbits - 1)) & low)).view(dtype)


_NOT_FINITE = "scores must be finite at every valid (mask=True) position; found nan or inf"


@torch.no_grad()
def _local_error(
    scores: Any, mask: Any, scope: str, group_ids: Any, check_finite: bool = True
) -> str | None:
    """Validate the per-rank inputs; return an error message instead of raising (see caller).

    ``check_finite=False`` leaves the finiteness of the valid scores to the caller (the
    single-process batch path checks it in a pass it makes anyway)."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        return "scores must be a torch.Tensor of shape (B, T)"
    if not scores.dtype.is_floating_point:
        return f"scores must be a floating-point tensor, got dtype {scores.dtype}"
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(scores.shape):
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        return (
            f"mask must be a torch.Tensor of the shape of scores {tuple(scores.shape)}, got {got}"
        )
    if mask.dtype != torch.bool:
        return f"mask must be a bool tensor, got dtype {mask.dtype}"
    if mask.device != scores.device:
        return f"mask must be on the device of scores ({scores.device}), got {mask.device}"
    if scope == "group":
        if group_ids is None:
            return "group_ids (B,) are required for scope='group'"
        if not isinstance(group_ids, torch.Tensor) or tuple(group_ids.shape) != (scores.shape[0],):
            got = tuple(group_ids.shape) if isinstance(group_ids, torch.Tensor) else group_ids
            return f"group_ids must be a tensor of shape (B,) = ({scores.shape[0]},), got {got}"
        if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
            return f"group_ids must be an integer tensor, got dtype {group_ids.dtype}"
        if group_ids.numel() and int(group_ids.min()) < 0:
            return "group_ids must be >= 0"
    if (
        check_finite
        and scores.numel()
        and not bool(torch.isfinite(torch.stack(torch.aminmax(torch.where(mask, scores, 0)))).all())
    ):  # min/max propagate nan and expose +-inf: two reductions instead of an isfinite pass
        return _NOT_FINITE
    return None


def _sync_errors(
    error: str | None, rows: int, wide: bool, device: torch.device, process_group: Any
) -> tuple[int, bool]:
    """Raise on every rank if any rank has bad input (so no rank hangs).

    Returns the largest number of rows on any rank and whether any rank has float64 scores
    (then every rank uses 64-bit keys, so all ranks run the same number of radix passes).
    """
    flags = torch.tensor([1 if error else 0, rows, int(wide)], dtype=torch.int64, device=device)
    flags = dist_utils.all_reduce_max(flags, process_group)
    if error is not None:
        raise ValueError(error)
    if int(flags[0]):
        raise ValueError("select_tokens: another rank in the process group received invalid input")
    return int(flags[1]), bool(flags[2])


def _units(
    scope: str,
    rows: int,
    max_rows: int,
    group_ids: torch.Tensor | None,
    device: torch.device,
    process_group: Any,
) -> tuple[torch.Tensor, int]:
    """Scope unit id of each row ``(B,)`` int64 and the global number of units."""
    if scope == "batch":
        return torch.zeros(rows, dtype=torch.int64, device=device), 1
    if scope == "sequence":
        return torch.arange(rows, dtype=torch.int64, device=device), rows
    ids = group_ids.to(device=device, dtype=torch.int64)
    if dist_utils.is_distributed(process_group):
        padded = torch.full((max_rows,), -1, dtype=torch.int64, device=device)
        padded[:rows] = ids
        every = dist_utils.all_gather_stack(padded, process_group).reshape(-1)
        every = every[every >= 0]
    else:
        every = ids
    uniq = torch.unique(every)  # sorted global group ids
    return torch.searchsorted(uniq, ids), int(uniq.numel())


def _checked_selection(
    scores: torch.Tensor,
    mask: torch.Tensor,
    largest: bool,
    scope: str,
    group_ids: torch.Tensor | None,
    process_group: Any,
    count: str,
    ties: str,
) -> tuple[bool, int, bool, Any]:
    """:func:`select_tokens`'s arguments checked, on every rank of ``process_group`` alike
    (ValueError on all of them if one rank's are bad). Returns (whether one local batch is
    selected without communication, the most rows on any rank, whether any rank's scores are
    float64, the process group to select over: None where no communication is needed)."""
    check_choice("scope", scope, SCOPES)
    check_choice("count", count, COUNT_RULES)
    check_choice("ties", ties, TIE_RULES)
    if not isinstance(largest, bool):
        raise ValueError(f"largest must be a bool, got {largest!r}")
    if count in THRESHOLD_RULES and scope != "batch":
        raise ValueError(f"count={count!r} selects over the whole batch: use scope='batch'")
    distributed = dist_utils.is_distributed(process_group)
    single_batch = scope == "batch" and not distributed and count not in THRESHOLD_RULES
    error = _local_error(scores, mask, scope, group_ids, check_finite=not single_batch)
    device = scores.device if isinstance(scores, torch.Tensor) else torch.device("cpu")
    rows = scores.shape[0] if error is None else 0
    wide = error is None and scores.dtype == torch.float64
    if distributed:
        max_rows, wide = _sync_errors(error, rows, wide, device, process_group)
    elif error is not None:
        raise ValueError(error)
    else:
        max_rows = rows
    if scope == "sequence":
        distributed, process_group = False, None  # rows never span ranks
    return single_batch, max_rows, wide, process_group if distributed else None


def select_tokens(
    scores: torch.Tensor,
    mask: torch.Tensor,
    ratio: float,
    *,
    largest: bool = True,
    scope: str = "batch",
    group_ids: torch.Tensor | None = None,
    process_group: Any = None,
    count: str = "ceil",
    ties: str = "first",
) -> torch.Tensor:
    """Select exactly k valid tokens per scope unit u by score (k = ceil(ratio * N_u) by default).

    Args:
        scores: ``(B, T)`` float scores (only positions with ``mask`` are read; they must be
            finite). Compared in float32, or in float64 when they are float64 (on any rank).
        mask: ``(B, T)`` bool response mask; masked positions are never selected.
        ratio: fraction in (0, 1]; k is computed exactly on its decimal value
            (see :func:`selection_count`).
        largest: True keeps the highest scores (top-rho), False the lowest ("bottom").
        scope: ``"batch"`` (one unit: all tokens of the batch, the paper's eq. 2), ``"group"``
            (one unit per value of ``group_ids``, the authors' standalone code) or
            ``"sequence"`` (one unit per row).
        group_ids: ``(B,)`` non-negative integer question-group id per row, for scope 'group'.
            Under a process group they must be global ids: rows with the same id on different
            ranks belong to the same group.
        process_group: a ``torch.distributed`` group: the selection is then global, equal to
            the single-process selection of the ranks' batches concatenated in rank order.
            Every rank must call this function (ranks with no valid tokens included). The
            'sequence' scope needs no communication (rows never span ranks).
        count: ``"ceil"`` (k = ceil(ratio * N_u), at least 1), ``"floor"`` (k =
            floor(ratio * N_u), possibly 0: the authors' GMTS code), or the threshold rules
            ``"quantile"`` (TRL) and ``"index"`` (the authors' ETS code), which keep every tie
            (scope 'batch' only); see :data:`COUNT_RULES`.
        ties: ``"first"`` or ``"last"``: which of the tokens tied at the cut an exact count
            takes first, in row-major order of the global batch (:data:`TIE_RULES`).

    Returns:
        ``(B, T)`` bool mask. In each unit: exactly k selected tokens; every selected score >=
        every unselected valid score (<= for ``largest=False``); ties at the threshold go to
        the token earliest (``ties="last"``: latest) in global row-major order. A unit (or
        batch) with N = 0 valid tokens gets k = 0 (an all-False mask). The threshold rules
        keep every valid token at or beyond their threshold.

    Raises:
        ValueError: bad shapes or dtypes, ratio outside (0, 1], unknown scope, non-finite
            valid scores, missing/invalid group_ids (raised on every rank of a group).
    """
    frac = _ratio_fraction(ratio)
    single_batch, max_rows, wide, group = _checked_selection(
        scores, mask, largest, scope, group_ids, process_group, count, ties
    )
    with torch.no_grad():
        if count in THRESHOLD_RULES:
            return _select_beyond_threshold(scores.detach(), mask, ratio, count, largest, group)
        reverse = ties == "last"
        if reverse:  # the latest tie first: select on the reversed global order, then undo
            scores, mask = scores.flip(0, 1), mask.flip(0, 1)
            group_ids = None if group_ids is None else group_ids.flip(0)
        if single_batch:
            selected = _select_single_batch(scores.detach(), mask, frac, count, largest)
            if selected is None:
                values = _working_scores(scores.detach(), wide)
                selected = _select(
                    values, mask, frac, count, largest, scope, group_ids, max_rows, None
                )
        else:
            values = _working_scores(scores.detach(), wide)
            selected = _select(
                values, mask, frac, count, largest, scope, group_ids, max_rows, group, reverse
            )
        return selected.flip(0, 1) if reverse else selected


def _select(
    values: torch.Tensor,
    mask: torch.Tensor,
    frac: Fraction,
    count: str,
    largest: bool,
    scope: str,
    group_ids: torch.Tensor | None,
    max_rows: int,
    group: Any,
    reverse_ranks: bool = False,
    fixed_k: int | None = None,
) -> torch.Tensor:
    """Selection on ``values`` (B, T), float32 or float64 without -0.0 (see select_tokens).

    ``reverse_ranks``: the global order runs from the last rank to the first (``ties='last'``,
    each rank's rows already reversed by the caller). ``fixed_k``: every unit keeps
    ``min(fixed_k, N_u)`` tokens instead of the count rule's k."""
    device = values.device
    rows, cols = values.shape
    unit_row, n_units = _units(scope, rows, max_rows, group_ids, device, group)  # (B,)
    if n_units == 0:
        return torch.zeros_like(mask)
    batch_scope = scope == "batch"

    counts = torch.zeros(n_units, dtype=torch.int64, device=device)
    counts.scatter_add_(0, unit_row, torch.count_nonzero(mask, dim=1))
    counts = dist_utils.all_reduce_sum(counts, group)  # (U,) global valid tokens per unit
    if fixed_k is None:
        k = _counts_to_k(counts, frac, count)  # (U,)
    else:
        k = counts.clamp(max=fixed_k)  # (U,)

    threshold, k_rem = _radix_threshold(
        values, mask, k, largest, unit_row, n_units, batch_scope, group
    )
    # k_rem[u]: how many tokens equal to the threshold unit u still takes (row-major order).

    thr = threshold.reshape(1, 1) if batch_scope else threshold[unit_row][:, None]  # (B, 1)
    beyond = values > thr if largest else values < thr
    selected = beyond & mask  # (B, T)
    tie = (values == thr) & mask  # (B, T)
    row_ties = torch.count_nonzero(tie, dim=1)  # (B,) (count_nonzero: no int64 copy)
    unit_ties = torch.zeros(n_units, dtype=torch.int64, device=device)
    unit_ties.scatter_add_(0, unit_row, row_ties)
    if group is not None:
        gathered = dist_utils.all_gather_stack(unit_ties, group)  # (W, U)
        rank = dist_utils.get_rank(group)
        # ties on the ranks that come earlier in the global order
        earlier = gathered[rank + 1 :] if reverse_ranks else gathered[:rank]
        rank_offset = earlier.sum(0)
    else:
        rank_offset = torch.zeros_like(unit_ties)
    # ties before each row inside its unit: rows grouped by unit (stable), exclusive prefix sums
    order = torch.sort(unit_row, stable=True).indices
    ties_sorted = row_ties[order]
    before_sorted = ties_sorted.cumsum(0) - ties_sorted
    unit_start = unit_ties.cumsum(0) - unit_ties
    row_before = torch.empty_like(row_ties)
    row_before[order] = before_sorted - unit_start[unit_row[order]]
    row_before = row_before + rank_offset[unit_row]  # (B,) ties earlier in the global order
    take = (k_rem[unit_row] - row_before).clamp(min=0)  # (B,) ties this row may still take
    take = torch.minimum(take, row_ties)
    whole = take == row_ties  # rows that take all their ties (incl. rows with none)
    selected |= tie & whole[:, None]
    partial = (~whole).nonzero().squeeze(1)  # at most one row per unit (all rows if 'sequence')
    if partial.numel():
        sub = tie[partial]  # (P, T)
        rank_in_row = sub.cumsum(1)  # 1-based rank of each tie in its row
        selected[partial] |= sub & (rank_in_row <= take[partial][:, None])
    return selected


def _select_single_batch(
    scores: torch.Tensor, mask: torch.Tensor, frac: Fraction, count: str, largest: bool
) -> torch.Tensor | None:
    """Single process, scope 'batch': the selection mask from one exact order statistic.

    Masked positions are filled with the worst finite value of the dtype (the lowest for top
    selection, the highest for bottom), so the k-th best of the padded tensor is the k-th best
    valid score and no copy by mask is made. The same pass validates the scores: with a finite
    fill, a nan or infinite valid score shows in the padded tensor's min/max. Returns None when
    the k-th best valid score equals the fill value itself (then padding would tie with it); the
    caller then takes the radix path. Same mask as the radix path, tie rule included.
    """
    values = scores if scores.dtype in _KEY_TYPES else scores.float()
    n_valid = int(torch.count_nonzero(mask))
    k = _count_of(n_valid, frac, count)
    if k == 0:
        return torch.zeros_like(mask)
    info = torch.finfo(values.dtype)
    fill = info.min if largest else info.max
    padded = torch.where(mask, values, fill)  # (B, T), contiguous
    if not bool(torch.isfinite(torch.stack(torch.aminmax(padded))).all()):
        raise ValueError(_NOT_FINITE)
    flat = padded.view(-1)  # (B*T,)
    kth, n_beyond, n_ties = _kth_best(flat, k, largest)
    if float(kth) == fill:
        return None
    if n_ties is not None and n_ties == k - n_beyond:  # every tie is taken: one pass
        return padded >= kth if largest else padded <= kth
    selected = padded > kth if largest else padded < kth  # (B, T)
    if n_beyond is None:
        n_beyond = int(torch.count_nonzero(selected))
    ties = (flat == kth).nonzero().squeeze(1)  # (n_ties,) flat indices in row-major order
    selected.view(-1)[ties[: k - n_beyond]] = True
    return selected


def _select_beyond_threshold(
    scores: torch.Tensor,
    mask: torch.Tensor,
    ratio: float,
    count: str,
    largest: bool,
    group: Any,
) -> torch.Tensor:
    """Every valid token at or beyond the threshold of a threshold rule (scope 'batch').

    ``quantile`` (TRL): ``t = torch.quantile(valid, q)`` with ``q = 1 - ratio`` (``ratio`` for
    ``largest=False``), as torch computes it in float32: ``rank = float32(q) * (N - 1)``, ``t =
    lerp(v[floor(rank)], v[ceil(rank)], rank - floor(rank))`` over the ascending valid scores
    ``v``; the two order statistics come from the exact radix select, so any N works (torch's
    own quantile raises above 2^24) and every rank of ``group`` gets the global threshold.
    ``index`` (the authors' ETS code): ``t = v[m - 1]`` with ``m = floor((1 - ratio) N)``
    (every valid token when ``m = 0``); for ``largest=False`` the mirror image, ``t = v[N - m]``
    and keep ``<= t``. The threshold is float32 under ``quantile``; the scores are compared in
    float32, or in float64 when they are float64 (TRL's ``entropies * mask.float() >= t``
    widens the threshold to float64 then); under ``index`` in float32, or float64 for float64
    scores.
    """
    values = _working_scores(scores, wide=count == "index" and scores.dtype == torch.float64)
    n_local = torch.count_nonzero(mask).reshape(1)
    n = int(dist_utils.all_reduce_sum(n_local, group))
    if n == 0:
        return torch.zeros_like(mask)

    def kth_smallest(position: int) -> torch.Tensor:
        """The valid score at 0-based ascending ``position`` (global), via the radix select."""
        rows = values.shape[0]
        unit_row = torch.zeros(rows, dtype=torch.int64, device=values.device)
        k = torch.tensor([n - position], dtype=torch.int64, device=values.device)
        threshold, _ = _radix_threshold(values, mask, k, True, unit_row, 1, True, group)
        return threshold[0]

    if count == "quantile":
        q = (1 - ratio) if largest else float(ratio)
        threshold = _float32_quantile(kth_smallest, q, n)
        if scores.dtype == torch.float64:
            # TRL compares `entropies * mask.float()` with the float32 threshold: float64
            # entropies stay float64 and the threshold is widened, so a score just below it
            # is not kept even where its float32 rounding equals it
            values, threshold = _working_scores(scores, wide=True), threshold.double()
    else:
        removed = 1 - _ratio_fraction(ratio)  # the mirror image for largest=False
        m = removed.numerator * n // removed.denominator
        if m == 0:  # nothing removed (the authors' code would index sorted[-1] here)
            return mask.clone()
        threshold = kth_smallest(m - 1) if largest else kth_smallest(n - m)
    kept = values >= threshold if largest else values <= threshold
    return kept & mask


def _float32_quantile(kth_smallest: Any, q: float, n: int) -> torch.Tensor:
    """``torch.quantile(v, q)`` of ``n >= 1`` ascending values read by ``kth_smallest(i)``, as
    torch computes it: ``rank = float32(q) * (n - 1)``, linear interpolation in float32."""
    rank = torch.tensor(q, dtype=torch.float32) * (n - 1)
    lo, hi = int(rank.floor()), int(rank.ceil())
    low_value = kth_smallest(lo).float()
    high_value = low_value if hi == lo else kth_smallest(hi).float()
    return torch.lerp(low_value, high_value, rank - lo)


def score_quantile(
    scores: torch.Tensor, mask: torch.Tensor, q: float, *, process_group: Any = None
) -> float:
    """``torch.quantile`` of the valid scores at ``q`` (linear interpolation, in float32, as
    ``count='quantile'`` computes its threshold), global over ``process_group``; nan when no
    token is valid. Exact at any N (two order statistics of the radix select; torch's own
    quantile raises above 2^24 elements).

    Args:
        scores: ``(B, T)`` float, finite at valid positions. mask: ``(B, T)`` bool.
        q: in [0, 1].
    """
    if not (isinstance(q, (int, float)) and not isinstance(q, bool) and 0.0 <= q <= 1.0):
        raise ValueError(f"q must be a number in [0, 1], got {q!r}")
    _, _, _, group = _checked_selection(
        scores, mask, True, "batch", None, process_group, "quantile", "first"
    )
    with torch.no_grad():
        values = _working_scores(scores.detach(), wide=False)
        n = int(dist_utils.all_reduce_sum(torch.count_nonzero(mask).reshape(1), group))
        if n == 0:
            return float("nan")
        unit_row = torch.zeros(values.shape[0], dtype=torch.int64, device=values.device)

        def kth_smallest(position: int) -> torch.Tensor:
            k = torch.tensor([n - position], dtype=torch.int64, device=values.device)
            threshold, _ = _radix_threshold(values, mask, k, True, unit_row, 1, True, group)
            return threshold[0]

        return float(_float32_quantile(kth_smallest, float(q), n))


def select_top_count(
    scores: torch.Tensor,
    mask: torch.Tensor,
    k: int,
    *,
    largest: bool = True,
    process_group: Any = None,
) -> torch.Tensor:
    """Exactly ``min(k, N)`` valid tokens of the whole (global) batch by score: a given count
    instead of a ratio (e.g. an engine's own ``max(1, int(N * ratio))``), ties to the earliest
    in global row-major order, as :func:`select_tokens` with ``ties='first'``.

    Args:
        scores: ``(B, T)`` float, finite at valid positions. mask: ``(B, T)`` bool.
        k: tokens to keep (>= 0). process_group: the selection is global over its ranks.

    Returns:
        ``(B, T)`` bool.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    # (checked as a threshold rule: the radix path below reads every valid score, so they
    # must be finite, which the single-batch path would check by itself)
    _, max_rows, wide, group = _checked_selection(
        scores, mask, largest, "batch", None, process_group, "quantile", "first"
    )
    with torch.no_grad():
        values = _working_scores(scores.detach(), wide)
        return _select(
            values, mask, Fraction(1), "ceil", largest, "batch", None, max_rows, group, fixed_k=k
        )


_BRACKET_MIN_N = 1 << 20  # below this one torch.kthvalue is already cheap
_BRACKET_SAMPLE = 1 << 16


def _kth_best(
    x: torch.Tensor, k: int, largest: bool
) -> tuple[torch.Tensor, int | None, int | None]:
    """The k-th largest (``largest``) or k-th smallest element of the 1-D tensor ``x``; exact.

    Returns the value (0-d tensor) and, when the bracket below was used, how many elements are
    strictly better than it and how many equal it (else None, None).

    For large ``x`` a fixed-seed sample brackets the answer between two sample values; one pass
    counts the elements beyond the bracket and gathers the few inside it, and the k-th best is
    read off that small band (Floyd-Rivest style). If the bracket misses (unlikely, and detected
    exactly by the counts) it falls back to ``torch.kthvalue`` over all of ``x``. Either way the
    result is the exact order statistic; only the time depends on the sample.
    """
    n = x.numel()
    if n >= _BRACKET_MIN_N:
        gen = torch.Generator(device=x.device).manual_seed(0)
        idx = torch.randint(n, (_BRACKET_SAMPLE,), generator=gen, device=x.device)
        sample = x[idx].sort(descending=largest).values  # (m,) best first
        m = _BRACKET_SAMPLE
        centre = k * m / n  # expected position of the answer in the sample
        margin = 4.0 * math.sqrt(max(centre * (1.0 - k / n), 1.0)) + 16.0
        inner = sample[max(int(centre - margin), 0)]  # likely as good as the answer or better
        outer = sample[min(int(centre + margin), m - 1)]  # likely as bad as the answer or worse
        beyond = x > inner if largest else x < inner
        band = x >= outer if largest else x <= outer  # a superset of beyond
        band ^= beyond
        n_beyond = int(torch.count_nonzero(beyond))
        n_band = int(torch.count_nonzero(band))
        del beyond
        if n_beyond < k <= n_beyond + n_band and n_band < n // 4:
            band_values = x[band]  # (n_band,)
            j = k - n_beyond  # the answer is the j-th best of the band
            kth = torch.kthvalue(band_values, n_band - j + 1 if largest else j).values
            better = band_values > kth if largest else band_values < kth
            n_better = n_beyond + int(torch.count_nonzero(better))
            return kth, n_better, int(torch.count_nonzero(band_values == kth))
    return torch.kthvalue(x, n - k + 1 if largest else k).values, None, None


def _radix_threshold(
    values: torch.Tensor,
    mask: torch.Tensor,
    k: torch.Tensor,
    largest: bool,
    unit_row: torch.Tensor,
    n_units: int,
    batch_scope: bool,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-unit k-th best value by radix select over order-preserving integer keys.

    Histograms are all-reduced over ``group``, so every rank finds the same global thresholds.
    Returns the thresholds ``(U,)`` and how many tokens equal to each are still to take ``(U,)``.
    """
    cols = values.shape[1]
    keys = _order_keys(values, largest)  # (B, T)
    nbits = _KEY_TYPES[values.dtype][1]
    shifts = list(range(nbits - _DIGIT_BITS, -1, -_DIGIT_BITS))

    # Pass 1 over every position; masked positions go to an extra bin that is never counted.
    top = torch.where(mask, (keys >> shifts[0]) + _RADIX // 2, _RADIX)  # (B, T)
    flat = top if batch_scope else unit_row[:, None] * (_RADIX + 1) + top.long()
    hist = torch.bincount(flat.reshape(-1), minlength=n_units * (_RADIX + 1))
    hist = hist.view(n_units, _RADIX + 1)[:, :_RADIX]
    k_rem = k.clone()
    v, k_rem = _pick_digit(dist_utils.all_reduce_sum(hist, group), k_rem)
    tau = (v - _RADIX // 2) << shifts[0]  # (U,) int64 threshold key, built digit by digit
    cand = (top == v[unit_row][:, None]).reshape(-1).nonzero().squeeze(1)  # masked: 256 != v
    cand_keys = keys.reshape(-1)[cand]  # (n,)
    cand_units = None if batch_scope else unit_row[cand // cols]
    del top, flat, cand

    for shift in shifts[1:]:
        digit = ((cand_keys >> shift) & (_RADIX - 1)).long()  # (n,)
        flat = digit if cand_units is None else cand_units * _RADIX + digit
        hist = torch.bincount(flat, minlength=n_units * _RADIX).view(n_units, _RADIX)
        v, k_rem = _pick_digit(dist_utils.all_reduce_sum(hist, group), k_rem)
        tau = tau + (v << shift)
        keep = digit == (v[0] if cand_units is None else v[cand_units])
        cand_keys = cand_keys[keep]
        if cand_units is not None:
            cand_units = cand_units[keep]
    return _keys_to_values(tau, values.dtype, largest), k_rem  # (U,), (U,)


def _pick_digit(hist: torch.Tensor, k_rem: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Digit of the k_rem-th largest key per unit and the new k_rem (within that digit).

    hist: ``(U, R)`` counts of candidate digits; k_rem: ``(U,)`` (0 for empty units).
    """
    at_least = hist.flip(1).cumsum(1).flip(1)  # (U, R): candidates with digit >= d
    v = (at_least >= k_rem[:, None]).sum(1) - 1  # (U,) largest d with at_least[d] >= k_rem
    last = hist.shape[1] - 1
    above = at_least.gather(1, (v + 1).clamp(max=last)[:, None]).squeeze(1)
    above = torch.where(v < last, above, torch.zeros_like(above))  # candidates with digit > v
    return v, k_rem - above


def selection_threshold(
    scores: torch.Tensor,
    selected: torch.Tensor,
    *,
    largest: bool = True,
    process_group: Any = None,
) -> float:
    """The score threshold of a selection: the smallest selected score (largest selected score
    for ``largest=False``), over all ranks of ``process_group``; nan if nothing is selected.

    Args:
        scores: ``(B, T)``. selected: ``(B, T)`` bool (e.g. from :func:`select_tokens`).
    """
    if not isinstance(scores, torch.Tensor) or not isinstance(selected, torch.Tensor):
        raise ValueError("scores and selected must be torch.Tensors of shape (B, T)")
    if tuple(scores.shape) != tuple(selected.shape):
        raise ValueError(
            f"selected must have the shape of scores {tuple(scores.shape)}, "
            f"got {tuple(selected.shape)}"
        )
    with torch.no_grad():
        s = scores.detach().double()
        sel = selected.bool()
        if largest:
            local = torch.where(sel, s, math.inf).min() if s.numel() else s.new_tensor(math.inf)
            value = float(dist_utils.all_reduce_min(local.reshape(1), process_group))
        else:
            local = torch.where(sel, s, -math.inf).max() if s.numel() else s.new_tensor(-math.inf)
            value = float(dist_utils.all_reduce_max(local.reshape(1), process_group))
    return value if math.isfinite(value) else float("nan")
