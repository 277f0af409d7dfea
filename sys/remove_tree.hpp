// remove_tree_at(): `rm -rf` of one name, without allocating — the one tree removal of the
// project: sys::remove_tree() (the run directory on a normal end) and the Guardian (the same
// directory when its owner was killed; guardian_loop.hpp, where only async-signal-safe calls may
// run) both call it. Header-only: the lspawn-guardian program links nothing of lspawn's.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace lspawn::sys {

// How deep remove_tree_at() descends (a run directory is two levels deep); 4 KB of stack a level.
inline constexpr int kRemoveTreeDepth = 64;

// Removes `name` under the directory `parent` (a file, a symlink — never followed — or a whole
// tree, `depth` levels deep at most), as `rm -rf` does: getdents64 and unlinkat on a stack
// buffer, no allocation. Entries it cannot remove stay; so does their directory.
inline void remove_tree_at(int parent, const char* name, int depth) {
  if (::unlinkat(parent, name, 0) == 0 || errno == ENOENT) return;
  if (errno != EISDIR || depth <= 0) return;
  const int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct Entry {  // linux_dirent64
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[1];
  };
  alignas(8) char buf[4096];
  // A pass reads the whole directory from its start and removes what it lists; passes go on
  // while one removes something and something was listed (a name created meanwhile, or one that
  // getdents64 skipped while the directory shrank).
  for (int pass = 0; pass < 1024; ++pass) {
    if (::lseek(fd, 0, SEEK_SET) != 0) break;
    bool listed = false, removed = false;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        const Entry* e = reinterpret_cast<const Entry*>(buf + off);
        off += e->reclen;
        if (::strcmp(e->name, ".") == 0 || ::strcmp(e->name, "..") == 0) continue;
        listed = true;
        remove_tree_at(fd, e->name, depth - 1);
        if (::faccessat(fd, e->name, F_OK, AT_SYMLINK_NOFOLLOW) != 0) removed = true;
      }
    }
    if (!listed || !removed) break;
  }
  ::close(fd);
  ::unlinkat(parent, name, AT_REMOVEDIR);
}

}  // namespace lspawn::sys
