#include "kernel_check/attention_plugin_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstring>
#include <string>

namespace kvp::verify {
namespace {

// The dtypes each ABI version names (index: the version).
constexpr uint32_t kV1Dtypes = KVP_DTYPE_BIT(KVP_KV_F32) | KVP_DTYPE_BIT(KVP_KV_F16) | KVP_DTYPE_BIT(KVP_KV_BF16);
constexpr uint32_t kV2Dtypes = kV1Dtypes | KVP_DTYPE_BIT(KVP_KV_FP8_E4M3) | KVP_DTYPE_BIT(KVP_KV_FP8_E5M2);
constexpr uint32_t kKnownLayouts = KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF) | KVP_LAYOUT_BIT(KVP_LAYOUT_FLASHINFER_NHD) |
                                   KVP_LAYOUT_BIT(KVP_LAYOUT_FLASHINFER_HND) | KVP_LAYOUT_BIT(KVP_LAYOUT_VLLM);

// Why the descriptor, returned by the entry point of ABI version `entry_version`, is unusable,
// or empty.
std::string descriptor_problem(const kvp_attention_plugin& d, uint32_t entry_version) {
  if (d.abi_version != entry_version)
    return "built for attention-plugin ABI version " + std::to_string(d.abi_version) + ", but exports the version " +
           std::to_string(entry_version) + " entry point; this kvproof speaks versions 1 and " +
           std::to_string(KVP_ATTENTION_PLUGIN_ABI_VERSION);
  if (d.name == nullptr || d.name[0] == '\0') return "bad descriptor: no name";
  if (d.run == nullptr) return "bad descriptor: run is NULL";
  if (d.device != KVP_DEVICE_HOST && d.device != KVP_DEVICE_CUDA)
    return "bad descriptor: unknown device " + std::to_string(d.device);
  if (d.kv_dtypes == 0) return "bad descriptor: declares no KV dtype";
  if ((d.kv_dtypes & ~(entry_version == 1 ? kV1Dtypes : kV2Dtypes)) != 0)
    return "bad descriptor: unknown KV dtype bits in kv_dtypes for ABI version " + std::to_string(entry_version);
  if (d.kv_layouts == 0) return "bad descriptor: declares no KV layout";
  if ((d.kv_layouts & ~kKnownLayouts) != 0) return "bad descriptor: unknown layout bits in kv_layouts";
  return "";
}

}  // namespace

AttentionPlugin::~AttentionPlugin() {
  if (handle_ != nullptr) dlclose(handle_);
}

Result<std::unique_ptr<AttentionPlugin>> AttentionPlugin::load(const std::string& path) {
  auto error = [&path](const std::string& why) { return Status::error("attention plug-in " + path + ": " + why); };
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) return error("no such file");
  // dlopen searches the library path for a bare name; a plug-in is named by its path.
  const std::string open_path = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return error(std::string("cannot load: ") + (why != nullptr ? why : "dlopen failed"));
  }
  dlerror();
  uint32_t entry_version = KVP_ATTENTION_PLUGIN_ABI_VERSION;
  const char* entry_name = KVP_ATTENTION_PLUGIN_ENTRY;
  void* symbol = dlsym(handle, entry_name);
  if (symbol == nullptr) {  // a library built for version 1
    entry_version = 1;
    entry_name = KVP_ATTENTION_PLUGIN_ENTRY_V1;
    symbol = dlsym(handle, entry_name);
  }
  if (symbol == nullptr) {
    dlclose(handle);
    return error(std::string("no entry point ") + KVP_ATTENTION_PLUGIN_ENTRY + " (nor " +
                 KVP_ATTENTION_PLUGIN_ENTRY_V1 + "; export it with extern \"C\" and default visibility)");
  }
  kvp_attention_plugin_entry_fn entry;
  static_assert(sizeof entry == sizeof symbol);
  std::memcpy(&entry, &symbol, sizeof entry);
  const kvp_attention_plugin* descriptor = entry();
  if (descriptor == nullptr) {
    dlclose(handle);
    return error(std::string(entry_name) + " returned NULL");
  }
  if (std::string problem = descriptor_problem(*descriptor, entry_version); !problem.empty()) {
    dlclose(handle);
    return error(problem);
  }
  return std::unique_ptr<AttentionPlugin>(new AttentionPlugin(path, handle, descriptor));
}

}  // namespace kvp::verify
