// main.cpp: runs every torch unit on a small tensor and counts the light units that
// registered themselves (the template-heavy example's registry).
#include <cstdio>

#include <torch/torch.h>

#include "heavy.hpp"
#include "torch_units.h"

const heavy::Unit* heavy::registered_units = nullptr;

int main() {
  unsigned long light = 0;
  for (const heavy::Unit* unit = heavy::registered_units; unit != nullptr; unit = unit->next) {
    ++light;
  }
  auto x = torch::ones({4, 4});
  double total = 0;
  for (auto unit : torch_units) total += unit(x).sum().item<double>();
  std::printf("torch units %zu light units %lu total %.3f\n", std::size(torch_units), light, total);
  return 0;
}
