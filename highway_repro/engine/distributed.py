"""Data-parallel training (torch.distributed DDP), launched by torchrun.

    torchrun --standalone --nproc_per_node 2 -m highway_repro.train experiment=demo hydra.run.dir=runs/ddp

`init_from_env()` reads the torchrun variables (WORLD_SIZE, RANK, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) and returns a `DistInfo` when WORLD_SIZE > 1 (else
None: the single-process path is unchanged). Backend: nccl with one GPU per
process (`cuda:LOCAL_RANK`), gloo on CPU.

Semantics (see docs/guide.md, "Speed and scale"):

- `data.batch_size` is the *global* batch. Every rank builds the global batch of
  step k (`data.train_batch(k)` is a pure function of the step) and keeps its
  contiguous slice (`shard`): rank r gets rows [r*B/W, (r+1)*B/W). DDP averages
  the gradients, so with equal shards the update equals the single-process update
  on the global batch; the learning rate is unchanged (it is a global-batch LR).
  The global batch must be divisible by the world size.
- Evaluation batches are sharded the same way (uneven shards allowed) and the
  metric sums are all-reduced, so metrics are those of the whole split.
- Memory models (Transformer-XL): each rank's memory holds the rows of its shard;
  checkpoints store the memory of the global batch (gathered), so a checkpoint can
  be resumed on any number of processes whose shards divide the batch.
- Randomness: under DDP the torch RNG is reseeded at every training step from
  (seed, step, rank) (`seed_step`): ranks draw independent dropout masks and a
  resumed run continues exactly. Parameters are broadcast from rank 0 by DDP.
- Rank 0 alone logs, writes checkpoints and metrics.json; every rank loads the
  checkpoint on resume. Stop requests (SIGTERM/SIGINT) and non-finite losses are
  agreed on by all ranks (`any_flag`, on a CPU/gloo group: no device sync).
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist

from highway_repro.errors import HighwayError

TEARDOWN_S = 120.0  # at most this long a rank waits for the others before the process group is destroyed

ENV_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


def export_submitit_env() -> bool:
    """In a submitit SLURM job of several tasks (hydra/launcher=submitit_cluster with tasks_per_node or
    nodes > 1), set the torchrun variables from SLURM's, so that each task joins one DDP job."""
    if "WORLD_SIZE" in os.environ or os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return False
    if int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return False
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)  # LOCAL_RANK picks the GPU
    return True


def world_size_from_env() -> int:
    """WORLD_SIZE set by torchrun (or derived from a multi-task submitit job); 1 when not distributed."""
    export_submitit_env()
    return int(os.environ.get("WORLD_SIZE", "1"))


