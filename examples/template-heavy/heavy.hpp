// heavy.hpp: why this header exists
//
// It is the template-heavy core of the bundled example. Every translation unit that
// includes it instantiates WEIGHT blocks of 64 class templates each, all evaluated at
// compile time, so g++ holds every instantiation in memory until the unit is done.
// Peak compiler memory therefore grows with the weight, and `weight_for_mib` maps a
// target peak in MiB to a weight through a calibration measured with g++ 12 (see
// README.md). The program that the units link into prints a checksum of what the
// compiler computed, so a test can tell that the build really happened.
#pragma once

#include <cstddef>
#include <utility>

namespace heavy {

// A type per value: each distinct value is one more class instantiation.
template <unsigned long V>
struct Val {
  static constexpr unsigned long value = V;
};

// One cell of the grid: four instantiations (itself and three Val), all distinct per
// (seed, index), so g++ can share nothing between cells.
template <unsigned long Seed, unsigned Index>
struct Cell {
  static constexpr unsigned long mixed = (Seed * 2654435761ul) ^ (Index * 40503ul);
  using low = Val<mixed>;
  using high = Val<(mixed >> 3) ^ Index>;
  using both = Val<low::value * 31 + high::value>;
  static constexpr unsigned long value = both::value;
};

inline constexpr std::size_t cells_per_block = 64;

template <unsigned long Seed, std::size_t Block, std::size_t... Index>
constexpr unsigned long block_checksum(std::index_sequence<Index...>) {
  return (Cell<Seed, Block * cells_per_block + Index>::value ^ ...);
}

// Folds over blocks rather than over all cells at once: a single flat pack of tens of
// thousands of elements makes g++ grow quadratically instead of linearly.
template <unsigned long Seed, std::size_t... Block>
constexpr unsigned long grid_checksum(std::index_sequence<Block...>) {
  return (0ul ^ ... ^
          block_checksum<Seed, Block>(std::make_index_sequence<cells_per_block>{}));
}

// FNV-1a, so that every unit name gives a different seed and no two units compute the
// same thing.
constexpr unsigned long seed_of(const char* name) {
  unsigned long hash = 14695981039346656037ul;
  for (; *name != '\0'; ++name) {
    hash = (hash ^ static_cast<unsigned char>(*name)) * 1099511628211ul;
  }
  return hash;
}

// Measured peak RSS of cc1plus (MiB) for a weight, g++ 12.2 -O2 with the GC parameters
// that the Makefile pins (`make calibrate` reproduces it). Sorted by both columns.
struct CalibrationPoint {
  unsigned long mib;
  unsigned long weight;
};
inline constexpr CalibrationPoint calibration[] = {
    {34, 1},     {55, 16},    {124, 64},   {217, 128},   {399, 256},
    {590, 384},  {794, 512},  {1210, 768}, {1667, 1024}, {2134, 1280},
};
inline constexpr std::size_t calibration_points = sizeof(calibration) / sizeof(calibration[0]);

// Piecewise-linear interpolation between calibration points; beyond either end it
// extends the nearest segment. A target below the empty unit's own footprint gets
// weight 1, the lightest unit there is.
constexpr unsigned long weight_for_mib(unsigned long target_mib) {
  std::size_t upper = 1;
  while (upper + 1 < calibration_points && calibration[upper].mib < target_mib) {
    ++upper;
  }
  const CalibrationPoint lo = calibration[upper - 1];
  const CalibrationPoint hi = calibration[upper];
  const double slope = double(hi.weight - lo.weight) / double(hi.mib - lo.mib);
  const double weight = double(lo.weight) + slope * (double(target_mib) - double(lo.mib));
  return weight < 1.0 ? 1ul : static_cast<unsigned long>(weight + 0.5);
}

// Units register themselves at start-up, so main.cpp needs no list of units.
struct Unit {
  const char* name;
  unsigned long weight;
  unsigned long checksum;
  const Unit* next;
};
extern const Unit* registered_units;

struct Registration {
  Unit unit;
  Registration(const char* name, unsigned long weight, unsigned long checksum)
      : unit{name, weight, checksum, registered_units} {
    registered_units = &unit;
  }
};

}  // namespace heavy
