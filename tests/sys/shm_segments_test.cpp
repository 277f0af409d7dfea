// sys/shm_segments.hpp: the shm backend's segment names and their removal by creator pid, on a
// temporary folder standing in for /dev/shm (the Supervisor's use of it: supervisor_test.cpp).
#include <catch2/catch.hpp>

#include <fstream>
#include <sys/stat.h>

#include "support/temp_dir.hpp"
#include "sys/shm_segments.hpp"

namespace sys = lspawn::sys;

namespace {

void touch(const std::string& path) { std::ofstream(path) << "x"; }
bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("sys: shm_segment_name says who made the segment", "[sys]") {
  CHECK(sys::shm_segment_name("world", 4242, 0xabc) == "/lspawn-world-4242-abc");
  CHECK(sys::shm_segment_name("node 0/tp", 7, 1) == "/lspawn-node_0_tp-7-1");
  CHECK(sys::shm_segment_name(std::string(80, 'a'), 7, 1) == "/lspawn-" + std::string(64, 'a') + "-7-1");
}

TEST_CASE("sys: remove_shm_segments_of removes only that creator's segments", "[sys]") {
  lspawn::test::TempDir dir;
  const std::string d = dir.path;
  const std::string mine1 = d + sys::shm_segment_name("world", 4242, 0xabc);
  const std::string mine2 = d + sys::shm_segment_name("a-b", 4242, 0x1);  // a '-' in the label
  const std::string other_pid = d + sys::shm_segment_name("world", 42420, 0xabc);
  const std::string suffix_pid = d + sys::shm_segment_name("world", 24242, 0xabc);
  const std::string not_ours = d + "/torch_4242_abc";
  const std::string not_hex = d + "/lspawn-world-4242-xyz";
  for (const auto& p : {mine1, mine2, other_pid, suffix_pid, not_ours, not_hex}) touch(p);
  CHECK(sys::remove_shm_segments_of(4242, d) == 2);
  CHECK_FALSE(exists(mine1));
  CHECK_FALSE(exists(mine2));
  CHECK(exists(other_pid));
  CHECK(exists(suffix_pid));
  CHECK(exists(not_ours));
  CHECK(exists(not_hex));
  CHECK(sys::remove_shm_segments_of(4242, d) == 0);
  CHECK(sys::remove_shm_segments_of(4242, d + "/missing") == 0);
  CHECK(sys::remove_shm_segments_of(0, d) == 0);
}