def _pick_device(device: str, local_rank: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HighwayError(f"trainer.device={device!r} but CUDA is not available (valid here: auto, cpu)")
        dev = torch.device("cuda", local_rank if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    return dev


@dataclass
class DistInfo:
    """This process's place in a data-parallel job and the few collectives the trainer needs."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str = "gloo"
    seed: int = 0
    _flag_group: object = field(default=None, repr=False)

    # ------------------------------------------------------------------ model
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model on this rank's device inside DistributedDataParallel (params broadcast from rank 0)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = model.to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        # no buffer sync in forward: no model here has buffers that change in training (no BatchNorm), and
        # without it a forward on one rank (an eval shard) never waits for the others
        no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                   else {"broadcast_buffers": False})  # the new name in recent torch, the old one before
        return DDP(model, device_ids=ids, gradient_as_bucket_view=True, **no_sync)

    # ------------------------------------------------------------------- data
    def bounds(self, n: int) -> tuple[int, int]:
        """Rows [lo, hi) of this rank in a batch of n rows (contiguous, sizes differ by at most one)."""
        return self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size

    def shard(self, batch, strict: bool = True):
        """This rank's contiguous slice (dim 0) of every tensor in `batch` (a tuple/list, or one tensor).

        strict: the rows must divide evenly (training: equal shards keep DDP's gradient
        average equal to the global-batch gradient). Non-tensors pass through unchanged.
        """
        if batch is None:
            return None
        if torch.is_tensor(batch):
            return self._slice(batch, strict)
        return type(batch)(self._slice(b, strict) if torch.is_tensor(b) else b for b in batch)

    def _slice(self, t: torch.Tensor, strict: bool) -> torch.Tensor:
        n = t.shape[0]
        if strict and n % self.world_size:
            raise ValueError(f"the global batch of {n} rows does not divide over {self.world_size} processes "
                             f"(valid: data.batch_size a multiple of the world size)")
        lo, hi = self.bounds(n)
        return t[lo:hi]

    def gather_rows(self, tensors):
        """Inverse of `shard` for a list of tensors sharded on dim 0 (equal shards): the global tensors.

        A collective: every rank must call it. Used for the memory of memory models in checkpoints."""
        if tensors is None:
            return None
        out = []
        for t in tensors:
            parts = [torch.empty_like(t) for _ in range(self.world_size)]
            tdist.all_gather(parts, t.contiguous())
            out.append(torch.cat(parts, dim=0))
        return out

    def seed_step(self, step: int) -> None:
        """Reseed this rank's torch RNG (dropout) from (seed, step, rank): independent per rank, exact on resume."""
        torch.manual_seed(((int(self.seed) * 1_000_003 + int(step)) * 4099 + self.rank) % (2 ** 63))

    # ------------------------------------------------------------ collectives
    def all_reduce_sums(self, sums: dict) -> dict:
        """Sum each value of `sums` (tensors or numbers) over all ranks; keys missing on a rank count as 0.

        Values come back as float64 tensors on this rank's device (the tasks' `summarize` takes floats)."""
        keys = sorted(sums)
        gathered = [None] * self.world_size
        tdist.all_gather_object(gathered, keys, group=self._flag_group)
        keys = sorted(set().union(*gathered))
        if not keys:
            return {}
        vec = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64).to(self.device).reshape(())
                           if k in sums else torch.zeros((), dtype=torch.float64, device=self.device)
                           for k in keys])
        tdist.all_reduce(vec, op=tdist.ReduceOp.SUM)
        return dict(zip(keys, vec.unbind(0)))

    def any_flag(self, value) -> int:
        """The maximum of a host-side integer over all ranks (stop signals, bad-step flags); 0 = none.

        Runs on a CPU (gloo) group, so under nccl it does not wait for the GPU."""
        t = torch.tensor([int(value)], dtype=torch.int64)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=self._flag_group)
        return int(t.item())

    def broadcast_object(self, obj, src: int = 0):
        box = [obj]
        tdist.broadcast_object_list(box, src=src, group=self._flag_group)
        return box[0]

    def cleanup(self) -> None:
        """Destroy the process group once every rank is there: first a monitored barrier on the CPU group, since a
        rank that tears gloo down while a peer still holds the connection aborts the peer (`terminate called
        without an active exception`, exit code -6 under torchrun). A rank that never arrives (it failed, or stopped
        alone) costs at most TEARDOWN_S of waiting; the group is destroyed either way."""
        if not tdist.is_initialized():
            return
        try:
            tdist.monitored_barrier(group=self._flag_group, timeout=datetime.timedelta(seconds=TEARDOWN_S))
        except Exception as e:  # a rank that did not arrive: tear down all the same
            logging.getLogger(__name__).warning("teardown without every rank: %s", str(e).strip().splitlines()[0])
        tdist.destroy_process_group()


def init_from_env(device: str = "auto", backend: str | None = None, seed: int = 0,
                  timeout_min: float = 30.0) -> DistInfo | None:
    """A DistInfo from the torchrun environment, the process group initialised; None when WORLD_SIZE <= 1."""
    world = world_size_from_env()
    if world <= 1:
        return None
    missing = [v for v in ENV_VARS + ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={world} but {', '.join(missing)} not set: launch with torchrun")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    dev = _pick_device(device, local_rank)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    kwargs = {"device_id": dev} if backend == "nccl" else {}
    tdist.init_process_group(backend, rank=rank, world_size=world,
                             timeout=datetime.timedelta(minutes=timeout_min), **kwargs)
    flag_group = tdist.new_group(backend="gloo") if backend != "gloo" else None
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev, backend=backend,
                    seed=seed, _flag_group=flag_group)
