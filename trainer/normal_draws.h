#pragma once

// Standard normal draws addressed by (seed, index), written once for the host (CPU backend,
// tests) and the GPU (the CUDA backend's FillNormal kernel): a parameter's initial values are
// a function of the seed and each value's index in the flat parameter buffer, whatever fills
// them — one thread or many, the CPU or a GPU kernel — so a model of hundreds of millions of
// parameters is initialised where it lives, in milliseconds, instead of on the host and
// uploaded (GPT-2 350M: 1.6 s on the rank's CPU, most of a warm job's start).
//
// The uniforms come from Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC 2011; the counter-based generator of cuRAND and PyTorch's CUDA generator),
// keyed by the seed, counting pairs of indices; each call's four words make two 52-bit
// uniforms in (0, 1) and Box-Muller turns them into the pair's two normals (cos for the even
// index, sin for the odd), in double, rounded once to float by the caller. The host's libm and
// CUDA's double log / cos / sin differ by at most a couple of units in the last place of a
// double: a float rounded from them differs only where the exact value lies that close to a
// rounding boundary (a value in hundreds of millions, by one float ulp).

#include <cstdint>

#include "trainer/host_device.h"

#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace mptrain {

struct PhiloxWords {
  uint32_t w[4];
};

// Philox4x32 with 10 rounds (Random123's philox4x32_10: its known-answer vectors are in
// normal_draws_test.cc).
MPTRAIN_HD inline PhiloxWords Philox4x32x10(PhiloxWords counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * counter.w[0];
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * counter.w[2];
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32);
    const uint32_t lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(product1);
    counter = PhiloxWords{{hi1 ^ counter.w[1] ^ key0, lo1, hi0 ^ counter.w[3] ^ key1, lo0}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// A uniform in (0, 1) from the top 52 bits of two words, at the centre of its 2^-52 cell:
// never 0 (Box-Muller's log is finite) and never 1 (with 53 bits, the top cell's centre
// 1 - 2^-54 rounds to 1.0 in double).
MPTRAIN_HD inline double UnitFromWords(uint32_t high, uint32_t low) {
  const uint64_t bits = ((static_cast<uint64_t>(high) << 32) | low) >> 12;
  return (static_cast<double>(bits) + 0.5) * 0x1.0p-52;
}

// The standard normal draws 2·pair (cos) and 2·pair + 1 (sin) of stream `seed`: one Philox
// call, one log and square root for both (a fill computes them together).
struct NormalPair {
  double even, odd;
};
MPTRAIN_HD inline NormalPair StandardNormalPair(uint64_t seed, uint64_t pair) {
  const PhiloxWords words = Philox4x32x10(
      PhiloxWords{{static_cast<uint32_t>(pair), static_cast<uint32_t>(pair >> 32), 0u, 0u}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const double radius = sqrt(-2.0 * log(UnitFromWords(words.w[0], words.w[1])));
  const double angle = 6.283185307179586 * UnitFromWords(words.w[2], words.w[3]);
  return NormalPair{radius * cos(angle), radius * sin(angle)};
}

// The standard normal draw number `index` of stream `seed`.
MPTRAIN_HD inline double StandardNormalDraw(uint64_t seed, uint64_t index) {
  const NormalPair pair = StandardNormalPair(seed, index >> 1);
  return (index & 1) == 0 ? pair.even : pair.odd;
}

// What FillNormal writes at `index`: std · the draw, rounded once to float.
MPTRAIN_HD inline float NormalParameterValue(uint64_t seed, uint64_t index, double std) {
  return static_cast<float>(std * StandardNormalDraw(seed, index));
}

}  // namespace mptrain
