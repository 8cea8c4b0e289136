// unit.cpp: one translation unit of the example, compiled once per object file
//
// The Makefile compiles this file many times, each time with its own -DUNIT_NAME (which
// becomes the object's name and the checksum's seed) and either -DTARGET_MIB (peak
// compiler memory to aim for) or -DWEIGHT (raw template weight, for calibration).
#include "heavy.hpp"

#ifndef UNIT_NAME
#error "define UNIT_NAME, e.g. -DUNIT_NAME=heavy-1 (the Makefile does)"
#endif

#if defined(WEIGHT)
constexpr unsigned long unit_weight = WEIGHT;
#elif defined(TARGET_MIB)
constexpr unsigned long unit_weight = heavy::weight_for_mib(TARGET_MIB);
#else
#error "define TARGET_MIB (peak compiler memory in MiB) or WEIGHT, e.g. -DTARGET_MIB=150"
#endif

#define HEAVY_STRINGIFY(x) #x
#define HEAVY_NAME(x) HEAVY_STRINGIFY(x)

namespace {
constexpr const char* unit_name = HEAVY_NAME(UNIT_NAME);
constexpr unsigned long unit_checksum = heavy::grid_checksum<heavy::seed_of(HEAVY_NAME(UNIT_NAME))>(
    std::make_index_sequence<unit_weight>{});
const heavy::Registration registration{unit_name, unit_weight, unit_checksum};
}  // namespace
