// Intra-op threads of a stream worker: how many the next kernels use, sharing free work
// among them once a host thread waits, and where the worker's OpenMP team runs.
#pragma once

#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <vector>

#include "fusion/policy.h"

namespace neuron::backend {

// Intra-op threads for one work item on the worker. Items whose bits may depend on the
// count use CPU eager's, so BLAS, FFT and reductions split work the same way, bit for
// bit. Items whose bits do not (`free`) use one thread while the host is busy (the
// dispatching thread needs the other core: two threads on a shared core made every
// parallel region wait for a time slice) and CPU eager's count while a host thread waits
// for this stream or the stream is far behind, and the item touches at least
// spread_elements() elements (smaller ones cost more to wake a helper for than they save).
void set_item_threads(bool free, int64_t elements);
// The policy's thresholds for per-op items and tier-1 groups (tier-2 groups read their
// program's policy): spread_elements, and large_matmul_work for a matmul free of the
// thread count, which counts multiply-adds / 32 (OpWork::matmul_work). By default one
// below 8M multiply-adds runs on one thread even while the host waits (mlp_train's
// 64x256x256 products: waking a sleeping team thread for each cost more than the second
// core gave); from 16M on it takes CPU eager's count even while the host is busy, as a
// fixed item does (the host soon waits for it, and one thread would leave a core idle
// for the rest of the product). Until set_thread_policy is called, the default policy's.
void set_thread_policy(const fusion::Policy& policy);
int64_t spread_elements();
int64_t large_matmul_work();
void set_large_item_threads(int threads);
int large_item_threads();
// Runs units [0, n) of work whose bits do not depend on which thread runs a unit: on
// this worker thread alone while the host is busy, then, as soon as a host thread waits
// for this stream (or the stream is far behind), on CPU eager's count of threads, which
// share the units left one by one. (A split fixed at the start would keep one core idle
// for the rest of the item, or make the host wait for a time slice.)
void run_free_units(int64_t n, c10::function_ref<void(int64_t)> unit);
// Exactly this many intra-op threads for the next kernels on this worker (for work whose
// bits do not depend on the count, such as elementwise kernels); the next
// set_item_threads() restores the usual count. With more than one thread the team goes
// to its own CPUs while a host thread waits and back to any CPU while the host works;
// !may_place (a small item) only ever frees it: the tiny products of a decode step, fixed
// to CPU eager's count, placed and freed the team 3-4 times a step (robust.py's decode,
// 500 steps, eager: 1827 sched_setaffinity calls; 23 with this rule).
void set_item_threads_to(int threads, bool may_place = true);
// Stream's spin hook, on a worker before each item: the worker's OpenMP team spins between
// parallel regions (libgomp's full spin) while a host thread has waited long and the team
// is placed on CPUs of its own; otherwise it sleeps at once (throttled).
void set_team_spinning(bool host_waits_long);
// The calling worker's OpenMP team: thread k's id and the CPU it keeps while a host thread
// waits for the stream (the host is then idle); while the host is busy every team thread
// may run on any of `allowed` and the scheduler keeps them off the host's CPU as it can.
void register_worker_team(std::vector<int> tids, std::vector<int> cpus, std::vector<int> allowed);
// True when an elementwise kernel over `numel` contiguous elements gives the same bits
// at any thread count up to CPU eager's: however ATen splits it (kernels choose their own
// grain), every chunk is a whole multiple of 64 elements, so vector tails fall where one
// thread's do.
bool elementwise_split_free(int64_t numel);

}  // namespace neuron::backend
