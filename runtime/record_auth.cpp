#include "runtime/record_auth.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace lspawn {
namespace {

constexpr char kHex[] = "0123456789abcdef";
constexpr char kTokenDomain[] = "lspawn-gloo-connection-v1";  // the MAC of a connection token

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// HMAC-SHA256(secret, domain ‖ len(key) ‖ key ‖ value): the domain keeps key tags and value
// MACs apart, the length makes (key, value) splits unambiguous.
std::array<uint8_t, RecordAuth::kMacSize> mac(const std::string& secret, const char* domain, const std::string& key,
                                              const uint8_t* value, size_t n) {
  std::vector<uint8_t> msg(domain, domain + std::strlen(domain) + 1);
  put_u64(msg, key.size());
  msg.insert(msg.end(), key.begin(), key.end());
  msg.insert(msg.end(), value, value + n);
  std::array<uint8_t, RecordAuth::kMacSize> out{};
  unsigned int len = 0;
  if (::HMAC(::EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(), out.data(),
             &len) == nullptr ||
      len != out.size()) {
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  }
  return out;
}

}  // namespace

RecordAuth::RecordAuth(std::string secret) : secret_(std::move(secret)) {
  if (secret_.size() < kMinSecretSize) {
    throw std::invalid_argument(std::string(env::kLspawnJobSecret) + " is too short (" +
                                std::to_string(secret_.size()) + " characters, at least " +
                                std::to_string(kMinSecretSize) + " needed)");
  }
}

