/* Which program names are compilers, linkers or compiler drivers that headroom governs, and
 * which name programs that never start another one.
 *
 * In C, because the interceptor loaded into every process of a build must decide on each
 * exec without starting anything. The compiler families (`src/compiler/`) apply the same
 * rule in Rust, where they also say which family a name is; tests there hold this table and
 * this rule to theirs. */

#include <stddef.h>
#include <string.h>

#include "compiler_names.h"

/* The programs of every compiler family (`src/compiler/`, one file per family; a test holds
 * these lists to them). Their names may carry a target prefix (`x86_64-linux-gnu-`) and a
 * version suffix (`-12`, `-19.1`): g++-12, clang++-19, aarch64-linux-gnu-gcc.
 * ptxas is here for JIT compilers, which run it by themselves (Triton calls it for each
 * kernel); inside an nvcc job its ptxas is part of the job, which runs without the
 * interceptor. */
static const char *const PROGRAMS[] = {
    "gcc", "g++", "cc", "c++", "clang", "clang++", "nvcc", "hipcc", "rustc",
    "ld", "lld", "mold", "ptxas",
};

/* Programs whose names take a target prefix but no version: the linkers `ld` may stand for. */
static const char *const PROGRAMS_WITHOUT_VERSION[] = {"ld.bfd", "ld.gold", "ld.lld", "ld.mold"};

/* "", or "-" followed by a version made of digits and dots, starting with a digit. */
static int is_version_suffix(const char *suffix, size_t len) {
    if (len == 0) return 1;
    if (suffix[0] != '-' || len < 2 || suffix[1] < '0' || suffix[1] > '9') return 0;
    for (size_t i = 1; i < len; i++) {
        if ((suffix[i] < '0' || suffix[i] > '9') && suffix[i] != '.') return 0;
    }
    return 1;
}

/* Whether `name` is PREFIX `program` SUFFIX, PREFIX empty or ending in '-', and SUFFIX a
 * version (when `takes_version`) or empty. Every place `program` occurs is tried. */
static int names_program(const char *name, size_t len, const char *program, int takes_version) {
    size_t program_len = strlen(program);
    for (size_t at = 0; at + program_len <= len; at++) {
        if (memcmp(name + at, program, program_len) != 0) continue;
        if (at > 0 && name[at - 1] != '-') continue;
        const char *suffix = name + at + program_len;
        size_t suffix_len = len - at - program_len;
        if (takes_version ? is_version_suffix(suffix, suffix_len) : suffix_len == 0) return 1;
    }
    return 0;
}

int headroom_is_compiler_name(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof PROGRAMS / sizeof PROGRAMS[0]; i++) {
        if (names_program(name, len, PROGRAMS[i], 1)) return 1;
    }
    for (size_t i = 0; i < sizeof PROGRAMS_WITHOUT_VERSION / sizeof PROGRAMS_WITHOUT_VERSION[0]; i++) {
        if (names_program(name, len, PROGRAMS_WITHOUT_VERSION[i], 0)) return 1;
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
