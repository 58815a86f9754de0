"""Back-port 6: gather the spec-v2 relay in one kernel launch, with a debug invariant.

Upstream: sgl-project/sglang#26129 (fuse the four gathers of ``_resolve_spec_extras``, done
with ``torch.compile``), #27233 (which replaced that with a hand-written Triton kernel,
because torch.compile did not fuse them and its graph cost up to 100 us of host time on a
slow CPU; "1-2% E2E TPOT"), #26108 (debug-assert that every gather sees a stashed value).
Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+.
Depends on back-port 2.

Why: every spec-v2 decode step starts, on the forward stream, by reading back what the
previous forward stashed: top-k probabilities, top-k indices, bonus tokens and (EAGLE/EAGLE3)
hidden states, one advanced-index gather each, all with the same row index. That is three or
four small kernel launches in the prologue of every iteration; one launch does the same work.

How: ``gather_spec_extras`` copies, for each index, the row of every relay buffer in one
Triton launch: one program per gathered row, which copies that row of all four buffers (the
hidden-state row, thousands of elements wide, in blocks). Shapes and dtypes are those of the
buffers, which ``_init_stash_bufs`` sizes from the first stash, as before. On a device other
than CUDA/ROCm the same function indexes each buffer with PyTorch, with identical results;
an empty index vector gives empty outputs and launches nothing. ``FutureMap.resolve_future``
(speculative branch) uses it. ``SGLANG_FUTUREMAP_DEBUG_RELAY=1`` turns on a check that
every gathered slot was stashed since it was last read (#26108; off by default).

Debug invariant (#26108): with ``SGLANG_FUTUREMAP_DEBUG_RELAY=1`` (read once, when
``overlap_utils`` is imported; off by default, then it costs nothing) the bonus-token buffer
starts filled with -1, every gather asserts on the device (``torch._assert_async``, no host
sync) that the bonus tokens it read are >= 0, then writes -1 back into the slots it read. A
slot read twice without a stash in between, or read before any stash, then trips the assert
(on CUDA a device-side assert; on CPU a ``RuntimeError``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.utils import get_bool_env_var

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: The debug switch, as ``overlap_utils`` defines it (the patch series pastes this line).
DEBUG_RELAY_LINE = '_FUTUREMAP_DEBUG_RELAY = get_bool_env_var("SGLANG_FUTUREMAP_DEBUG_RELAY")'
_FUTUREMAP_DEBUG_RELAY = get_bool_env_var("SGLANG_FUTUREMAP_DEBUG_RELAY")


# --------------------------------------------------------------------------- the kernel


def _gather_spec_extras_kernel(
    indices_ptr,
    topk_p_src,
    topk_p_dst,
    topk_p_width,
    topk_index_src,
    topk_index_dst,
    topk_index_width,
    bonus_src,
    bonus_dst,
    bonus_width,
    hidden_src,
    hidden_dst,
    hidden_width,
    BLOCK_SMALL: tl.constexpr,
    BLOCK_HIDDEN: tl.constexpr,
    HAS_HIDDEN: tl.constexpr,
):
    # A plain function: FutureMap._init_stash_bufs jits it with triton.jit (so the patched
    # source and the plugin are the same text). One program copies one gathered row of
    # every buffer; rows are contiguous, `*_width` elements each.
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(indices_ptr + row).to(tl.int64)
    small = tl.arange(0, BLOCK_SMALL)
    for start in range(0, topk_p_width, BLOCK_SMALL):
        cols = start + small
        mask = cols < topk_p_width
        values = tl.load(topk_p_src + slot * topk_p_width + cols, mask=mask)
        tl.store(topk_p_dst + row * topk_p_width + cols, values, mask=mask)
    for start in range(0, topk_index_width, BLOCK_SMALL):
        cols = start + small
        mask = cols < topk_index_width
        values = tl.load(topk_index_src + slot * topk_index_width + cols, mask=mask)
        tl.store(topk_index_dst + row * topk_index_width + cols, values, mask=mask)
    for start in range(0, bonus_width, BLOCK_SMALL):
        cols = start + small
        mask = cols < bonus_width
        values = tl.load(bonus_src + slot * bonus_width + cols, mask=mask)
        tl.store(bonus_dst + row * bonus_width + cols, values, mask=mask)
    if HAS_HIDDEN:
        wide = tl.arange(0, BLOCK_HIDDEN)
        for start in range(0, hidden_width, BLOCK_HIDDEN):
            cols = start + wide
            mask = cols < hidden_width
            values = tl.load(hidden_src + slot * hidden_width + cols, mask=mask)
            tl.store(hidden_dst + row * hidden_width + cols, values, mask=mask)


def gather_spec_extras(
    indices, topk_p_buf, topk_index_buf, bonus_tokens_buf, hidden_states_buf=None, kernel=None
):
    """Rows ``indices`` of the relay buffers: (topk_p, topk_index, bonus_tokens, hidden_states).

    ``kernel`` is ``_gather_spec_extras_kernel`` jitted (``FutureMap.gather_kernel``): one
    launch for all buffers. Without it (non-CUDA devices) each buffer is indexed by PyTorch.
    ``hidden_states`` is None when ``hidden_states_buf`` is.
    """
    buffers = (topk_p_buf, topk_index_buf, bonus_tokens_buf, hidden_states_buf)
    if kernel is None or not all(b is None or b.is_contiguous() for b in buffers):
        return tuple(None if b is None else b[indices] for b in buffers)
    indices = indices.contiguous()
    rows = indices.shape[0]
    out = tuple(
        None if b is None else torch.empty((rows, *b.shape[1:]), dtype=b.dtype, device=b.device)
        for b in buffers
    )
    if rows == 0:
        return out  # an idle DP rank: nothing to launch
    # Elements per (contiguous) row; a 1-D buffer has one.
    widths = [1 if b is None else b.numel() // max(b.shape[0], 1) for b in buffers]
    has_hidden = hidden_states_buf is not None
    kernel[(rows,)](
        indices,
        topk_p_buf, out[0], widths[0],
        topk_index_buf, out[1], widths[1],
        bonus_tokens_buf, out[2], widths[2],
        # Never dereferenced without hidden states; any valid pointer does.
        hidden_states_buf if has_hidden else indices,
        out[3] if has_hidden else indices,
        widths[3],
        BLOCK_SMALL=min(triton.next_power_of_2(max(*widths[:3], 1)), 1024),
        BLOCK_HIDDEN=min(triton.next_power_of_2(max(widths[3], 1)), 1024),
        HAS_HIDDEN=has_hidden,
    )
    return out


# --------------------------------------------------------------------------- FutureMap


#: ``FutureMap._init_stash_bufs`` (back-port 2's): the debug fill and the jitted kernel.
_INIT_STASH_EDITS = (
    TextEdit(
        old="""\
    self.bonus_tokens_buf = like(draft_input.bonus_tokens)
