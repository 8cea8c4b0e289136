/* A stand-in for libnvidia-ml.so.1, for machines without an NVIDIA GPU: one device, and every
 * child of the loading process (headroom's CMD) holds FAKE_NVML_BYTES of GPU memory, or the
 * number written in the file FAKE_NVML_BYTES_FILE names at the time of each query (0 while it
 * cannot be read), so a command can change what it holds as it runs. It has exactly the entry
 * points headroom loads, with NVML's C signatures. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static int device;

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    *handle = &device;
    return index == 0 ? 0 : 2;
}
int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
    (void)handle;
    memory->total = 80ULL << 30;
    memory->used = 1ULL << 30;
    memory->free = memory->total - memory->used;
    return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned int *count, nvmlProcessInfo_t *infos) {
    (void)handle;
    const char *bytes = getenv("FAKE_NVML_BYTES");
    unsigned long long each = bytes ? strtoull(bytes, NULL, 10) : 0;
    const char *bytes_file = getenv("FAKE_NVML_BYTES_FILE");
    if (bytes_file) {
        FILE *file = fopen(bytes_file, "r");
        each = 0;
        if (file) {
            if (fscanf(file, "%llu", &each) != 1) each = 0;
            fclose(file);
        }
    }
    unsigned int found = 0;
    DIR *tasks = opendir("/proc/self/task");
    struct dirent *task;
    while (tasks && (task = readdir(tasks))) {
        if (task->d_name[0] == '.') continue;
        char path[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/children", task->d_name);
        FILE *children = fopen(path, "r");
        unsigned int pid;
        while (children && fscanf(children, "%u", &pid) == 1) {
            if (found < *count) {
                infos[found].pid = pid;
                infos[found].usedGpuMemory = each;
                infos[found].gpuInstanceId = infos[found].computeInstanceId = 0;
            }
            found++;
        }
        if (children) fclose(children);
    }
    if (tasks) closedir(tasks);
    int status = found > *count ? 7 /* NVML_ERROR_INSUFFICIENT_SIZE */ : 0;
    *count = found;
    return status;
}
