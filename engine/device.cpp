// The PrivateUse1 device: guard, hooks and generators of the `neuron` cores (allocators in
// device_allocator.cpp).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "backend/event.h"
#include "backend/runtime.h"
#include "engine/device_allocator.h"
#include "engine/engine.h"
#include "engine/pch.h"
#include "engine/recording.h"

namespace neuron::engine {
namespace {

constexpr auto kNeuron = c10::DeviceType::PrivateUse1;


// ---- generator ------------------------------------------------------------

// A neuron generator delegates to a CPU generator: the worker hands that one to the CPU
// kernels, so a seeded run draws the numbers CPU eager draws. State changes wait for
// queued random ops first.
class NeuronGeneratorImpl final : public c10::GeneratorImpl {
 public:
  NeuronGeneratorImpl(c10::DeviceIndex index, uint64_t seed)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(kNeuronKey)),
        host_(at::detail::createCPUGenerator(seed)) {}

  void set_current_seed(uint64_t seed) override {
    drain();
    host_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    drain();
    host_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    drain();
    return host_.get_offset();
  }
  uint64_t current_seed() const override { return host_.current_seed(); }
  uint64_t seed() override {
    drain();
    return host_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    drain();
    host_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    drain();
    return host_.unsafeGetGeneratorImpl()->get_state();
  }
  const at::Generator& host() const { return host_; }

 private:
  static constexpr auto kNeuronKey = c10::DispatchKey::PrivateUse1;
  void drain() const {
    if (!backend::initialized()) return;
    flush_windows(device().index());
    backend::drain_core(device().index());
  }
  NeuronGeneratorImpl* clone_impl() const override {
    auto* g = new NeuronGeneratorImpl(device().index(), 0);
    g->host_ = host_.clone();
    return g;
  }

  at::Generator host_;
};

std::vector<at::Generator>& default_generators() {
  static auto* gens = [] {
    auto* v = new std::vector<at::Generator>();
    for (int i = 0; i < device_count(); ++i)
      v->push_back(at::make_generator<NeuronGeneratorImpl>(static_cast<c10::DeviceIndex>(i),
                                                           c10::detail::getNonDeterministicRandom()));
    return v;
  }();
  return *gens;
}

// ---- guard ----------------------------------------------------------------

std::atomic<c10::DeviceIndex> g_default_device{0};
thread_local c10::DeviceIndex t_current_device = g_default_device.load(std::memory_order_relaxed);
thread_local std::array<int64_t, 64> t_current_stream{};

using EventHandle = std::shared_ptr<backend::Event>;

backend::Event& event_of(void* handle) { return **static_cast<EventHandle*>(handle); }

class NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kNeuron; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kNeuron, current_device()}; }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, normalize(d), current_stream_id(normalize(d).index()));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, normalize(d), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    c10::Device dev = normalize(d);
    return c10::Stream(c10::Stream::UNSAFE, dev, backend::new_stream(dev.index()));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    set_current_stream_id(s.device_index(), s.id());
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(device_count());
    } catch (...) {
      return 0;
    }
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr)
      *event = new EventHandle(std::make_shared<backend::Event>(stream.device_index()));
    flush_windows(stream.device_index());
    event_of(*event).record(backend::stream(stream.device_index(), stream.id()));
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    flush_windows(stream.device_index());
    event_of(event).block(backend::stream(stream.device_index(), stream.id()));
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || event_of(event).query();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<EventHandle*>(event);
  }
  bool queryStream(const c10::Stream& stream) const override {
    flush_windows(stream.device_index());
    backend::Stream& s = backend::stream(stream.device_index(), stream.id());
    s.flush_deferred();
    return s.idle();
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    synchronize_stream(backend::stream(stream.device_index(), stream.id()));
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) event_of(event).synchronize();
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    synchronize(index < 0 ? current_device() : index, "device synchronize");
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "neuron: both events must be recorded before elapsed_time");
    event_of(start).synchronize();
    event_of(end).synchronize();
    return event_of(start).elapsed_ms(event_of(end));
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

 private:
  static c10::Device normalize(c10::Device d) {
    return {kNeuron, d.has_index() ? d.index() : current_device()};
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

// ---- hooks ----------------------------------------------------------------

class NeuronHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return new_generator(index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int owner = backend::DeviceMemory::owner(data);
    return {kNeuron, static_cast<c10::DeviceIndex>(owner >= 0 ? owner : current_device())};
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_pointer(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    auto old = current_device();
    set_current_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override;
};

}  // namespace

// ---- engine API -----------------------------------------------------------

c10::DeviceIndex current_device() { return t_current_device; }

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index);
  t_current_device = index;
}

void set_default_device(c10::DeviceIndex index) {
  check_device_index(index);
  g_default_device.store(index, std::memory_order_relaxed);
  t_current_device = index;
}

int64_t current_stream_id(c10::DeviceIndex index) {
  return t_current_stream.at(static_cast<size_t>(index));
}

void set_current_stream_id(c10::DeviceIndex index, int64_t id) {
  check_device_index(index);
  TORCH_CHECK(id >= 0 && id < backend::kMaxStreamsPerCore, "neuron: invalid stream id ", id);
  t_current_stream.at(static_cast<size_t>(index)) = id;
}

backend::Stream& current_stream(c10::DeviceIndex index) {
  return backend::stream(index, current_stream_id(index));
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  if (index < 0) index = current_device();
  check_device_index(index);
  return default_generators()[static_cast<size_t>(index)];
}

at::Generator new_generator(c10::DeviceIndex index) {
  if (index < 0) index = current_device();
  check_device_index(index);
  return at::make_generator<NeuronGeneratorImpl>(index, c10::detail::getNonDeterministicRandom());
}

at::Generator host_generator_of(const at::Generator& gen) {
  auto* impl = dynamic_cast<NeuronGeneratorImpl*>(gen.unsafeGetGeneratorImpl());
  return impl != nullptr ? impl->host() : gen;
}

void NeuronHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const {
  TORCH_CHECK(storage.resizable(), "neuron: this storage is not resizable");
  auto* impl = storage.unsafeGetStorageImpl();
  const c10::DeviceIndex index = storage.device().index();
  if (impl->nbytes() > 0) synchronize(index, "storage resize");  // queued work reads the old block
  c10::DeviceGuard guard(storage.device());
  c10::DataPtr fresh = c10::GetAllocator(kNeuron)->allocate(new_bytes);
  size_t keep = std::min(new_bytes, impl->nbytes());
  if (keep > 0) std::memcpy(fresh.get(), impl->data(), keep);
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_bytes);
}

void register_device_hooks() {
  static bool done = [] {
    at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
    return true;
  }();
  (void)done;
}

}  // namespace neuron::engine
