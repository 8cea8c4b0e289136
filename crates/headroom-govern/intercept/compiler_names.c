/* Which program names are compilers, linkers or compiler drivers that headroom governs, and
 * which name programs that never start another one.
 *
 * One rule, in C, because the interceptor loaded into every process of a build must decide
 * on each exec without starting anything; the Rust side calls the same function. */

#include <stddef.h>
#include <string.h>

#include "compiler_names.h"

/* Families whose names may carry a target prefix (`x86_64-linux-gnu-`) and a version
 * suffix (`-12`, `-19.1`): g++-12, clang++-19, aarch64-linux-gnu-gcc. */
static const char *const FAMILIES[] = {
    "gcc", "g++", "cc", "c++", "clang", "clang++", "nvcc", "hipcc", "rustc",
    "ld", "lld", "mold",
    /* JIT compilers' own back ends, run by programs (Triton calls ptxas for each kernel);
     * inside an nvcc job its ptxas is part of the job, which runs without the interceptor. */
    "ptxas",
};

/* Names of the linkers `ld` may stand for: ld.bfd, ld.gold, ld.lld, ld.mold. */
static const char *const LD_FLAVOURS[] = {".bfd", ".gold", ".lld", ".mold"};

/* "", or "-" followed by a version made of digits and dots, starting with a digit. */
static int is_version_suffix(const char *suffix, size_t len) {
    if (len == 0) return 1;
    if (suffix[0] != '-' || len < 2 || suffix[1] < '0' || suffix[1] > '9') return 0;
    for (size_t i = 1; i < len; i++) {
        if ((suffix[i] < '0' || suffix[i] > '9') && suffix[i] != '.') return 0;
    }
    return 1;
}

static int is_linker_flavour(const char *family, const char *suffix, size_t len) {
    if (strcmp(family, "ld") != 0) return 0;
    for (size_t i = 0; i < sizeof LD_FLAVOURS / sizeof LD_FLAVOURS[0]; i++) {
        if (strlen(LD_FLAVOURS[i]) == len && memcmp(LD_FLAVOURS[i], suffix, len) == 0) return 1;
    }
    return 0;
}

int headroom_is_compiler_name(const char *name, size_t len) {
    for (size_t f = 0; f < sizeof FAMILIES / sizeof FAMILIES[0]; f++) {
        const char *family = FAMILIES[f];
        size_t family_len = strlen(family);
        for (size_t at = 0; at + family_len <= len; at++) {
            if (memcmp(name + at, family, family_len) != 0) continue;
            if (at > 0 && name[at - 1] != '-') continue;
            const char *suffix = name + at + family_len;
            size_t suffix_len = len - at - family_len;
            if (is_version_suffix(suffix, suffix_len) || is_linker_flavour(family, suffix, suffix_len))
                return 1;
        }
    }
    return 0;
}

/* Tools builds run by the thousand that never start another program. Tools that can (env,
 * find, xargs, sed's `e`, sort's --compress-program, install -s, timeout) are not here. */
static const char *const STARTS_NO_PROGRAM[] = {
    "[", "basename", "cat", "chmod", "cmp", "cp", "cut", "date", "dirname", "echo", "false",
    "grep", "head", "ln", "ls", "md5sum", "mkdir", "mktemp", "mv", "printf", "pwd", "readlink",
    "realpath", "rm", "rmdir", "sha256sum", "sleep", "stat", "tail", "tee", "test", "touch",
    "tr", "true", "uname", "wc",
};

int headroom_starts_no_program(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof STARTS_NO_PROGRAM / sizeof STARTS_NO_PROGRAM[0]; i++) {
        if (strlen(STARTS_NO_PROGRAM[i]) == len && memcmp(STARTS_NO_PROGRAM[i], name, len) == 0)
            return 1;
    }
    return 0;
}
