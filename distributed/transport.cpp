#include "distributed/transport.h"

namespace neuron::distributed {
namespace {

class HostBackendTransport final : public Transport {
 public:
  explicit HostBackendTransport(c10::intrusive_ptr<c10d::Backend> backend) : backend_(std::move(backend)) {}
  std::string name() const override { return backend_->getBackendName(); }
  c10d::Backend& host() override { return *backend_; }

 private:
  c10::intrusive_ptr<c10d::Backend> backend_;
};

}  // namespace

std::unique_ptr<Transport> host_backend_transport(c10::intrusive_ptr<c10d::Backend> backend) {
  TORCH_CHECK(backend, "neuron process group: the transport backend is missing");
  return std::make_unique<HostBackendTransport>(std::move(backend));
}

}  // namespace neuron::distributed
