#include "trace/recorder.h"

#include <algorithm>

#include <zlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "trace/op_registry.h"

namespace neuron::trace {
namespace {

constexpr size_t kBufferEvents = 4096;

struct ThreadBuffer {
  std::mutex mutex;
  std::vector<Event> events;
  uint16_t id = 0;
  uint64_t session = 0;
};

struct State {
  std::mutex mutex;  // file, strings, buffer list
  std::condition_variable cv;
  FILE* file = nullptr;
  std::string path;
  std::chrono::steady_clock::time_point epoch;
  std::atomic<uint64_t> session{0};
  std::vector<ThreadBuffer*> buffers;  // leaked with their threads' lifetime ignored
  std::vector<std::vector<Event>> full;
  std::vector<std::string> strings;      // id - 1 -> text
  std::vector<std::string> thread_names; // id - 1 -> name
  size_t strings_written = 0, threads_written = 0, ops_written = 0;
  std::thread writer;
  bool stop = false;
};

State& state() {
  static auto* s = new State();
  return *s;
}

thread_local ThreadBuffer* t_buffer = nullptr;

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

// Escapes text for the JSON of the strings chunk.
void json_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

// Writes one chunk: type, raw length, stored length, CRC-32 of the stored bytes, payload.
void write_chunk_locked(State& s, ChunkType type, const void* data, size_t size) {
  uLongf bound = compressBound(static_cast<uLong>(size));
  std::string stored(bound, '\0');
  compress2(reinterpret_cast<Bytef*>(stored.data()), &bound,
            static_cast<const Bytef*>(data), static_cast<uLong>(size), 1);
  stored.resize(bound);
  std::string header;
  put_u32(header, static_cast<uint32_t>(type));
  put_u32(header, static_cast<uint32_t>(size));
  put_u32(header, static_cast<uint32_t>(stored.size()));
  put_u32(header, static_cast<uint32_t>(
                      crc32(0, reinterpret_cast<const Bytef*>(stored.data()), bound)));
  std::fwrite(header.data(), 1, header.size(), s.file);
  std::fwrite(stored.data(), 1, stored.size(), s.file);
}

// New names since the last strings chunk, as JSON {"ops":{..},"strings":{..},"threads":{..}}.
void write_strings_locked(State& s) {
  const size_t ops = OpRegistry::instance().size();
  if (ops == s.ops_written && s.strings.size() == s.strings_written &&
      s.thread_names.size() == s.threads_written)
    return;
  std::string json = "{\"ops\":{";
  for (size_t id = s.ops_written + 1; id <= ops; ++id) {
    if (id > s.ops_written + 1) json += ',';
    json += "\"" + std::to_string(id) + "\":";
    json_string(json, OpRegistry::instance().name(static_cast<OpId>(id)));
  }
  json += "},\"strings\":{";
  for (size_t i = s.strings_written; i < s.strings.size(); ++i) {
    if (i > s.strings_written) json += ',';
    json += "\"" + std::to_string(i + 1) + "\":";
    json_string(json, s.strings[i]);
  }
  json += "},\"threads\":{";
  for (size_t i = s.threads_written; i < s.thread_names.size(); ++i) {
    if (i > s.threads_written) json += ',';
    json += "\"" + std::to_string(i + 1) + "\":";
    json_string(json, s.thread_names[i]);
  }
  json += "}}";
  s.ops_written = ops;
  s.strings_written = s.strings.size();
  s.threads_written = s.thread_names.size();
  write_chunk_locked(s, ChunkType::kStrings, json.data(), json.size());
}

}  // namespace

Recorder& Recorder::instance() {
  static Recorder r;
  return r;
}

uint64_t Recorder::now_ns() const {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - state().epoch)
                                   .count());
}

uint16_t Recorder::thread_id(const char* role) {
  State& s = state();
  if (t_buffer == nullptr) {
    auto* b = new ThreadBuffer();
    b->events.reserve(kBufferEvents);
    std::lock_guard lock(s.mutex);
    s.thread_names.push_back(std::string(role) + " " + std::to_string(s.thread_names.size() + 1));
    b->id = static_cast<uint16_t>(s.thread_names.size());
    b->session = s.session;
    s.buffers.push_back(b);
    t_buffer = b;
  }
  return t_buffer->id;
}

