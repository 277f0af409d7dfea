// GlooLoopTicker: bounds the waits of gloo's tcp device loop while init_process_group() connects
// and destroys a process group (runtime/process_group.cpp). lspawn's implementation, not part of
// <lspawn/runtime.hpp>.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

namespace gloo::transport {
class Device;
}

namespace lspawn {

// Makes a gloo tcp device's event loop wake up every `period` for as long as it lives.
//
// Why: the loop thread of gloo's tcp device (libgloo 2022) sleeps in epoll_wait with a 10 ms
// timeout, and the connecting side of Pair::connect — like Pair's destructor — waits for that
// loop to go round once (Loop::unregisterDescriptor) before it goes on. Nothing wakes the loop
// at that moment, so each such step waits up to 10 ms; an 8-rank connectFullMesh (28 pairs,
// connected one after another by each rank) spent ~90 ms in those waits here. A periodic
// timerfd registered with the loop bounds each wait by `period` instead. init_process_group()
// runs one while it constructs the process group and its first barrier, pauses it for the
// process group's life (no wake-ups during training), and resumes it while the process group is
// destroyed (each pair's close waits for a tick too).
//
// Devices other than gloo's tcp one, and every device on LibTorch 2.x (compat::kGlooLoopTicker),
// are left alone (the ticker does nothing). The timer stays
// registered while paused (an fd without events). On destruction: when the ticker holds the
// last reference to the device, the device goes first, with the timer armed (its loop thread,
// told to stop, wakes within one period instead of 10 ms); otherwise the timer is unregistered
// (which waits for gloo's next tick, up to 10 ms). Throws std::system_error when the timer
// cannot be created.
class GlooLoopTicker {
 public:
  static constexpr std::chrono::microseconds kDefaultPeriod{500};
  explicit GlooLoopTicker(std::shared_ptr<::gloo::transport::Device> device,
                          std::chrono::microseconds period = kDefaultPeriod);
  ~GlooLoopTicker();
  GlooLoopTicker(const GlooLoopTicker&) = delete;
  GlooLoopTicker& operator=(const GlooLoopTicker&) = delete;
  // False when the device is not gloo's tcp device (nothing is done then).
  bool active() const { return impl_ != nullptr; }
  // Stops / restarts the wake-ups (the timer stays registered). Throws std::system_error.
  void pause();
  void resume();
  // How many times the loop woke up for the timer (for tests).
  uint64_t ticks() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lspawn
