#ifndef HEADROOM_PRELOAD_H
#define HEADROOM_PRELOAD_H
#include <stddef.h>

/* File names of headroom's interceptor start so, whatever its version. */
#define HEADROOM_INTERCEPTOR_PREFIX "libheadroom-intercept"

/* Writes the LD_PRELOAD list `value` (`len` bytes, entries split by ':' or ' ') without
 * headroom's interceptor into `out`, entries joined by ':', and returns its length. `out`
 * must hold `len` bytes; it is not NUL-terminated. */
size_t headroom_preload_without_interceptor(const char *value, size_t len, char *out);

#endif
