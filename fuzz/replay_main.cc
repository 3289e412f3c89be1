// Replays a libFuzzer corpus without libFuzzer: every file named on the command line, or
// found (recursively) in a directory named there, is fed to LLVMFuzzerTestOneInput once.
// A crash or sanitizer report fails the ctest test; an empty corpus is an error too, so a
// missing corpus directory cannot pass silently.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
bool run_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
    return false;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  std::size_t count = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_directory(arg)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) count += run_file(f) ? 1 : 0;
    } else if (!run_file(arg)) {
      return 1;
    } else {
      ++count;
    }
  }
  if (count == 0) {
    std::fprintf(stderr, "replay: no corpus inputs found\n");
    return 1;
  }
  std::printf("replay: %zu inputs, no crash\n", count);
  return 0;
}
