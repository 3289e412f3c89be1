#include "common/report.h"

#include <sstream>

namespace kvp::verify {
namespace {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

}  // namespace

std::string junit_xml(const std::string& suite, const std::vector<JUnitCase>& cases) {
  int64_t failures = 0;
  for (const JUnitCase& c : cases) failures += c.failure ? 1 : 0;
  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out << "<testsuite name=\"" << xml_escape(suite) << "\" tests=\"" << cases.size() << "\" failures=\"" << failures
      << "\">\n";
  for (const JUnitCase& c : cases) {
    out << "  <testcase classname=\"" << xml_escape(suite) << "\" name=\"" << xml_escape(c.name) << "\">";
    if (c.failure) out << "<failure message=\"" << xml_escape(*c.failure) << "\"/>";
    if (!c.system_out.empty()) out << "<system-out>" << xml_escape(c.system_out) << "</system-out>";
    out << "</testcase>\n";
  }
  out << "</testsuite>\n";
  return out.str();
}

}  // namespace kvp::verify
