#include "optimized/kv/kv_groups.h"

#include <algorithm>
#include <map>

#include "common/status.h"

namespace kvp {

KvGroupLayout kv_group_layout(const ModelConfig& model) { return kv_group_layout(model, true); }

KvGroupLayout kv_group_layout(const ModelConfig& model, bool groups) {
  if (!groups || model.sliding_layers.empty()) {  // one group of every layer
    return kv_group_layout(std::vector<int64_t>(static_cast<size_t>(model.num_layers), model.kv_window()));
  }
  std::vector<int64_t> windows(static_cast<size_t>(model.num_layers));
  for (int32_t l = 0; l < static_cast<int32_t>(model.num_layers); ++l)
    windows[static_cast<size_t>(l)] = model.layer_window(l);
  return kv_group_layout(windows);
}

KvGroupLayout kv_group_layout(const std::vector<int64_t>& layer_windows) {
  KVP_CHECK(!layer_windows.empty());
  KvGroupLayout layout;
  const auto num_layers = static_cast<int32_t>(layer_windows.size());
  layout.layer_group.assign(static_cast<size_t>(num_layers), 0);
  layout.layer_slot.resize(static_cast<size_t>(num_layers));
  // Layers by attention type (window), each type in layer order; types by first layer.
  std::map<int64_t, std::vector<int32_t>> by_window;
  std::vector<int64_t> order;
  for (int32_t l = 0; l < num_layers; ++l) {
    const int64_t w = layer_windows[static_cast<size_t>(l)];
    if (by_window.count(w) == 0) order.push_back(w);
    by_window[w].push_back(l);
  }
  int32_t size = num_layers;
  for (const auto& [w, layers] : by_window) size = std::min(size, static_cast<int32_t>(layers.size()));
  KVP_CHECK(size > 0);
  layout.group_size = size;
  for (int64_t w : order) {
    const std::vector<int32_t>& layers = by_window[w];
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % static_cast<size_t>(size) == 0) layout.group_windows.push_back(w);
      layout.layer_group[static_cast<size_t>(layers[i])] = static_cast<int32_t>(layout.group_windows.size() - 1);
      layout.layer_slot[static_cast<size_t>(layers[i])] = static_cast<int32_t>(i % static_cast<size_t>(size));
    }
  }
  return layout;
}

std::string KvGroupLayout::to_string() const {
  std::map<int64_t, int64_t> count;
  for (int64_t w : group_windows) ++count[w];
  std::string s = std::to_string(num_groups()) + (num_groups() == 1 ? " group of " : " groups of ") +
                  std::to_string(group_size) + (group_size == 1 ? " layer" : " layers");
  std::string kinds;
  for (const auto& [w, n] : count) {
    kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + (w == 0 ? " full" : " with window " + std::to_string(w));
  }
  return s + ": " + kinds;
}

}  // namespace kvp
