"""Back-port 22: a spec-v2 decode on the host mirror may read its lengths from the relay (trees).

Upstream: none (beyond upstream); it extends back-port 21's use of back-port 14's relay from
eager batches without the mirror to every decode batch of a backend that keeps the mirror.
Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on a release whose
backends need no host lengths (a tree on FA3 is the case it was written for). Depends on back-ports 5,
14 and 21.

Why: a backend that keeps the host mirror (``needs_cpu_seq_lens``: FA3 with topk > 1, i.e. a
tree on spec v2; FlashInfer; trtllm) gets its host lengths in ``resolve_seq_lens_cpu`` from a
copy of the whole length buffer that the private stream takes after the *last* publish, and
the host waits for it. After a prefill the last publish is the prefill's (after its target
forward), so the launch of the decode that follows waits for that forward on the GPU, and the
prefill's result is processed only after that launch. On the FA3 tree at concurrency 16 that
wait was 33.7 ms of a 39.9 ms launch (medians over the 16 first decodes after a prefill, in
results/serve-bench/h200x2-2026-11-26). The GPU then idles while the host launches the
decode, and the first tokens wait for that launch. The decode needs nothing from the prefill:
the lengths of its running requests were fixed by the decode before, and those of the
prefilled requests were built on the host.

How: with ``SGLANG_FUTUREMAP_MIRROR_RELAY=1``, or unset with an EAGLE tree (topk > 1), the
relay's bookkeeping (back-port 14's ``lend_draft_extend_lens`` / ``keep_draft_extend_lens``)
also runs on a mirrored backend. A
prefill's host lengths are recorded, and every decode keeps a copy of the length buffer on the
private stream after its own publish (the mirror copied the same buffer in the next
``resolve_seq_lens_cpu``: the copy is now queued earlier, still one per decode).
``resolve_seq_lens_cpu`` then asks ``relayed_eager_seq_lens`` (back-port 21) first: when every
request of the batch is covered, the host waits for the previous decode's copy only and takes
exactly the values the mirror would have copied. Anything else (lengths published by a
PD-decode bootstrap) takes the mirror as before.

The same integers either way: the batch, the backend's metadata and the tokens are those of the
mirror. ``SGLANG_FUTUREMAP_RELAY_CHECK=1`` (test runs) proves it at run time: every relayed
length is compared with the published device lengths (a device-wide wait per decode), and a
difference raises before the launch. ``=0`` (or anything but 1), or unset with a chain
(FlashInfer, trtllm), leaves the mirror path exactly as before.

Measured (4 x H200, 2026-11-26, results/serve-bench/h200x4-relay-2026-11-26): e2e ``mrelay`` 4/4
(FlashInfer chains token for token against stock, the FA3 trees as the tree-v2 cases are judged).
On the FA3 tree the first decode after a prefill no longer waits (0.00 ms inside a 5.4-6.1 ms
launch, against 33.7 / 14.2 ms of waiting at concurrency 16 / 45 before). Alone it does not
bring the tree's TTFT to stock (p50 x0.77 / 0.93 / 0.82 at 1 / 16 / 45, boots 3-5): the prefill's
result still waits for the next launch. With back-port 16's switch as well, TTFT p50 is x1.00 /
0.95 / 1.01 (6 boots) and TPOT x1.16 / 1.18 / 1.06. FlashInfer 8 / 48 reads as without it (2
boots). On by default for trees since then, together with back-port 16 (results/serve-bench/
h200x4-treedefault-2026-11-26: tree-v2 e2e 18/18 with both on by default); off for chains,
where it read the same as without it (FlashInfer). With back-port 23 on FlashInfer (1 boot,
results/serve-bench/h200x4-fence-2026-11-27): TTFT p50 x1.00-1.51 at 16-48 but ITL p99 x0.805 /
0.575 at 32 / 45, so still off for chains. The first such run crashed: that was back-port 23's
reused plan buffer, fixed there (its fence).
"""

from __future__ import annotations

import os

import torch
from sglang.srt.server_args import get_global_server_args

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: 1: a mirrored backend's decodes read their host lengths from the relay, 0: never; unset:
#: for trees (topk > 1) only.
MIRROR_RELAY_ENV = "SGLANG_FUTUREMAP_MIRROR_RELAY"
#: 1: every relayed length is checked against the published device lengths (a host wait per
#: decode; for test runs).
RELAY_CHECK_ENV = "SGLANG_FUTUREMAP_RELAY_CHECK"

# --------------------------------------------------------------------------- FutureMap


def relays_host_lens(self) -> bool:
    """Whether the relay keeps host lengths for this map: always without the mirror (back-port
    14); on a mirrored backend when ``SGLANG_FUTUREMAP_MIRROR_RELAY=1``, or when it is unset and
    the server runs an EAGLE tree (topk > 1)."""
    if not self.needs_cpu_seq_lens:
        return True
    setting = os.environ.get("SGLANG_FUTUREMAP_MIRROR_RELAY", "").strip()
    if setting:
        return setting == "1"
    # Unset: on for a tree (topk > 1), where it was measured to pay off (module docstring).
    return (get_global_server_args().speculative_eagle_topk or 1) > 1


