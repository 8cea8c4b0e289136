/* `true` without a C library: it exits at once, so starting it costs only what the kernel
 * charges for a process. Set beside a static glibc `true`, whose start also runs glibc's
 * initialisation (on x86 its CPUID probes of the caches, which a hypervisor may trap), it
 * shows the floor every program's start costs on the host, the shim's included
 * (interception-cost.sh). Build: cc -nostdlib -static -o nolibc-true nolibc-true.c */
void _start(void) {
#if defined(__x86_64__)
    __asm__ volatile("mov $60, %eax\n\txor %edi, %edi\n\tsyscall");
#elif defined(__aarch64__)
    __asm__ volatile("mov x8, #93\n\tmov x0, #0\n\tsvc #0");
#else
#error "nolibc-true.c knows the exit system call of x86-64 and aarch64 only"
#endif
    for (;;) {
    }
}
