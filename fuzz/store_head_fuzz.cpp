// The first bytes of a connection to rank 0's store, which anyone who reaches the port sends:
// check_store_head (runtime/store_gate.hpp) reads only the bytes it is given, decides by the
// time it has kHeadBytes of them (the gate refuses a full head that is still undecided), and its
// verdict on a prefix stands for every longer one (the gate acts on the first verdict).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "runtime/store_gate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lspawn::HeadVerdict;
  for (const auto protocol : {lspawn::StoreProtocol::Validated, lspawn::StoreProtocol::Legacy}) {
    HeadVerdict first = HeadVerdict::NeedMore;
    for (size_t n = 0; n <= size && n <= 16; ++n) {
      const std::vector<uint8_t> prefix(data, data + n);  // exactly n bytes: ASan sees overreads
      const HeadVerdict v = lspawn::check_store_head(protocol, prefix.data(), prefix.size());
      if (n >= 9 && v == HeadVerdict::NeedMore) std::abort();
      if (first != HeadVerdict::NeedMore && v != first) std::abort();
      if (first == HeadVerdict::NeedMore) first = v;
    }
  }
  return 0;
}
