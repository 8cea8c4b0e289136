/* `alloc MIB SECONDS`: allocates MIB MiB, touches every page, holds it for SECONDS, exits.
 * Written in C so the process's own footprint (and pages shared with its siblings) is tiny
 * next to what it allocates, which keeps peak-accuracy comparisons about the sampler. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    double seconds = argc > 2 ? atof(argv[2]) : 1.0;
    size_t bytes = mib << 20;
    char *block = malloc(bytes);
    if (!block) return 1;
    for (size_t i = 0; i < bytes; i += 4096) block[i] = 1;
    struct timespec hold = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&hold, NULL);
    free(block);
    return 0;
}
