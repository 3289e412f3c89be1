// Errors as values (LevelDB's Status, in the shape of C++23's std::expected).
//
// Every API edge that can be handed bad input (a checkpoint, a config, a trace, a
// workload, a request) returns a Status or a Result<T>. The message names what was
// wrong and where ("model.safetensors: tensor 'x': data_offsets overlap 'y'").
// Programmer errors (a violated precondition) are not Status values: they are checked
// by KVP_CHECK, which aborts with the location.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kvp {

// [[nodiscard]]: an ignored error is a silent one; a caller that means to ignore one says so
// with a (void) cast.
class [[nodiscard]] Status {
 public:
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message)); }

  bool is_ok() const { return !message_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  // REQUIRES: !is_ok().
  const std::string& message() const { return *message_; }

  // Prefixes the message with context: "config.json: " + "hidden_size must be > 0".
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(context + ": " + *message_);
  }

 private:
  Status() = default;
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

// A value or an error. Access to value() on an error aborts (a programmer error).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).is_ok()) {
      std::fprintf(stderr, "kvp::Result constructed from an ok Status\n");
      std::abort();
    }
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status ok_status = Status::ok();
    return is_ok() ? ok_status : std::get<Status>(v_);
  }
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->checked(); }

 private:
  T& checked() {
    if (!is_ok()) {
      std::fprintf(stderr, "kvp::Result::value() on an error: %s\n", std::get<Status>(v_).message().c_str());
      std::abort();
    }
    return std::get<T>(v_);
  }
  std::variant<T, Status> v_;
};

[[noreturn]] inline void check_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: KVP_CHECK failed: %s\n", file, line, expr);
  std::abort();
}

}  // namespace kvp

// Precondition checks that stay on in release builds: a broken precondition is a bug in
// the caller, and a verification tool must not continue past one.
#define KVP_CHECK(expr) ((expr) ? static_cast<void>(0) : ::kvp::check_failed(#expr, __FILE__, __LINE__))

// Propagates an error Status from an expression that yields a Status.
#define KVP_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::kvp::Status kvp_status_ = (expr);           \
    if (!kvp_status_.is_ok()) return kvp_status_; \
  } while (0)
