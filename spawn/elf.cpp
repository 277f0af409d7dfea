#include "spawn/elf.hpp"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "sys/sys.hpp"

namespace lspawn::elf {
namespace {

// pread of exactly n bytes at off; false when the file is shorter.
bool read_at(int fd, void* p, size_t n, off_t off, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, static_cast<char*>(p) + got, n - got, off + off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) sys::throw_errno("pread", path);
    if (r == 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

bool has_section(const std::string& path, const std::string& name) {
  sys::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) sys::throw_errno("open", path);
  Elf64_Ehdr eh;
  if (!read_at(fd.get(), &eh, sizeof eh, 0, path)) return false;
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 ||
      eh.e_shstrndx >= eh.e_shnum || eh.e_shnum > 65000) {
    return false;
  }
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  if (!read_at(fd.get(), sh.data(), sh.size() * sizeof(Elf64_Shdr), off_t(eh.e_shoff), path)) {
    return false;
  }
  const Elf64_Shdr& strtab = sh[eh.e_shstrndx];
  if (strtab.sh_size == 0 || strtab.sh_size > (64u << 20)) return false;
  std::string names(strtab.sh_size, '\0');
  if (!read_at(fd.get(), names.data(), names.size(), off_t(strtab.sh_offset), path)) return false;
  names.push_back('\0');
  for (const Elf64_Shdr& s : sh) {
    if (s.sh_name < names.size() && name == names.c_str() + s.sh_name) return true;
  }
  return false;
}

}  // namespace lspawn::elf
