// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <stdexcept>
#include <string>

namespace depot {

// A backend call failed. Carries the call's text, where it was made, and the backend's
// error code and name. The backend's sticky per-thread error state has already been
// cleared when this is thrown, so the next call starts clean.
class error : public std::runtime_error {
 public:
  error(const std::string& what, std::string call, std::string file, int line, int code,
        std::string code_name);

  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] int line() const noexcept { return line_; }
  [[nodiscard]] int code() const noexcept { return code_; }
  [[nodiscard]] const std::string& code_name() const noexcept { return code_name_; }

 private:
  std::string call_;
  std::string file_;
  int line_;
  int code_;
  std::string code_name_;
};

}  // namespace depot
