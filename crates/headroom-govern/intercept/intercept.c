/* libheadroom-intercept.so: loaded into every process of a governed build through
 * LD_PRELOAD, it turns each exec of a compiler into an exec of headroom's launcher, whatever
 * path the compiler is called by: `/usr/bin/c++` from a CMake cache configured before
 * headroom ran, `$CUDA_HOME/bin/nvcc` from torch, `g++` found on PATH.
 *
 *     execve("/usr/bin/c++", ["c++", "-c", "a.cpp"], env)
 *  -> execve($HEADROOM_LAUNCHER, ["headroom-launch", "/usr/bin/c++", "-c", "a.cpp"], env)
 *
 * It acts only when the environment names a governor (HEADROOM_SOCKET) and a launcher
 * (HEADROOM_LAUNCHER), outside any job (no HEADROOM_JOB: nvcc's own cicc and gcc belong to
 * nvcc's job), and only for programs that exist, so a build that probes for a compiler sees
 * the same ENOENT as without headroom. Everything else goes straight to libc. If the launcher
 * cannot be run, the original exec runs: headroom never makes an exec fail.
 *
 * Programs that need no interceptor start without it in LD_PRELOAD, so they do not pay for
 * loading it: the launcher, and tools that never start another program (cp, mkdir, true…).
 *
 * A program started with an environment of its caller's making (`env -i make`, SCons, whose
 * compilers get only its own `ENV`) would lose the build's variables and the interceptor
 * with them, and every compiler below it would run ungoverned. So the interceptor keeps the
 * variables it was loaded with, and gives them back, with itself first in LD_PRELOAD, to an
 * exec whose environment has dropped them. Only the variables that lead to the governor
 * come back: what else the caller dropped stays dropped.
 *
 * It runs between vfork and exec, so it allocates nothing, takes no lock and resolves libc's
 * functions and keeps its variables once, when it is loaded. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler_names.h"
#include "preload.h"

#define EXPORT __attribute__((visibility("default")))

extern char **environ;

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execvpe_fn)(const char *, char *const[], char *const[]);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);

static execve_fn real_execve;
static execvpe_fn real_execvpe;
static spawn_fn real_posix_spawn;
static spawn_fn real_posix_spawnp;

/* The `NAME=value` entry of `name` in `env`, or NULL. */
static char *entry_of(char *const env[], const char *name) {
    size_t len = strlen(name);
    for (; env && *env; env++) {
        if (strncmp(*env, name, len) == 0 && (*env)[len] == '=') return *env;
    }
    return NULL;
}

/* The value of `name` in `env`, or NULL. */
static const char *lookup(char *const env[], const char *name) {
    const char *entry = entry_of(env, name);
    return entry ? entry + strlen(name) + 1 : NULL;
}

#define PRELOAD_PREFIX "LD_PRELOAD="

/* The variables that lead a build's processes to its governor: all that `Session::govern`
 * sets besides LD_PRELOAD and the build's parallelism (the integration test
 * `a_step_that_clears_its_environment_keeps_its_compilers_governed` holds the two lists
 * together). */
static const char *const SESSION_VARIABLES[] = {
    "HEADROOM_SOCKET",   "HEADROOM_LAUNCHER",     "HEADROOM_SESSION",
    "HEADROOM_SHIM_DIR", "HEADROOM_SESSION_FARM", "HEADROOM_JOB_TMPDIR",
};
#define SESSION_VARIABLE_COUNT (sizeof SESSION_VARIABLES / sizeof *SESSION_VARIABLES)

/* The build this process belongs to, as its environment said when the interceptor was
 * loaded: the `NAME=value` entries of the session's variables, and `LD_PRELOAD=` this
 * library. Empty outside a governed build and inside a job. */
static char *session[SESSION_VARIABLE_COUNT];
static size_t session_len;
static char *session_preload;

static void keep_session(void) {
    if (!lookup(environ, "HEADROOM_SOCKET") || lookup(environ, "HEADROOM_JOB")) return;
    Dl_info self;
    if (!dladdr((void *)keep_session, &self) || !self.dli_fname) return;
    session_preload = malloc(strlen(PRELOAD_PREFIX) + strlen(self.dli_fname) + 1);
    if (!session_preload) return;
    strcpy(stpcpy(session_preload, PRELOAD_PREFIX), self.dli_fname);
    for (size_t i = 0; i < SESSION_VARIABLE_COUNT; i++) {
        char *entry = entry_of(environ, SESSION_VARIABLES[i]);
        if (entry && (entry = strdup(entry))) session[session_len++] = entry;
    }
}

