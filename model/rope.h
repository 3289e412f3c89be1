// The rotary embedding's inverse frequencies, one per rotated pair, written once for the
// oracle (T = double), the CPU backend and the CUDA kernels (T = float).
//
//   inv_freq[i] = theta^(-2i / head_dim),  i = 0 .. head_dim/2 - 1
//
// then rescaled by rope_scaling as Hugging Face's modeling_rope_utils does:
//   linear  inv_freq[i] / factor
//   llama3  with wavelen = 2 pi / inv_freq[i], low = original_max / low_freq_factor and
//           high = original_max / high_freq_factor:
//             wavelen > low              inv_freq[i] / factor         (long wavelengths)
//             wavelen < high             inv_freq[i]                  (short wavelengths)
//             otherwise, s = (original_max / wavelen - low_freq_factor)
//                            / (high_freq_factor - low_freq_factor):
//                                        (1 - s) inv_freq[i] / factor + s inv_freq[i]
// Without scaling the float table is bit for bit the one the backends always used.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "model/model_config.h"

namespace kvp {

template <typename T>
std::vector<T> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  const T theta = static_cast<T>(c.rope_theta);
  std::vector<T> out(static_cast<std::size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    out[static_cast<std::size_t>(i)] = T(1) / std::pow(theta, static_cast<T>(2 * i) / static_cast<T>(c.head_dim));
  const RopeScaling& s = c.rope_scaling;
  const T factor = static_cast<T>(s.factor);
  switch (s.type) {
    case RopeScaling::Type::kNone: break;
    case RopeScaling::Type::kLinear:
      for (T& f : out) f /= factor;
      break;
    case RopeScaling::Type::kLlama3: {
      const T original = static_cast<T>(s.original_max_position_embeddings);
      const T low = static_cast<T>(s.low_freq_factor);
      const T high = static_cast<T>(s.high_freq_factor);
      const T low_freq_wavelen = original / low;
      const T high_freq_wavelen = original / high;
      for (T& f : out) {
        const T wavelen = T(2) * std::numbers::pi_v<T> / f;
        if (wavelen > low_freq_wavelen) {
          f = f / factor;
        } else if (!(wavelen < high_freq_wavelen)) {
          const T smooth = (original / wavelen - low) / (high - low);
          f = (T(1) - smooth) * f / factor + smooth * f;
        }
      }
      break;
    }
  }
  return out;
}

// Gemma 3's sliding layers' inverse frequencies: rope_local_base_freq, unscaled (transformers
// gives its local rotary embedding rope_theta = rope_local_base_freq and the default rope type).
// REQUIRES: c.rope_local_base_freq > 0.
template <typename T>
std::vector<T> rope_local_inv_freq(const ModelConfig& c) {
  ModelConfig local = c;
  local.rope_theta = c.rope_local_base_freq;
  local.rope_scaling = RopeScaling{};
  return rope_inv_freq<T>(local);
}

}  // namespace kvp