void Recorder::emit_ended(EventKind kind, uint64_t value, uint64_t aux, uint64_t duration_ns, uint8_t core) {
  Event e;
  const uint64_t now = now_ns();
  e.time_ns = now - std::min(now, duration_ns);
  e.duration_ns = duration_ns;
  e.kind = static_cast<uint8_t>(kind);
  e.value = value;
  e.aux = aux;
  e.core = core;
  emit(e);
}

void Recorder::emit(const Event& event) {
  if (!active()) return;
  if (t_buffer == nullptr) thread_id("thread");
  ThreadBuffer* b = t_buffer;
  std::unique_lock lock(b->mutex);
  if (b->session != state().session) {  // left over from an earlier recording
    b->events.clear();
    b->session = state().session;
  }
  b->events.push_back(event);
  b->events.back().thread = b->id;
  if (b->events.size() >= kBufferEvents) {
    std::vector<Event> fresh;
    fresh.reserve(kBufferEvents);
    fresh.swap(b->events);
    lock.unlock();
    State& s = state();
    std::lock_guard slock(s.mutex);
    s.full.push_back(std::move(fresh));
    s.cv.notify_one();
  }
}

void Recorder::name_op(uint32_t, const std::string&) {}  // op names come from OpRegistry

uint32_t Recorder::intern_string(const std::string& text) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  for (size_t i = 0; i < s.strings.size(); ++i)
    if (s.strings[i] == text) return static_cast<uint32_t>(i + 1);
  s.strings.push_back(text);
  return static_cast<uint32_t>(s.strings.size());
}

bool Recorder::start(const std::string& path, const std::string& metadata_json,
                     std::string& error) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (active()) {
    error = "a trace is already being recorded to " + s.path;
    return false;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    error = "cannot open trace file '" + path + "' for writing: " + std::strerror(errno);
    return false;
  }
  s.file = f;
  s.path = path;
  s.epoch = std::chrono::steady_clock::now();
  ++s.session;
  s.full.clear();
  s.ops_written = s.strings_written = s.threads_written = 0;
  s.stop = false;
  events_written_ = 0;
  std::fwrite(kMagic, 1, sizeof(kMagic), f);
  uint32_t version = kFormatVersion, flags = 0;
  std::fwrite(&version, 4, 1, f);
  std::fwrite(&flags, 4, 1, f);
  write_chunk_locked(s, ChunkType::kMetadata, metadata_json.data(), metadata_json.size());
  active_.store(true);
  s.writer = std::thread([this] {
    State& st = state();
    std::unique_lock wlock(st.mutex);
    while (true) {
      st.cv.wait_for(wlock, std::chrono::milliseconds(100), [&] { return st.stop || !st.full.empty(); });
      auto batches = std::move(st.full);
      st.full.clear();
      for (auto& batch : batches) {
        write_chunk_locked(st, ChunkType::kEvents, batch.data(), batch.size() * sizeof(Event));
        events_written_ += batch.size();
      }
      write_strings_locked(st);
      if (st.stop && st.full.empty()) break;
    }
  });
  return true;
}

uint64_t Recorder::stop() {
  State& s = state();
  if (!active()) return 0;
  active_.store(false);
  // Steal what the threads still hold.
  std::vector<ThreadBuffer*> buffers;
  {
    std::lock_guard lock(s.mutex);
    buffers = s.buffers;
  }
  for (ThreadBuffer* b : buffers) {
    std::vector<Event> rest;
    {
      std::lock_guard block(b->mutex);
      if (b->session != s.session || b->events.empty()) continue;
      rest.swap(b->events);
    }
    std::lock_guard lock(s.mutex);
    s.full.push_back(std::move(rest));
  }
  {
    std::lock_guard lock(s.mutex);
    s.stop = true;
    s.cv.notify_one();
  }
  s.writer.join();
  std::lock_guard lock(s.mutex);
  write_strings_locked(s);
  uint64_t total = events_written_.load();
  write_chunk_locked(s, ChunkType::kEnd, &total, sizeof(total));
  bytes_written_ = static_cast<uint64_t>(std::ftell(s.file));
  std::fclose(s.file);
  s.file = nullptr;
  return total;
}

std::string Recorder::path() const {
  std::lock_guard lock(state().mutex);
  return state().path;
}

}  // namespace neuron::trace
