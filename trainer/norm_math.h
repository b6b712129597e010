#pragma once

// The normalization layers' per-feature formulas, written once for the CPU backend and the CUDA
// kernels (README "Normalization layers"). Sums are accumulated by the callers in double; these
// are the steps between them.

#include <cmath>

#include "trainer/host_device.h"

namespace mptrain {

// PyTorch's eps for BatchNorm1d, SyncBatchNorm and LayerNorm, and BatchNorm's momentum.
inline constexpr float kNormEps = 1e-5f;
inline constexpr float kBatchNormMomentum = 0.1f;

MPTRAIN_HD inline float InverseStd(double biased_variance, float eps) {
  return static_cast<float>(1.0 / sqrt(biased_variance + static_cast<double>(eps)));
}

// torch.batch_norm_gather_stats_with_counts, one rank's row at a time: folds (mean, invstd,
// count) into the running combination (avg, var_n = Σ squared deviations, n) with Chan's
// parallel formula; a rank's variance is recovered from its invstd as torch does.
struct BatchStatisticsCombination {
  double avg = 0;
  double var_n = 0;
  double n = 0;

  MPTRAIN_HD void Add(float mean, float invstd, float count, float eps) {
    if (count <= 0) return;
    double v = 1.0 / static_cast<double>(invstd);
    v = v * v - static_cast<double>(eps);
    // A constant feature's variance is 0, but invstd = f32(1/sqrt(eps)) rounds up, so the
    // recovered value is about -8e-13; torch keeps it, and a running_var fed with it for a few
    // hundred steps goes below 0. Ours stops at 0 (the difference is below fp32's resolution
    // of any real variance).
    v = (v < 0 ? 0 : v) * count;
    const double factor = 1.0 / (n + count);
    const double delta = avg - static_cast<double>(mean);
    var_n += v + delta * delta * n * count * factor;
    avg = n * factor * avg + count * factor * static_cast<double>(mean);
    n += count;
  }
  MPTRAIN_HD double BiasedVariance() const { return var_n / n; }
  // torch: var_n / (n − 1) (n = 1 gives inf/nan, as in torch; validation needs 2 rows).
  MPTRAIN_HD double UnbiasedVariance() const { return var_n / (n - 1); }
};

// The running estimate's update, as torch: (1 − momentum) · old + momentum · new.
MPTRAIN_HD inline float RunningUpdate(float old_value, double batch_value, float momentum) {
  return static_cast<float>((1.0 - static_cast<double>(momentum)) * old_value +
                            static_cast<double>(momentum) * batch_value);
}

}  // namespace mptrain
