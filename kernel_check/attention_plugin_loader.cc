#include "kernel_check/attention_plugin_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstring>
#include <string>

namespace kvp::verify {
namespace {

constexpr uint32_t kKnownDtypes = KVP_DTYPE_BIT(KVP_KV_F32) | KVP_DTYPE_BIT(KVP_KV_F16) | KVP_DTYPE_BIT(KVP_KV_BF16);
constexpr uint32_t kKnownLayouts = KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF) | KVP_LAYOUT_BIT(KVP_LAYOUT_FLASHINFER_NHD) |
                                   KVP_LAYOUT_BIT(KVP_LAYOUT_FLASHINFER_HND) | KVP_LAYOUT_BIT(KVP_LAYOUT_VLLM);

// Why the descriptor is unusable, or empty.
std::string descriptor_problem(const kvp_attention_plugin& d) {
  if (d.abi_version != KVP_ATTENTION_PLUGIN_ABI_VERSION)
    return "built for attention-plugin ABI version " + std::to_string(d.abi_version) + ", this kvproof speaks " +
           std::to_string(KVP_ATTENTION_PLUGIN_ABI_VERSION);
  if (d.name == nullptr || d.name[0] == '\0') return "bad descriptor: no name";
  if (d.run == nullptr) return "bad descriptor: run is NULL";
  if (d.device != KVP_DEVICE_HOST && d.device != KVP_DEVICE_CUDA)
    return "bad descriptor: unknown device " + std::to_string(d.device);
  if (d.kv_dtypes == 0) return "bad descriptor: declares no KV dtype";
  if ((d.kv_dtypes & ~kKnownDtypes) != 0) return "bad descriptor: unknown KV dtype bits in kv_dtypes";
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
  void* symbol = dlsym(handle, KVP_ATTENTION_PLUGIN_ENTRY);
  if (symbol == nullptr) {
    dlclose(handle);
    return error(std::string("no entry point ") + KVP_ATTENTION_PLUGIN_ENTRY +
                 " (export it with extern \"C\" and default visibility)");
  }
  kvp_attention_plugin_entry_fn entry;
  static_assert(sizeof entry == sizeof symbol);
  std::memcpy(&entry, &symbol, sizeof entry);
  const kvp_attention_plugin* descriptor = entry();
  if (descriptor == nullptr) {
    dlclose(handle);
    return error(std::string(KVP_ATTENTION_PLUGIN_ENTRY) + " returned NULL");
  }
  if (std::string problem = descriptor_problem(*descriptor); !problem.empty()) {
    dlclose(handle);
    return error(problem);
  }
  return std::unique_ptr<AttentionPlugin>(new AttentionPlugin(path, handle, descriptor));
}

}  // namespace kvp::verify
