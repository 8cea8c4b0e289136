// main.cpp: the program the example's units link into
//
// It prints every unit the compiler built, with its weight and compile-time checksum,
// then a line with the unit count and a combined checksum that does not depend on link
// order. `make check` compares the count against the Makefile's HEAVY + LIGHT.
#include <cstdio>

#include "heavy.hpp"

const heavy::Unit* heavy::registered_units = nullptr;

int main() {
  unsigned long units = 0;
  unsigned long combined = 0;
  for (const heavy::Unit* unit = heavy::registered_units; unit != nullptr; unit = unit->next) {
    std::printf("%-12s weight %6lu checksum %016lx\n", unit->name, unit->weight, unit->checksum);
    ++units;
    combined ^= unit->checksum;
  }
  std::printf("units %lu checksum %016lx\n", units, combined);
  return 0;
}
