"""The fake NCCL across processes without PyTorch (tests/tests/fakegpu_nccl.rs), through
ctypes: rank 0 makes the unique id, forks ranks 1..N-1, and every rank joins the
communicator. Host buffers stand for device memory (the fake's device memory is host memory).
Modes (argv[1]):
  data N      every collective and sends/receives on N ranks, 300,000 elements per rank
              (1.2 MB: several rounds through the 1 MiB slots and 256 KiB mailboxes); prints
              one JSON line per rank with the results' checks
  exit        rank 1 exits after joining; rank 0's all-reduce must fail
  mismatch    rank 0 calls all-reduce, rank 1 all-gather: both must fail
  late        rank 1 never calls the collective (it sleeps); rank 0 must time out
Each rank prints one JSON line: {"rank", "results" | "error"}."""
import ctypes
import json
import os
import sys
import time

nccl = ctypes.CDLL("libnccl.so.2")
nccl.ncclGetLastError.restype = ctypes.c_char_p
SUM, PROD, MAX, MIN, AVG = range(5)
INT32, INT64, FLOAT32, FLOAT64, BF16 = 2, 4, 7, 8, 9
COUNT = 300_000


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def floats(values):
    return (ctypes.c_float * len(values))(*values)


def main():
    mode = sys.argv[1]
    nranks = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    uid = UniqueId()
    assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    rank = 0
    children = []
    for r in range(1, nranks):
        pid = os.fork()
        if pid == 0:
            rank = r
            children = []
            break
        children.append(pid)
    comm = ctypes.c_void_p()
    result = nccl.ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank)
    out = {"rank": rank, "init": result}
    if result == 0:
        out.update(run(mode, comm, rank, nranks))
    # One write(2) per line: the ranks share the pipe.
    os.write(1, (json.dumps(out) + "\n").encode())
    if mode == "exit" and rank == 1:
        os._exit(3)
    if mode != "late" or rank == 0:
        nccl.ncclCommDestroy(comm)
    for pid in children:
        if mode == "late":
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    os._exit(0)


def call(name, *args):
    status = getattr(nccl, name)(*args)
    return status, (nccl.ncclGetLastError(None) or b"").decode()


def run(mode, comm, rank, nranks):
    if mode == "exit":
        if rank == 1:
            return {}
        time.sleep(0.5)
        buf = floats([1.0] * 4)
        status, error = call("ncclAllReduce", buf, buf, 4, FLOAT32, SUM, comm, None)
        return {"status": status, "error": error}
    if mode == "mismatch":
        buf = floats([1.0] * 8)
        if rank == 0:
            status, error = call("ncclAllReduce", buf, buf, 4, FLOAT32, SUM, comm, None)
        else:
            status, error = call("ncclAllGather", buf, buf, 4, FLOAT32, comm, None)
        return {"status": status, "error": error}
    if mode == "late":
        if rank == 1:
            time.sleep(60)
            return {}
        buf = floats([1.0] * 4)
        start = time.monotonic()
        status, error = call("ncclAllReduce", buf, buf, 4, FLOAT32, SUM, comm, None)
        return {"status": status, "error": error, "seconds": round(time.monotonic() - start)}
    return {"results": collectives(comm, rank, nranks)}


