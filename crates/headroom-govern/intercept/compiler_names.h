#ifndef HEADROOM_COMPILER_NAMES_H
#define HEADROOM_COMPILER_NAMES_H
#include <stddef.h>

/* Whether the file name `name` (no directory, `len` bytes) is a compiler, linker or
 * compiler driver that headroom governs: gcc, g++-12, x86_64-linux-gnu-g++, clang++-19, nvcc,
 * hipcc, rustc, ld.gold… but not c++filt, clang-tidy or gcc-ar. */
int headroom_is_compiler_name(const char *name, size_t len);

/* Whether `name` is a tool that never starts another program (cp, mkdir, true…): such a
 * program needs no interceptor. */
int headroom_starts_no_program(const char *name, size_t len);

#endif