__attribute__((constructor)) static void on_load(void) {
    real_execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
    real_execvpe = (execvpe_fn)dlsym(RTLD_NEXT, "execvpe");
    real_posix_spawn = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
    real_posix_spawnp = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawnp");
    keep_session();
}

/* The launcher to run instead of a program named `name`, or NULL when it is to run as it
 * is: no governor, inside a job, or not a compiler. */
static const char *launcher_for(const char *name, char *const env[]) {
    if (!lookup(env, "HEADROOM_SOCKET") || lookup(env, "HEADROOM_JOB")) return NULL;
    const char *launcher = lookup(env, "HEADROOM_LAUNCHER");
    if (!launcher || !*launcher) return NULL;
    return headroom_is_compiler_name(name, strlen(name)) ? launcher : NULL;
}

/* Finds `file` on PATH as execvp does; writes the path into `out` and returns it, or NULL
 * when there is no such program. */
static const char *search_path(const char *file, char out[PATH_MAX]) {
    if (strchr(file, '/')) return access(file, X_OK) == 0 ? file : NULL;
    const char *path = lookup(environ, "PATH");
    if (!path) path = "/bin:/usr/bin";
    size_t file_len = strlen(file);
    while (1) {
        const char *end = strchrnul(path, ':');
        size_t dir_len = (size_t)(end - path);
        if (dir_len == 0) dir_len = 1, path = "."; /* an empty entry is the current directory */
        if (dir_len + 1 + file_len < PATH_MAX) {
            memcpy(out, path, dir_len);
            out[dir_len] = '/';
            memcpy(out + dir_len + 1, file, file_len + 1);
            if (access(out, X_OK) == 0) return out;
        }
        if (*end == '\0') return NULL;
        path = end + 1;
    }
}

static size_t count(char *const list[]) {
    size_t n = 0;
    while (list && list[n]) n++;
    return n;
}

/* ["headroom-launch", compiler, argv[1]…, NULL] into `out`, which holds count(argv) + 2. */
static char **launch_argv(const char *compiler, char *const argv[], size_t argc, char **out) {
    out[0] = (char *)"headroom-launch";
    out[1] = (char *)compiler;
    for (size_t i = 1; i < argc; i++) out[i + 1] = argv[i];
    out[argc + 1] = NULL;
    return out;
}

/* Whether `env` dropped the build this process belongs to. */
static int dropped_session(char *const env[]) {
    return session_len > 0 && !lookup(env, "HEADROOM_SOCKET");
}

/* `env` with the session's variables added, and this library first in its LD_PRELOAD (whose
 * value in `env` is `theirs`, or NULL), built in `out` (count of `env` + session_len + 2
 * pointers) and `preload` (room for `session_preload`, ':' and `theirs`). */
static char *const *with_session(char *const env[], const char *theirs, char **out,
                                 char *preload) {
    char *end = stpcpy(preload, session_preload);
    if (theirs && *theirs) stpcpy(stpcpy(end, ":"), theirs);
    size_t n = 0;
    for (; env && *env; env++) {
        if (strncmp(*env, PRELOAD_PREFIX, strlen(PRELOAD_PREFIX)) != 0) out[n++] = *env;
    }
    for (size_t i = 0; i < session_len; i++) out[n++] = session[i];
    out[n++] = preload;
    out[n] = NULL;
    return out;
}

/* `env` with headroom's interceptor taken out of its LD_PRELOAD `entry`, built in `out`
 * (count(env) + 1 pointers) and `new_entry` (strlen(entry) + 1 bytes). */
static char *const *without_interceptor(char *const env[], const char *entry, char **out,
                                        char *new_entry) {
    size_t prefix_len = strlen(PRELOAD_PREFIX);
    memcpy(new_entry, PRELOAD_PREFIX, prefix_len);
    size_t len = headroom_preload_without_interceptor(entry + prefix_len,
                                                      strlen(entry) - prefix_len,
                                                      new_entry + prefix_len);
    new_entry[prefix_len + len] = '\0';
    size_t n = 0;
    for (; *env; env++) {
        if (*env != entry) out[n++] = *env;
        else if (len > 0) out[n++] = new_entry;
    }
    out[n] = NULL;
    return out;
}