def collectives(comm, rank, n):
    """Each collective with known inputs; True where this rank got exactly what NCCL
    defines."""
    checks = {}
    mine = [float(rank * COUNT + i) for i in range(COUNT)]
    send = floats(mine)
    recv = (ctypes.c_float * COUNT)()
    call("ncclAllReduce", send, recv, COUNT, FLOAT32, SUM, comm, None)
    checks["all_reduce_sum"] = list(recv) == [
        float(sum(r * COUNT + i for r in range(n))) for i in range(COUNT)]
    inplace = (ctypes.c_double * 3)(rank + 1, -rank, 2.0 ** rank)
    call("ncclAllReduce", inplace, inplace, 3, FLOAT64, MAX, comm, None)
    checks["all_reduce_max_in_place"] = list(inplace) == [n, 0.0, 2.0 ** (n - 1)]
    ints = (ctypes.c_int64 * 2)(rank + 2, -3)
    call("ncclAllReduce", ints, ints, 2, INT64, PROD, comm, None)
    product = 1
    for r in range(n):
        product *= r + 2
    checks["all_reduce_prod_int64"] = list(ints) == [product, (-3) ** n]
    avg = (ctypes.c_float * 1)(float(rank))
    call("ncclAllReduce", avg, avg, 1, FLOAT32, AVG, comm, None)
    checks["all_reduce_avg"] = list(avg) == [sum(range(n)) / n]
    # bfloat16 1.5 and 2.5 from every rank, summed: exact in bfloat16 for small N.
    bf16 = (ctypes.c_uint16 * 2)(0x3FC0, 0x4020)
    call("ncclAllReduce", bf16, bf16, 2, BF16, SUM, comm, None)
    as_float = [ctypes.c_float.from_buffer_copy(ctypes.c_uint32(v << 16)).value for v in bf16]
    checks["all_reduce_bf16"] = as_float == [1.5 * n, 2.5 * n]
    gathered = (ctypes.c_float * (COUNT * n))()
    call("ncclAllGather", send, gathered, COUNT, FLOAT32, comm, None)
    checks["all_gather"] = list(gathered) == [float(i) for i in range(COUNT * n)]
    block = COUNT // n
    scattered = (ctypes.c_float * block)()
    call("ncclReduceScatter", send, scattered, block, FLOAT32, SUM, comm, None)
    checks["reduce_scatter"] = list(scattered) == [
        float(sum(r * COUNT + rank * block + i for r in range(n))) for i in range(block)]
    root = n - 1
    bcast = floats([float(rank)] * 1000)
    call("ncclBroadcast", bcast, bcast, 1000, FLOAT32, root, comm, None)
    checks["broadcast"] = list(bcast) == [float(root)] * 1000
    reduced = floats([-1.0] * 4)
    call("ncclReduce", floats([float(rank)] * 4), reduced, 4, FLOAT32, SUM, 0, comm, None)
    checks["reduce"] = list(reduced) == ([float(sum(range(n)))] * 4 if rank == 0 else [-1.0] * 4)
    a2a_send = floats([float(rank * 100 + d) for d in range(n)])
    a2a_recv = floats([0.0] * n)
    call("ncclAlltoAll", a2a_send, a2a_recv, 1, FLOAT32, comm, None)
    checks["all_to_all"] = list(a2a_recv) == [float(s * 100 + rank) for s in range(n)]
    split = ctypes.c_void_p()
    status, _ = call("ncclCommSplit", comm, rank % 2, -rank, ctypes.byref(split), None)
    count, new_rank = ctypes.c_int(), ctypes.c_int()
    nccl.ncclCommCount(split, ctypes.byref(count))
    nccl.ncclCommUserRank(split, ctypes.byref(new_rank))
    members = [r for r in range(n) if r % 2 == rank % 2]
    value = floats([float(rank)])
    call("ncclAllReduce", value, value, 1, FLOAT32, SUM, split, None)
    checks["split"] = (status, count.value, new_rank.value, list(value)) == (
        0, len(members), sorted(members, key=lambda r: -r).index(rank), [float(sum(members))])
    nccl.ncclCommDestroy(split)
    checks.update(point_to_point(comm, rank, n, mine))
    return checks


def point_to_point(comm, rank, n, mine):
    """Sends and receives: a ring in one group (every rank sends to the next and receives from
    the previous: deadlocks unless the group's operations progress together), a send alone,
    two messages one way in one group (they arrive in order), and a rank to itself."""
    checks = {}
    got, sent = floats([0.0] * COUNT), floats(mine)
    nccl.ncclGroupStart()
    s1, _ = call("ncclSend", sent, COUNT, FLOAT32, (rank + 1) % n, comm, None)
    s2, _ = call("ncclRecv", got, COUNT, FLOAT32, (rank - 1) % n, comm, None)
    s3, _ = call("ncclGroupEnd")
    before = (rank - 1) % n
    checks["send_recv_ring"] = (s1, s2, s3) == (0, 0, 0) and list(got) == [
        float(before * COUNT + i) for i in range(COUNT)]
    first, second = floats([0.0] * 3), floats([0.0] * 5)
    if rank == 0:
        s1, _ = call("ncclSend", floats([7.0, 8.0, 9.0]), 3, FLOAT32, 1, comm, None)
        # A group's buffers must live until ncclGroupEnd, as with NCCL.
        a, b = floats([1.0, 2.0, 3.0]), floats([4.0, 5.0, 6.0, 7.0, 8.0])
        nccl.ncclGroupStart()
        call("ncclSend", a, 3, FLOAT32, 1, comm, None)
        call("ncclSend", b, 5, FLOAT32, 1, comm, None)
        s2, _ = call("ncclGroupEnd")
        checks["send_alone_then_two_in_order"] = (s1, s2) == (0, 0)
    elif rank == 1:
        alone = floats([0.0] * 3)
        s1, _ = call("ncclRecv", alone, 3, FLOAT32, 0, comm, None)
        nccl.ncclGroupStart()
        call("ncclRecv", first, 3, FLOAT32, 0, comm, None)
        call("ncclRecv", second, 5, FLOAT32, 0, comm, None)
        s2, _ = call("ncclGroupEnd")
        checks["send_alone_then_two_in_order"] = (s1, s2, list(alone), list(first),
                                                  list(second)) == (
            0, 0, [7.0, 8.0, 9.0], [1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0, 8.0])
    else:
        checks["send_alone_then_two_in_order"] = True
    mirror, reflected = floats([0.0] * 2), floats([float(rank), 0.5])
    nccl.ncclGroupStart()
    call("ncclSend", reflected, 2, FLOAT32, rank, comm, None)
    call("ncclRecv", mirror, 2, FLOAT32, rank, comm, None)
    status, _ = call("ncclGroupEnd")
    checks["send_recv_self"] = (status, list(mirror)) == (0, [float(rank), 0.5])
    return checks


main()
