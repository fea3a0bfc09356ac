"""accumlib.tracker: the CPU's count of live tensor storages, collectives included."""

COLLECTIVE_WORKER = """
import json, sys
import torch, torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from accumlib import tracker as tracking

dist.init_process_group("gloo")
rank = dist.get_rank()
seen = []  # the storages each collective hands the backend, as it reaches the backend (held: their ids stay theirs)


class Spy(TorchDispatchMode):  # entered before the tracker: it sees what the tracker passes on
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            seen.extend(t.untyped_storage() for t in torch.utils._pytree.tree_leaves(args)
                        if isinstance(t, torch.Tensor))
        return func(*args, **(kwargs or {}))


tracker = tracking.LiveTensorBytes()
with Spy(), tracker:
    x = torch.arange(4, dtype=torch.float64) + 10 * rank  # rank 0: 0..3, rank 1: 10..13
    summed = x.clone()
    dist.all_reduce(summed)
    gathered = torch.empty(8, dtype=torch.float64)
    work = dist.all_gather_into_tensor(gathered, x, async_op=True)
    work.wait()
    shard = torch.empty(4, dtype=torch.float64)
    dist.reduce_scatter_tensor(shard, gathered)
    counted = set(tracker._live)
    # what a Work's future gives back (DDP's reducer reads the all-reduced bucket there): the caller's tensor
    again = summed.clone()
    future = dist.all_reduce(again, async_op=True).get_future()
    chunks = work.get_future().value()  # gloo's all-gather: views of the output, one per process
    results = [future.value()[0] is again, [chunk.data_ptr() - gathered.data_ptr() for chunk in chunks]]
    values = [summed.tolist(), gathered.tolist(), shard.tolist()]
    before = tracker.current
    del x, summed, gathered, shard, work, again, future, chunks
    freed = before - tracker.current
with open(sys.argv[2] + f".{rank}", "w") as f:
    json.dump({"handed counted": len(counted & {id(s) for s in seen}), "handed": len(seen), "values": values,
               "freed": freed, "results": results}, f)
dist.destroy_process_group()
"""


def test_collectives_under_the_tracker_hand_the_backend_copies_only(tmp_path):
    """2 gloo processes: a collective run under LiveTensorBytes reaches the backend with uncounted copies of its
    tensors (gloo frees what it holds in its own thread, at a moment of its own: a counted storage freed there made
    FSDP2's peak move from run to run by a reduce-scatter's input, lesson 9's verdict with it); the values are the
    collectives' own, a Work's future gives back the caller's tensors (not the copies: DDP's reducer reads the
    all-reduced bucket from it, and a copy it kept was counted, a whole gradient more than the step holds), and
    every counted storage is freed the moment this thread drops it."""
    import json

    from test_pipeline import run_on_two_processes

    run_on_two_processes(COLLECTIVE_WORKER, tmp_path, str(tmp_path / "out"), timeout=120)
    for rank in range(2):
        out = json.loads((tmp_path / f"out.{rank}").read_text())
        assert out["handed"] == 6 and out["handed counted"] == 0
        assert out["results"] == [True, [0, 4 * 8]]
        summed, gathered, shard = out["values"]
        assert summed == [10.0, 12.0, 14.0, 16.0]
        assert gathered == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]
        assert shard == [2 * v for v in gathered[4 * rank : 4 * rank + 4]]  # the sum of both processes' chunks
        assert out["freed"] == 8 * (4 + 4 + 8 + 4 + 4)  # x, summed, gathered, shard, again: freed on the spot
