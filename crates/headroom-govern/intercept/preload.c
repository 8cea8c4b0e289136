/* LD_PRELOAD without headroom's interceptor: what a compiler job's own processes and
 * programs that start no other program get, so they do not pay for loading it.
 *
 * In C because the interceptor applies it between vfork and exec (it allocates nothing);
 * the Rust side calls the same function. */

#include <string.h>

#include "preload.h"

static int is_interceptor(const char *entry, size_t len) {
    size_t prefix_len = strlen(HEADROOM_INTERCEPTOR_PREFIX);
    const char *name = entry;
    for (size_t i = 0; i < len; i++) {
        if (entry[i] == '/') name = entry + i + 1;
    }
    size_t name_len = len - (size_t)(name - entry);
    return name_len >= prefix_len && memcmp(name, HEADROOM_INTERCEPTOR_PREFIX, prefix_len) == 0;
}

size_t headroom_preload_without_interceptor(const char *value, size_t len, char *out) {
    size_t written = 0;
    size_t start = 0;
    while (start < len) {
        size_t end = start;
        while (end < len && value[end] != ':' && value[end] != ' ') end++;
        size_t entry_len = end - start;
        if (entry_len > 0 && !is_interceptor(value + start, entry_len)) {
            if (written > 0) out[written++] = ':';
            memcpy(out + written, value + start, entry_len);
            written += entry_len;
        }
        start = end + 1;
    }
    return written;
}