""",
        new="""\
    self.bonus_tokens_buf = like(draft_input.bonus_tokens)
    if _FUTUREMAP_DEBUG_RELAY:
        # A slot read before its first stash must trip the check in resolve_future.
        self.bonus_tokens_buf.fill_(-1)
""",
    ),
    TextEdit(
        old="""\
    self.buf_initialized = True
""",
        new="""\
    # One launch gathers all four buffers on CUDA/ROCm; elsewhere PyTorch indexes them.
    self.gather_kernel = (
        triton.jit(_gather_spec_extras_kernel) if self.topk_p_buf.is_cuda else None
    )
    self.buf_initialized = True
""",
    ),
)

#: ``FutureMap.resolve_future`` (as back-port 2 edits it): one gather for every buffer.
_RESOLVE_FUTURE_EDITS = (
    TextEdit(
        old="""\
        draft_input.topk_p = self.topk_p_buf[indices]
        draft_input.topk_index = self.topk_index_buf[indices]
        draft_input.bonus_tokens = self.bonus_tokens_buf[indices]
""",
        new="""\
        topk_p, topk_index, bonus_tokens, hidden_states = gather_spec_extras(
            indices,
            self.topk_p_buf,
            self.topk_index_buf,
            self.bonus_tokens_buf,
            self.hidden_states_buf if spec_need_hidden_states() else None,
            self.gather_kernel,
        )
        draft_input.topk_p = topk_p
        draft_input.topk_index = topk_index
        draft_input.bonus_tokens = bonus_tokens
""",
    ),
    TextEdit(
        old="""\
        if spec_need_hidden_states():
            draft_input.hidden_states = self.hidden_states_buf[indices]
""",
        new="""\
        if hidden_states is not None:
            draft_input.hidden_states = hidden_states
        if _FUTUREMAP_DEBUG_RELAY:
            # Each slot is stashed, then read once: a second read sees the -1 written here.
            torch._assert_async(
                (bonus_tokens >= 0).all(),
                "FutureMap: relay slot read twice without a stash",
            )
            self.bonus_tokens_buf.index_fill_(0, indices, -1)
""",
    ),
)


_OVERLAP = "sglang.srt.managers.overlap_utils"

BACKPORT = Backport(
    id="fused-gather",
    title="[Spec] Gather the spec-v2 relay in one kernel launch",
    upstream_prs=(26129, 27233, 26108),
    patch_file="0006-Spec-Gather-the-spec-v2-relay-in-one-kernel-launch.patch",
    summary="FutureMap.resolve_future gathers topk/bonus/hidden with one Triton launch",
    targets=(
        Target(_OVERLAP, "triton", triton, expected=ABSENT, kind="value",
               import_line="import triton"),
        Target(_OVERLAP, "tl", tl, expected=ABSENT, kind="value",
               import_line="import triton.language as tl"),
        Target(_OVERLAP, "get_bool_env_var", get_bool_env_var, expected=ABSENT, kind="value",
               import_line="from sglang.srt.utils import get_bool_env_var"),
        Target(_OVERLAP, "_FUTUREMAP_DEBUG_RELAY", _FUTUREMAP_DEBUG_RELAY, expected=ABSENT,
               kind="value", import_line=DEBUG_RELAY_LINE),
        Target(_OVERLAP, "_gather_spec_extras_kernel", _gather_spec_extras_kernel,
               expected=ABSENT),
        Target(_OVERLAP, "gather_spec_extras", gather_spec_extras, expected=ABSENT),
        # Both edit back-port 2's versions (fingerprints of those).
        Target(_OVERLAP, "FutureMap._init_stash_bufs", None, expected="8d993fd06db63ce5",
               kind="edit", edits=_INIT_STASH_EDITS),
        Target(_OVERLAP, "FutureMap.resolve_future", None, expected="85c8bf5d1347c1f7",
               kind="edit", edits=_RESOLVE_FUTURE_EDITS),
    ),
)
