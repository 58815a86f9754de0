"""Ports of the Engines and servers a harness starts: every one gets a block of
:data:`PORT_BLOCK` ports of its own (:class:`PortAllocator`), passed as ``port`` / ``nccl_port``
and ``SGLANG_PORT``. Without them each Engine asks the kernel for a free NCCL port and releases
it before torch binds it, so Engines started side by side can pick the same one (seen:
EADDRINUSE on an NCCL port).

Ports SGLang 0.5.12.post1 / 0.5.13 derive from ``ServerArgs.port`` (``server_args.py``,
``PortArgs.init_new``): without DP attention the scheduler, detokenizer, tokenizer, RPC and
metrics channels are IPC files (no ports); ``nccl_port`` is the torch.distributed store (a free
port when not given: the race above); ``port + 1`` is the gRPC HTTP sidecar's default and
``port + 10000`` the gRPC port (checked to be <= 65535 at start-up even when gRPC is off);
``SGLANG_PORT`` is where ``get_open_port`` starts scanning for the TP message queue's port.
DP attention derives ``port + 13`` and ``port + 233 ..+237`` and is refused here.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable

#: Ports per Engine: port, (port + 1: gRPC sidecar default), nccl_port, SGLANG_PORT and room
#: for get_open_port's upward scan.
PORT_BLOCK = 16
#: Block bases lie in [PORT_LO, PORT_HI): below the kernel's ephemeral range (32768+: ports
#: handed to outgoing connections, NCCL's bootstrap sockets among them), and with the derived
#: gRPC port (port + 10000) in [30000, 40000): <= 65535 and inside no block.
PORT_LO = 20000
PORT_HI = 30000
GRPC_OFFSET = 10000
#: ``K/N``: this harness takes the K-th of N equal slices of the block range (1-based), so that
#: harnesses started side by side on one machine (``scripts/gpu/run_jobs.sh`` sets it per job)
#: never hand out the same block. A block is checked free when it is handed out, not when its
#: Engine binds it, so two harnesses picking from one range can collide (seen: EADDRINUSE on an
#: NCCL port, two e2e shards on one machine).
PORT_SLICE_ENV = "GPU_HARNESS_PORT_SLICE"


def port_slice(lo: int, hi: int, spec: str) -> tuple[int, int]:
    """The ``[lo, hi)`` of slice ``spec`` (``K/N``, 1 <= K <= N) of the blocks in ``[lo, hi)``."""
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"{PORT_SLICE_ENV} must be K/N, got {spec!r}") from None
    blocks = (hi - lo) // PORT_BLOCK
    if not 1 <= k <= n or blocks // n < 1:
        raise ValueError(f"{PORT_SLICE_ENV}={spec!r}: no such slice of {blocks} port blocks")
    per = blocks // n
    return lo + (k - 1) * per * PORT_BLOCK, lo + k * per * PORT_BLOCK


@dataclass(frozen=True)
class PortBlock:
    base: int

    @property
    def port(self) -> int:
        return self.base

    @property
    def nccl_port(self) -> int:
        return self.base + 2

    @property
    def sglang_port(self) -> int:
        return self.base + 4

    @property
    def bound(self) -> tuple[int, ...]:
        """The ports an Engine (or server) of this block binds itself."""
        return (self.port, self.nccl_port, self.sglang_port)

    def ports(self) -> range:
        return range(self.base, self.base + PORT_BLOCK)

    def engine_kwargs(self) -> dict[str, int]:
        return {"port": self.port, "nccl_port": self.nccl_port}

    def env(self) -> dict[str, str]:
        return {"SGLANG_PORT": str(self.sglang_port)}

    def as_dict(self) -> dict[str, int]:
        return {"base": self.base, "port": self.port, "nccl_port": self.nccl_port,
                "sglang_port": self.sglang_port, "grpc_port": self.port + GRPC_OFFSET}


def port_is_free(port: int) -> bool:
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


class PortAllocator:
    """Hands out disjoint :class:`PortBlock` s, one per Engine, never the same block twice in a
    run. Starts at a random block and skips blocks whose ports something else holds; with
    ``GPU_HARNESS_PORT_SLICE=K/N`` it keeps to its own slice of the range (harnesses side by
    side). Thread-safe."""

    def __init__(self, lo: int = PORT_LO, hi: int = PORT_HI, *, rng: random.Random | None = None,
                 is_free: Callable[[int], bool] = port_is_free, slice_spec: str | None = None) -> None:
        spec = os.environ.get(PORT_SLICE_ENV, "").strip() if slice_spec is None else slice_spec
        if spec:
            lo, hi = port_slice(lo, hi, spec)
        self.bases = list(range(lo, hi - PORT_BLOCK + 1, PORT_BLOCK))
        if not self.bases:
            raise ValueError(f"no port block fits in [{lo}, {hi})")
        self.next = (rng or random.Random()).randrange(len(self.bases))
        self.is_free = is_free
        self.lock = threading.Lock()
        self.given: list[tuple[str, PortBlock]] = []

    def allocate(self, name: str = "") -> PortBlock:
        with self.lock:
            for _ in range(len(self.bases)):
                if len(self.given) >= len(self.bases):
                    break
                block = PortBlock(self.bases[self.next % len(self.bases)])
                self.next += 1
                if any(b == block for _, b in self.given):
                    continue
                if all(self.is_free(p) for p in block.bound):
                    self.given.append((name, block))
                    return block
            raise RuntimeError(f"no free port block left ({len(self.given)} handed out)")


def with_ports(kwargs: dict[str, Any], block: PortBlock) -> dict[str, Any]:
    """Engine kwargs with this block's ``port`` and ``nccl_port``.

    Data parallelism (``dp_size`` > 1) gets ``port`` only: SGLang's DP controller makes a
    ``PortArgs`` per DP rank, which hands every rank a fixed ``nccl_port`` as it is (their
    torch.distributed stores would collide); left to SGLang, each rank gets a free port of its
    own, held by the controller until every rank has one."""
    if kwargs.get("enable_dp_attention"):
        raise ValueError("DP attention derives ports outside the Engine's block (port + 13, port + 233..237)")
    ports = block.engine_kwargs()
    if int(kwargs.get("dp_size", 1)) > 1:
        ports.pop("nccl_port")
    return dict(kwargs, **ports)
