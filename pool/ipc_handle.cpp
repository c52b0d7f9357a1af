// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/hal/expects.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/ipc_mapping.hpp>

#include <unistd.h>

#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

namespace depot {

namespace {

// The text layout: "dpt1", kind (1 byte), index (4), process, segment, offset, size,
// requested (8 each), the backend handle (64); little-endian, as hex digits.
constexpr std::array<unsigned char, 4> k_magic{'d', 'p', 't', '1'};
constexpr std::size_t k_bytes = 4 + 1 + 4 + 5 * 8 + ipc_memory_handle::size;
static_assert(ipc_handle::hex_length == 2 * k_bytes);

void put(std::string& out, std::uint64_t v, int bytes)
{
  constexpr const char* digits = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned>((v >> (8 * i)) & 0xFFU);
    out += digits[b >> 4];
    out += digits[b & 0xFU];
  }
}

int digit(char c) noexcept
{
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::uint64_t process_id() noexcept { return static_cast<std::uint64_t>(::getpid()); }

struct segment_key {
  device_id device;
  std::uint64_t process;
  std::uint64_t segment;
  ipc_memory_handle memory;
  friend bool operator<(const segment_key& a, const segment_key& b) noexcept
  {
    return std::tie(a.device, a.process, a.segment, a.memory.bytes) <
           std::tie(b.device, b.process, b.segment, b.memory.bytes);
  }
};

struct opened {
  void* base = nullptr;
  std::size_t users = 0;
};

std::mutex& registry_mutex()
{
  static std::mutex m;
  return m;
}
std::map<segment_key, opened>& registry()
{
  static auto* r = new std::map<segment_key, opened>;  // outlives static destructors
  return *r;
}

}  // namespace

std::string ipc_handle::to_hex() const
{
  std::string out;
  out.reserve(hex_length);
  for (unsigned char c : k_magic) put(out, c, 1);
  put(out, static_cast<std::uint64_t>(device.kind), 1);
  put(out, static_cast<std::uint32_t>(device.index), 4);
  for (std::uint64_t v : {process, segment, offset, size, requested}) put(out, v, 8);
  for (unsigned char c : memory.bytes) put(out, c, 1);
  return out;
}

ipc_handle ipc_handle::from_hex(std::string_view text)
{
  DEPOT_EXPECTS(text.size() == hex_length,
                "depot: ipc_handle::from_hex: expected " + std::to_string(hex_length) +
                    " hex digits (a handle's to_hex()), got " + std::to_string(text.size()) +
                    " characters");
  std::array<unsigned char, k_bytes> raw{};
  for (std::size_t i = 0; i < k_bytes; ++i) {
    const int hi = digit(text[2 * i]);
    const int lo = digit(text[2 * i + 1]);
    DEPOT_EXPECTS(hi >= 0 && lo >= 0, "depot: ipc_handle::from_hex: character " + std::to_string(hi < 0 ? 2 * i : 2 * i + 1) +
                                          " is not a hex digit");
    raw[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  DEPOT_EXPECTS(std::memcmp(raw.data(), k_magic.data(), k_magic.size()) == 0,
                "depot: ipc_handle::from_hex: not a depot IPC handle (it must start with the "
                "hex of \"dpt1\", 64707431)");
  std::size_t at = 4;
  auto get = [&](int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{raw[at++]} << (8 * i);
    return v;
  };
  ipc_handle h;
  const std::uint64_t kind = get(1);
  DEPOT_EXPECTS(kind == static_cast<std::uint64_t>(device_kind::cuda) ||
                    kind == static_cast<std::uint64_t>(device_kind::hip),
                "depot: ipc_handle::from_hex: device kind " + std::to_string(kind) +
                    " has no interprocess memory (valid: 1 cuda, 2 hip)");
  h.device.kind = static_cast<device_kind>(kind);
  const std::uint64_t index = get(4);
  DEPOT_EXPECTS(index <= 0x7FFFFFFFU, "depot: ipc_handle::from_hex: device index " + std::to_string(index) +
                                          " is out of range [0, 2^31)");
  h.device.index = static_cast<int>(index);
  h.process = get(8);
  h.segment = get(8);
  h.offset = get(8);
  h.size = get(8);
  h.requested = get(8);
  std::memcpy(h.memory.bytes.data(), raw.data() + at, ipc_memory_handle::size);
  DEPOT_EXPECTS(h.size > 0 && h.requested > 0 && h.requested <= h.size,
                "depot: ipc_handle::from_hex: requested " + std::to_string(h.requested) +
                    " and size " + std::to_string(h.size) + " bytes must satisfy 0 < requested <= size");
  DEPOT_EXPECTS(h.offset <= ~std::uint64_t{0} - h.size && h.segment <= ~std::uint64_t{0} - h.offset - h.size,
                "depot: ipc_handle::from_hex: segment " + std::to_string(h.segment) + " + offset " +
                    std::to_string(h.offset) + " + size " + std::to_string(h.size) +
                    " overflows the address space");
  return h;
}

namespace detail {

void* ipc_attach(const ipc_handle& h, void* (*open)(const ipc_memory_handle&, int))
{
  if (h.process == process_id()) return reinterpret_cast<void*>(static_cast<std::uintptr_t>(h.segment));
  std::lock_guard g{registry_mutex()};
  auto& r = registry();
  const segment_key key{h.device, h.process, h.segment, h.memory};
  auto [it, fresh] = r.try_emplace(key);  // may throw std::bad_alloc: nothing opened yet
  if (fresh) {
    try {
      it->second.base = open(h.memory, h.device.index);
    } catch (...) {
      r.erase(it);
      throw;
    }
  }
  ++it->second.users;
  return it->second.base;
}

void ipc_detach(const ipc_handle& h, void (*close)(void*, int) noexcept) noexcept
{
  if (h.process == process_id()) return;
  std::lock_guard g{registry_mutex()};
  auto& r = registry();
  auto it = r.find(segment_key{h.device, h.process, h.segment, h.memory});
  if (it == r.end()) return;
  if (--it->second.users == 0) {
    close(it->second.base, h.device.index);
    r.erase(it);
  }
}

}  // namespace detail

}  // namespace depot
