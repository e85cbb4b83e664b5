/* A hostile actor driven by its messages (issue 48's attacks). Every
   message whose body is a JSON string is a command; any other message is
   counted (`undeliverable` notes apart) and otherwise ignored.

     say LINE            writes LINE to stdout once (a message as it)
     repeat N LINE       writes LINE N times; "%d" in LINE becomes 0..N-1
     big N SIZE TO       writes N messages to TO, each a string body of
                         SIZE bytes
     spawn N PRE WASM    asks the broker to spawn PRE0..PREN-1 from WASM,
                         one at a time, each after the last one's answer
                         (retrying "compiling already" after a second);
                         stops at the first refusal and reports
                         {"spawned":k,"refused":"<reason>"}
     fds PATH            opens PATH again and again until refused:
                         {"fds":n,"errno":e}
     write PATH TEXT     writes TEXT to PATH: {"wrote":0} or errno
     sleep S             says {"sleeping":S}, sleeps S seconds (a host call)
     nap                 sleeps 20 ms, then counts as seen (a slow reader)
     count               {"seen":n,"undeliverable":u}: messages seen
                         that were not commands (or not known ones),
                         undeliverable notes
     ping ID             {"pong":"ID","seen":n}
*/
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The adapter that turns this WASI p1 module into a p2 component keeps
   its state (64 KiB) in this module's memory, taken from the module's
   `cabi_realloc` if it exports one, else by memory.grow. Debian's
   wasi-libc (2022) exports none, and its malloc, at its first call, takes
   every page from __heap_base to the memory's end as its own heap, the
   adapter's page included: the first large block (`big`) overwrote the
   adapter's state and its next call trapped (adapter "assertion failed",
   its canary, in fd_fdstat_get under printf's isatty). Exported, the
   adapter's state is a malloc block like any other. */
__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, size_t old_len, size_t align, size_t new_len) {
    (void)old_len;
    (void)align; /* malloc's blocks are 16-aligned, the adapter asks ≤ 8 */
    return realloc(old, new_len);
}

static char line[1 << 21];
static char cmd[1 << 21];
static long seen, undeliverable;

/* The string body of a message line, unescaped into cmd; 0 if none. */
static int body_string(const char *l) {
    const char *b = strstr(l, "\"body\":\"");
    if (!b) return 0;
    b += 8;
    size_t n = 0;
    while (*b && *b != '"') {
        if (*b == '\\' && b[1]) {
            b++;
            if (*b == 'n') { cmd[n++] = '\n'; b++; continue; }
        }
        cmd[n++] = *b++;
    }
    cmd[n] = 0;
    return 1;
}

static void out_repl(const char *fmt, int i) {
    const char *p = strstr(fmt, "%d");
    if (!p) { fputs(fmt, stdout); return; }
    fwrite(fmt, 1, (size_t)(p - fmt), stdout);
    printf("%d", i);
    fputs(p + 2, stdout);
}

/* Copies the "reason" string of a reply line into dst (escapes dropped). */
static void reason_of(const char *l, char *dst, size_t cap) {
    const char *r = strstr(l, "\"reason\":\"");
    size_t n = 0;
    if (r) {
        r += 10;
        while (*r && *r != '"' && n + 1 < cap) {
            if (*r == '\\') { r++; if (!*r) break; if (*r == '"') { dst[n++] = '\''; r++; continue; } }
            dst[n++] = *r++;
        }
    }
    dst[n] = 0;
}

static void spawn_kids(int count, const char *pre, const char *wasm) {
    static char reason[4096];
    int spawned = 0;
    reason[0] = 0;
    for (int i = 0; i < count; i++) {
        printf("{\"to\":\"broker\",\"id\":\"sp%d\",\"body\":{\"type\":\"spawn\",\"id\":\"%s%d\",\"wasm\":\"%s\"}}\n", i, pre, i, wasm);
        fflush(stdout);
        for (;;) {
            if (!fgets(line, sizeof line, stdin)) return;
            char tag[32];
            snprintf(tag, sizeof tag, "/sp%d\"", i);
            if (!strstr(line, "\"reply_to\":") || !strstr(line, tag)) { seen++; continue; }
            break;
        }
        if (strstr(line, "\"type\":\"ok\"")) { spawned++; continue; }
        reason_of(line, reason, sizeof reason);
        if (strstr(reason, "compiling already")) { sleep(1); i--; continue; }
        break;
    }
    printf("{\"body\":{\"spawned\":%d,\"refused\":\"%s\"}}\n", spawned, reason);
}

int main(void) {
    while (fgets(line, sizeof line, stdin)) {
        if (!body_string(line)) {
            if (strstr(line, "\"type\":\"undeliverable\"")) undeliverable++;
            else seen++;
            continue;
        }
        char *c = cmd;
        if (!strncmp(c, "say ", 4)) {
            puts(c + 4);
        } else if (!strncmp(c, "repeat ", 7)) {
            char *rest;
            long n = strtol(c + 7, &rest, 10);
            rest++;
            for (long i = 0; i < n; i++) { out_repl(rest, (int)i); putchar('\n'); }
        } else if (!strncmp(c, "big ", 4)) {
            char *rest;
            long n = strtol(c + 4, &rest, 10);
            long size = strtol(rest, &rest, 10);
            rest++;
            char *pad = malloc((size_t)size + 1);
            memset(pad, 'x', (size_t)size);
            pad[size] = 0;
            for (long i = 0; i < n; i++) printf("{\"to\":\"%s\",\"body\":\"%s\"}\n", rest, pad);
            free(pad);
        } else if (!strncmp(c, "spawn ", 6)) {
            char *rest;
            long n = strtol(c + 6, &rest, 10);
            char *pre = rest + 1;
            char *wasm = strchr(pre, ' ');
            if (wasm) { *wasm++ = 0; spawn_kids((int)n, pre, wasm); }
        } else if (!strncmp(c, "fds ", 4)) {
            long n = 0;
            int e = 0;
            for (;;) {
                int fd = open(c + 4, O_RDONLY);
                if (fd < 0) { e = errno; break; }
                if (++n >= 100000) break;
            }
            printf("{\"body\":{\"fds\":%ld,\"errno\":%d}}\n", n, e);
        } else if (!strncmp(c, "write ", 6)) {
            char *path = c + 6;
            char *text = strchr(path, ' ');
            if (text) *text++ = 0;
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            int e = 0;
            if (fd < 0) e = errno;
            else {
                if (write(fd, text ? text : "", text ? strlen(text) : 0) < 0) e = errno;
                if (close(fd) < 0 && !e) e = errno;
            }
            printf("{\"body\":{\"wrote\":%d}}\n", e);
        } else if (!strncmp(c, "sleep ", 6)) {
            printf("{\"body\":{\"sleeping\":%d}}\n", atoi(c + 6));
            fflush(stdout);
            sleep((unsigned)atoi(c + 6));
        } else if (!strcmp(c, "nap")) {
            usleep(20000);
            seen++;
        } else if (!strcmp(c, "count")) {
            printf("{\"body\":{\"seen\":%ld,\"undeliverable\":%ld}}\n", seen, undeliverable);
        } else if (!strncmp(c, "ping ", 5)) {
            printf("{\"body\":{\"pong\":\"%s\",\"seen\":%ld}}\n", c + 5, seen);
        } else {
            seen++;
        }
        fflush(stdout);
    }
    return 0;
}
