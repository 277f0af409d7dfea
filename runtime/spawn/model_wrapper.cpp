#include "runtime/spawn/model_wrapper.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

#include <ATen/ATen.h>

#include "sys/sys.hpp"

namespace lspawn {
namespace {

constexpr int64_t kAlign = 4096;  // page-aligned tensors: sharing is per page

std::string snapshot_dir() {
  struct stat st;
  if (::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && ::access("/dev/shm", W_OK) == 0) {
    return "/dev/shm";
  }
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

std::map<std::string, at::Tensor> named_state(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out[p.key()] = p.value();
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out[b.key()] = b.value();
  return out;
}

// A read-write private mapping of the whole snapshot; unmapped when the last tensor goes.
struct Mapping {
  void* addr = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) ::munmap(addr, size);
  }
};

}  // namespace

ModuleSnapshot::ModuleSnapshot(const torch::nn::Module& module) {
  std::string tmpl = snapshot_dir() + "/lspawn-model-XXXXXX";
  const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd < 0) sys::throw_errno("mkostemp", tmpl);
  sys::Fd file(fd);
  path_ = tmpl;
  try {
    proto::ValueList index;
    int64_t offset = 0;
    for (const auto& [name, tensor] : named_state(module)) {
      const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
      const int64_t nbytes = static_cast<int64_t>(t.nbytes());
      proto::ValueList sizes;
      for (int64_t s : t.sizes()) sizes.push_back(proto::Value::of_int(s));
      index.push_back(proto::Value::of_list(
          {proto::Value::of_string(name), proto::Value::of_int(static_cast<int64_t>(t.scalar_type())),
           proto::Value::of_list(std::move(sizes)), proto::Value::of_int(offset), proto::Value::of_int(nbytes)}));
      if (::pwrite(fd, "", 0, offset) < 0) sys::throw_errno("pwrite", path_);
      const char* p = static_cast<const char*>(t.data_ptr());
      int64_t done = 0;
      while (done < nbytes) {
        const ssize_t w = ::pwrite(fd, p + done, static_cast<size_t>(nbytes - done), offset + done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) sys::throw_errno("pwrite", "model snapshot " + path_);
        done += w;
      }
      offset += (nbytes + kAlign - 1) / kAlign * kAlign;
    }
    if (::ftruncate(fd, offset) != 0) sys::throw_errno("ftruncate", path_);
    value_ = proto::Value::of_list({proto::Value::of_string(path_), proto::Value::of_list(std::move(index))});
  } catch (...) {
    ::unlink(path_.c_str());
    throw;
  }
}

ModuleSnapshot::~ModuleSnapshot() { ::unlink(path_.c_str()); }

void ModuleSnapshot::load_into(torch::nn::Module& module, const proto::Value& v) {
  codec_detail::expect_list_size(v, 2, "ModelWrapper snapshot");
  const std::string path = Codec<std::string>::decode(v.list[0]);
  const proto::Value& index = v.list[1];
  if (index.kind != proto::Value::Kind::kList) codec_detail::throw_kind_mismatch("list", index);

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) sys::throw_errno("open", "model snapshot " + path + " (is the ModelWrapper alive?)");
  sys::Fd file(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) sys::throw_errno("fstat", path);
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(st.st_size);
  if (mapping->size > 0) {
    mapping->addr = ::mmap(nullptr, mapping->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (mapping->addr == MAP_FAILED) sys::throw_errno("mmap", path);
  }

  std::map<std::string, at::Tensor> state = named_state(module);
  if (index.list.size() != state.size()) {
    throw CodecError("ModelWrapper: the snapshot has " + std::to_string(index.list.size()) +
                     " parameters and buffers, the worker's model " + std::to_string(state.size()));
  }
  at::NoGradGuard no_grad;
  for (const auto& e : index.list) {
    codec_detail::expect_list_size(e, 5, "ModelWrapper snapshot entry");
    const std::string name = Codec<std::string>::decode(e.list[0]);
    const auto dtype = static_cast<at::ScalarType>(Codec<int>::decode(e.list[1]));
    const std::vector<int64_t> sizes = Codec<std::vector<int64_t>>::decode(e.list[2]);
    const int64_t offset = Codec<int64_t>::decode(e.list[3]);
    const int64_t nbytes = Codec<int64_t>::decode(e.list[4]);
    auto it = state.find(name);
    if (it == state.end()) {
      throw CodecError("ModelWrapper: the worker's model has no parameter or buffer '" + name + "'");
    }
    at::Tensor& target = it->second;
    if (target.sizes() != at::IntArrayRef(sizes) || target.scalar_type() != dtype) {
      throw CodecError("ModelWrapper: '" + name +
                       "' differs in shape or dtype between the "
                       "parent's model and the worker's");
    }
    if (offset < 0 || nbytes < 0 || static_cast<uint64_t>(offset + nbytes) > mapping->size ||
        nbytes != static_cast<int64_t>(target.nbytes())) {
      throw CodecError("ModelWrapper: snapshot entry '" + name + "' lies outside " + path);
    }
    if (nbytes == 0) continue;
    void* data = static_cast<char*>(mapping->addr) + offset;
    at::Tensor mapped = at::from_blob(
        data, sizes, [mapping](void*) {}, at::TensorOptions(dtype));
    target.set_data(mapped);
  }
}

}  // namespace lspawn
