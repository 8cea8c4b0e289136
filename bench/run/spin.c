/* A CPU-bound child with a fixed amount of work: `spin N` runs N * 10^8 iterations of a
 * dependent integer recurrence that the compiler cannot fold away, and prints the result. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 10;
    unsigned long x = 88172645463325252UL;
    for (long i = 0; i < rounds * 100000000L; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    printf("%lu\n", x);
    return 0;
}