std::string round_secret(const std::string& job_secret, const std::string& run_id, int round) {
  std::vector<uint8_t> r;
  put_u64(r, static_cast<uint64_t>(static_cast<int64_t>(round)));
  const auto m = mac(job_secret, "lspawn-round-v1", run_id, r.data(), r.size());
  std::string out;
  out.reserve(2 * m.size());
  for (uint8_t c : m) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

RecordAuth RecordAuth::for_round(const std::string& job_secret, const std::string& run_id, int round) {
  RecordAuth job(job_secret);  // checks the job secret's length
  return RecordAuth(round_secret(job.secret_, run_id, round));
}

std::optional<RecordAuth> RecordAuth::from_environment() {
  const char* v = std::getenv(env::kLspawnJobSecret);
  if (v == nullptr || *v == '\0') return std::nullopt;
  const char* id = std::getenv(env::kRunId);
  const char* count = std::getenv(env::kRestartCount);
  int round = 0;
  if (count != nullptr && *count != '\0') {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(count, &end, 10);
    if (errno != 0 || *end != '\0' || n < 0 || n > INT32_MAX) {
      throw std::invalid_argument(std::string(env::kRestartCount) + "='" + count + "' is not an integer >= 0");
    }
    round = static_cast<int>(n);
  }
  return for_round(v, id != nullptr && *id != '\0' ? id : "none", round);
}

std::string RecordAuth::key_name(const std::string& key) const {
  const auto tag = mac(secret_, "lspawn-key-v1", key, nullptr, 0);
  std::string out = key + "#";
  for (size_t i = 0; i < 16; ++i) {
    out += kHex[tag[i] >> 4];
    out += kHex[tag[i] & 15];
  }
  return out;
}

std::vector<uint8_t> RecordAuth::seal(const std::string& key, const std::vector<uint8_t>& value) const {
  const auto m = mac(secret_, "lspawn-record-v1", key, value.data(), value.size());
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  out.insert(out.end(), m.begin(), m.end());
  out.insert(out.end(), value.begin(), value.end());
  return out;
}

std::optional<std::vector<uint8_t>> RecordAuth::open(const std::string& key, const std::vector<uint8_t>& sealed) const {
  if (sealed.size() < kHeaderSize || std::memcmp(sealed.data(), kMagic, 4) != 0) return std::nullopt;
  const uint8_t* value = sealed.data() + kHeaderSize;
  const size_t n = sealed.size() - kHeaderSize;
  const auto m = mac(secret_, "lspawn-record-v1", key, value, n);
  if (::CRYPTO_memcmp(m.data(), sealed.data() + 4, kMacSize) != 0) return std::nullopt;
  return std::vector<uint8_t>(value, value + n);
}

RecordAuth::Token RecordAuth::connection_token() const {
  Token t{};
  std::memcpy(t.data(), kTokenMagic, 4);
  uint8_t* nonce = t.data() + 4;
  for (size_t got = 0; got < kNonceSize;) {
    const ssize_t n = ::getrandom(nonce + got, kNonceSize - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::system_error(errno, std::generic_category(), "getrandom (gloo connection token)");
    got += static_cast<size_t>(n);
  }
  const auto m = mac(secret_, kTokenDomain, std::string(), nonce, kNonceSize);
  std::memcpy(t.data() + 4 + kNonceSize, m.data(), kMacSize);
  return t;
}

bool RecordAuth::check_connection_token(const Token& t) const {
  if (std::memcmp(t.data(), kTokenMagic, 4) != 0) return false;
  const auto m = mac(secret_, kTokenDomain, std::string(), t.data() + 4, kNonceSize);
  return ::CRYPTO_memcmp(m.data(), t.data() + 4 + kNonceSize, kMacSize) == 0;
}

bool RecordAuth::same_secret(const RecordAuth& other) const {
  return secret_.size() == other.secret_.size() &&
         ::CRYPTO_memcmp(secret_.data(), other.secret_.data(), secret_.size()) == 0;
}

std::string describe_foreign_record(const std::vector<uint8_t>& sealed_or_plain) {
  // A sealed record (with a MAC that did not match): describe what it carries.
  const bool sealed = sealed_or_plain.size() >= RecordAuth::kHeaderSize &&
                      std::memcmp(sealed_or_plain.data(), RecordAuth::kMagic, 4) == 0;
  const std::vector<uint8_t> value =
      sealed ? std::vector<uint8_t>(sealed_or_plain.begin() + RecordAuth::kHeaderSize, sealed_or_plain.end())
             : sealed_or_plain;
  constexpr size_t kRead = 4096;
  const size_t n = std::min(value.size(), kRead);
  std::string out;
  // gloo's tcp pair addresses: a sockaddr_storage (128 bytes) then a sequence number (8 bytes),
  // one after another.
  constexpr size_t kGlooAddress = sizeof(sockaddr_storage) + sizeof(int64_t);
  std::vector<std::string> addresses;
  for (size_t at = 0; at + kGlooAddress <= n && addresses.size() < 4; at += kGlooAddress) {
    sockaddr_storage ss;
    std::memcpy(&ss, value.data() + at, sizeof ss);
    char buf[INET6_ADDRSTRLEN] = {};
    uint16_t port = 0;
    if (ss.ss_family == AF_INET) {
      sockaddr_in sin;
      std::memcpy(&sin, &ss, sizeof sin);
      ::inet_ntop(AF_INET, &sin.sin_addr, buf, sizeof buf);
      port = ntohs(sin.sin_port);
      addresses.push_back(std::string(buf) + ":" + std::to_string(port));
    } else if (ss.ss_family == AF_INET6) {
      sockaddr_in6 sin6;
      std::memcpy(&sin6, &ss, sizeof sin6);
      ::inet_ntop(AF_INET6, &sin6.sin6_addr, buf, sizeof buf);
      port = ntohs(sin6.sin6_port);
      addresses.push_back("[" + std::string(buf) + "]:" + std::to_string(port));
    } else {
      break;
    }
  }
  if (!addresses.empty()) {
    out = "pointing to ";
    for (size_t i = 0; i < addresses.size(); ++i) out += (i ? ", " : "") + addresses[i];
  } else {
    // lspawn's rendezvous record "<host>\n<pid>", or anything else: its printable prefix.
    std::string text;
    for (size_t i = 0; i < n && text.size() < 80; ++i) {
      const char c = static_cast<char>(value[i]);
      if (c == '\n') {
        text += " pid ";
      } else if (c >= 0x20 && c < 0x7f) {
        text += c;
      } else {
        text += '?';
      }
    }
    out = "claiming '" + text + "'";
  }
  return out + " (" + std::to_string(sealed_or_plain.size()) + " bytes" + (sealed ? ", sealed" : "") + ")";
}

}  // namespace lspawn
