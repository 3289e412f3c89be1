// JUnit XML for CI, shared by every command that writes --junit (verify, compare): a suite of
// named cases, each passed or failed with a message, with optional captured output.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kvp::verify {

struct JUnitCase {
  std::string name;
  std::optional<std::string> failure;  // set: the case failed, with this message
  std::string system_out;              // empty: no <system-out> element
};

// `suite` names the suite and every case's classname. Text is XML-escaped.
std::string junit_xml(const std::string& suite, const std::vector<JUnitCase>& cases);

}  // namespace kvp::verify
