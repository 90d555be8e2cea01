// What moves bytes between ranks for the `neuron` process group. The backend hands it
// host-visible tensors (CPU aliases of device memory, made when the collective is issued)
// from the collective stream's worker, one call at a time, in the order the host issued
// them; the returned work's wait() blocks until the bytes moved.
//
// Gloo (torch's ProcessGroupGloo, built by Python and passed in) is the one transport
// today: c10d's Backend API on CPU tensors is exactly the call it needs. A Neuron
// collective library would implement the same calls on device memory.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>
#include <string>

namespace neuron::distributed {

class Transport {
 public:
  virtual ~Transport() = default;
  // The transport's name in errors and traces ("gloo").
  virtual std::string name() const = 0;
  // c10d's collective and point-to-point calls, on host-visible tensors.
  virtual c10d::Backend& host() = 0;
};

// A transport over any c10d backend that takes CPU tensors (ProcessGroupGloo).
std::unique_ptr<Transport> host_backend_transport(c10::intrusive_ptr<c10d::Backend> backend);

}  // namespace neuron::distributed
