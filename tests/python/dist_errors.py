"""Bad input to the "neuron" process group: each case must raise one clear error, and no
rank may hang. Run under torchrun with 2 processes (tests/python/test_distributed.py).

`dist_errors.py` checks input errors on each rank, then rank 1 exits while rank 0 issues a
collective: rank 0 must get an error naming the collective at its next sync.
`dist_errors.py mismatch` (with TORCH_DISTRIBUTED_DEBUG=DETAIL) gives the ranks tensors of
different shapes: both must raise torch's collective-mismatch error at the call.
Prints "OK <case>: <message>" per case.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

DEV = "neuron"


def say(line):
    """One write per line: the ranks share torchrun's stdout, and print() may split a line
    into two writes that another rank's output lands between."""
    os.write(1, (line + "\n").encode())


def expect_error(case, fn, *needles):
    try:
        fn()
        torch.neuron.synchronize()
    except (RuntimeError, ValueError) as e:
        message = str(e).splitlines()[0]
        missing = [n for n in needles if n not in str(e)]
        assert not missing, f"{case}: the error does not name {missing}: {e}"
        say(f"OK {case}: {message[:200]}")
        return
    raise AssertionError(f"{case}: no error")


def input_errors():
    rank = dist.get_rank()
    cpu_group = dist.new_group(backend="gloo")
    expect_error("cpu tensor on the neuron group", lambda: dist.all_reduce(torch.ones(4)), "cpu")
    expect_error("neuron tensor on a cpu-only group",
                 lambda: dist.all_reduce(torch.ones(4, device=DEV), group=cpu_group), "neuron")
    expect_error("cpu outputs for a neuron input",
                 lambda: dist.all_gather([torch.empty(4), torch.empty(4)], torch.ones(4, device=DEV)),
                 "allgather", "tensor on cpu", "neuron tensors only")
    expect_error("non-contiguous tensor",
                 lambda: dist.all_reduce(torch.ones(4, 6, device=DEV).t()), "allreduce", "non-contiguous")
    expect_error("two cores in one call",
                 lambda: dist.all_gather([torch.empty(4, device="neuron:0"), torch.empty(4, device="neuron:1")],
                                         torch.ones(4, device="neuron:0")),
                 "allgather", "one NeuronCore")
    expect_error("unsupported reduce op",
                 lambda: dist.all_reduce(torch.ones(4, device=DEV), op=dist._make_nccl_premul_sum(2.0)),
                 "allreduce", "PREMUL_SUM", "allowed")
    expect_error("all_gather_into_tensor output of the wrong size",
                 lambda: dist.all_gather_into_tensor(torch.empty(5, device=DEV), torch.ones(4, device=DEV)),
                 "allgather_into_tensor", "has 5 elements, expected 8")
    expect_error("all_to_all_single splits that do not add up",
                 lambda: dist.all_to_all_single(torch.empty(4, device=DEV), torch.ones(4, device=DEV), [1, 1], [2, 1]),
                 "alltoall_base", "add up to 3 rows")
    expect_error("reduce_scatter_tensor dtypes differ",
                 lambda: dist.reduce_scatter_tensor(torch.empty(2, device=DEV),
                                                    torch.ones(4, device=DEV, dtype=torch.float64)),
                 "reduce_scatter_tensor", "one dtype")
    # The group still works after the errors above.
    t = torch.full((4,), float(rank + 1), device=DEV)
    dist.all_reduce(t)
    assert t.cpu().tolist() == [3.0] * 4, t.cpu()
    say("OK group usable after errors")


def dead_peer():
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(0)  # dies without taking part in the collective below
    t = torch.ones(1 << 16, device=DEV)
    dist.all_reduce(t)  # queued: the host does not block
    expect_error("peer died mid-collective", lambda: t.sum().item(), "c10d allreduce", "failed")
    os._exit(0)  # the group is broken: skip destroy_process_group


def mismatch():
    rank = dist.get_rank()
    t = torch.ones(4 + 4 * rank, device=DEV)
    expect_error("shapes differ across ranks", lambda: dist.all_reduce(t), "mismatch")


def main():
    dist.init_process_group(timeout=datetime.timedelta(seconds=20))
    torch.neuron.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.neuron.device_count())
    if sys.argv[1:] == ["mismatch"]:
        mismatch()
        os._exit(0)
    input_errors()
    dead_peer()


if __name__ == "__main__":
    main()