def check_relayed_seq_lens(self, batch, relayed: torch.Tensor) -> None:
    """``SGLANG_FUTUREMAP_RELAY_CHECK=1``: raise unless ``relayed`` (the host lengths the relay
    gave a decode) equals what the mirror would have copied, the published device lengths of
    the batch's pool slots once everything queued has run. Waits for the whole device: a
    check for test runs, never for serving."""
    torch.get_device_module(self.device).synchronize()
    slots = self.batch_pool_slots(batch)
    published = self.new_seq_lens_buf[slots.to(self.new_seq_lens_buf.device)].cpu()
    if published.tolist() != relayed.tolist():
        raise RuntimeError(
            "sglang_futuremap_patch mirror-relay-lens: relayed host lengths "
            f"{relayed.tolist()} differ from the published {published.tolist()} "
            f"(pool slots {slots.tolist()}, mode {batch.forward_mode})")


# --------------------------------------------------------------------------- text edits

_RESOLVE_EDITS = (
    TextEdit(
        old="""\
    relayed = None if self.needs_cpu_seq_lens else self.relayed_eager_seq_lens(batch)
    if relayed is not None:
        # An eager batch: the relay has its lengths without waiting for a prefill.
""",
        new="""\
    relayed = self.relayed_eager_seq_lens(batch) if self.relays_host_lens() else None
    if relayed is not None:
        # An eager batch, or a decode on a mirrored backend with the relay switched on:
        # the relay has its lengths without waiting for a prefill.
        if os.environ.get("SGLANG_FUTUREMAP_RELAY_CHECK", "").strip() == "1":
            self.check_relayed_seq_lens(batch, relayed)
""",
    ),
)

_LEND_EDITS = (
    TextEdit(
        old="""\
    if self.needs_cpu_seq_lens:
        return
    if not hasattr(self, "dx_copies"):
""",
        new="""\
    if not self.relays_host_lens():
        return
    if not hasattr(self, "dx_copies"):
""",
    ),
)

_KEEP_EDITS = (
    TextEdit(
        old="""\
    if self.needs_cpu_seq_lens or not hasattr(self, "dx_copies"):
        return
""",
        new="""\
    if not self.relays_host_lens() or not hasattr(self, "dx_copies"):
        return
""",
    ),
    TextEdit(
        old="""\
            getattr(model_worker_batch, "seq_lens_cpu_pending", None) is None
            and not self.mirrors_eager_batch(batch)
        ):
""",
        new="""\
            getattr(model_worker_batch, "seq_lens_cpu_pending", None) is None
            and not self.mirrors_eager_batch(batch)
            and not self.needs_cpu_seq_lens  # a mirrored backend's next decode reads it
        ):
""",
    ),
)

_OVERLAP = "sglang.srt.managers.overlap_utils"

BACKPORT = Backport(
    id="mirror-relay-lens",
    title="[Spec] Mirrored spec-v2 decodes may read host lengths from the relay",
    upstream_prs=(),
    patch_file="0022-Spec-Mirrored-spec-v2-decodes-may-read-host-lengths-from-the-relay.patch",
    summary="for trees (topk > 1) unless SGLANG_FUTUREMAP_MIRROR_RELAY=0 (=1: chains too): on a "
            "backend that keeps the host mirror "
            "(a tree on FA3, FlashInfer), a decode takes its host lengths from a prefill's host "
            "values and the previous decode's private copy instead of a mirror copy behind the "
            "prefill",
    applied_upstream=None,
    targets=(
        Target(_OVERLAP, "os", os, expected=ABSENT, kind="value", import_line="import os"),
        Target(_OVERLAP, "get_global_server_args", get_global_server_args, expected=ABSENT,
               kind="value", import_line="from sglang.srt.server_args import get_global_server_args"),
        Target(_OVERLAP, "FutureMap.relays_host_lens", relays_host_lens, expected=ABSENT),
        Target(_OVERLAP, "FutureMap.check_relayed_seq_lens", check_relayed_seq_lens,
               expected=ABSENT),
        Target(_OVERLAP, "FutureMap.resolve_seq_lens_cpu", None, expected="0c14d3d88a3b689b",
               kind="edit", edits=_RESOLVE_EDITS),
        Target(_OVERLAP, "FutureMap.lend_draft_extend_lens", None, expected="7f822d15dca80de7",
               kind="edit", edits=_LEND_EDITS),
        Target(_OVERLAP, "FutureMap.keep_draft_extend_lens", None, expected="277ddccab696c047",
               kind="edit", edits=_KEEP_EDITS),
    ),
)