/* How the build asked to start a program. */
enum call { EXECVE, EXECVPE, SPAWN, SPAWNP };

/* Starts `file` as `call` asked, or a compiler through the launcher; a program that needs no
 * interceptor starts without it. `file` is looked up on PATH for EXECVPE and SPAWNP only. */
static int start(enum call call, pid_t *pid, const char *file,
                 const posix_spawn_file_actions_t *actions, const posix_spawnattr_t *attr,
                 char *const argv[], char *const given_envp[]) {
    int saved = errno;
    int restores = dropped_session(given_envp);
    const char *their_preload = restores ? lookup(given_envp, "LD_PRELOAD") : NULL;
    char *restored[restores ? count(given_envp) + session_len + 2 : 1];
    char restored_preload[restores ? strlen(session_preload) + 1 +
                                         (their_preload ? strlen(their_preload) : 0) + 1
                                   : 1];
    char *const *envp =
        restores ? with_session(given_envp, their_preload, restored, restored_preload) : given_envp;
    int searches_path = call == EXECVPE || call == SPAWNP;
    const char *slash = strrchr(file, '/');
    const char *name = slash ? slash + 1 : file;
    char found[PATH_MAX];
    const char *launcher = searches_path || slash ? launcher_for(name, envp) : NULL;
    const char *compiler = launcher && argv && argv[0] ? search_path(file, found) : NULL;

    const char *entry = compiler || headroom_starts_no_program(name, strlen(name))
                            ? entry_of(envp, "LD_PRELOAD") : NULL;
    char *env_without[entry ? count(envp) + 1 : 1];
    char entry_without[entry ? strlen(entry) + 1 : 1];
    char *const *env = entry ? without_interceptor(envp, entry, env_without, entry_without) : envp;

    if (compiler) {
        size_t argc = count(argv);
        char *launch[argc + 2];
        launch_argv(compiler, argv, argc, launch);
        if (call == SPAWN || call == SPAWNP) {
            if (real_posix_spawn(pid, launcher, actions, attr, launch, env) == 0) return 0;
        } else {
            real_execve(launcher, launch, env);
        }
    }
    errno = saved;
    switch (call) {
    case EXECVE: return real_execve(file, argv, env);
    case EXECVPE: return real_execvpe(file, argv, env);
    case SPAWN: return real_posix_spawn(pid, file, actions, attr, argv, env);
    case SPAWNP: return real_posix_spawnp(pid, file, actions, attr, argv, env);
    }
    return -1;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    return start(EXECVE, NULL, path, NULL, NULL, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[]) {
    return start(EXECVE, NULL, path, NULL, NULL, argv, environ);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    return start(EXECVPE, NULL, file, NULL, NULL, argv, envp);
}

EXPORT int execvp(const char *file, char *const argv[]) {
    return start(EXECVPE, NULL, file, NULL, NULL, argv, environ);
}

/* execl, execle and execlp: their arguments into an array, then the calls above. */
#define COLLECT_ARGS(first, args, argv, after_null)                   \
    size_t n = 1;                                                     \
    va_list args;                                                     \
    va_start(args, first);                                            \
    while (va_arg(args, char *)) n++;                                 \
    va_end(args);                                                     \
    char *argv[n + 1];                                                \
    argv[0] = (char *)first;                                          \
    va_start(args, first);                                            \
    for (size_t i = 1; i <= n; i++) argv[i] = va_arg(args, char *);   \
    after_null;                                                       \
    va_end(args)

EXPORT int execl(const char *path, const char *arg, ...) {
    COLLECT_ARGS(arg, args, argv, (void)0);
    return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...) {
    COLLECT_ARGS(arg, args, argv, (void)0);
    return execvp(file, argv);
}

EXPORT int execle(const char *path, const char *arg, ...) {
    char *const *envp;
    COLLECT_ARGS(arg, args, argv, envp = va_arg(args, char *const *));
    return execve(path, argv, envp);
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *actions,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    return start(SPAWN, pid, path, actions, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    return start(SPAWNP, pid, file, actions, attr, argv, envp);
}
