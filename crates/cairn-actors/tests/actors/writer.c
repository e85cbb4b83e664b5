/* Rewrites /data/big forever: each generation is SIZE bytes of one letter,
   the letter after the one the file held when the actor started. Used by
   the host-SIGKILL test (tests/commit_kill.rs). */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define SIZE (4 << 20)

int main(void) {
    static char buf[65536];
    char g = 'a';
    int fd = open("/data/big", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, &g, 1) == 1) g = g == 'z' ? 'a' : g + 1;
        close(fd);
    }
    for (;;) {
        memset(buf, g, sizeof buf);
        fd = open("/data/big", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) return 1;
        for (int off = 0; off < SIZE;) {
            int want = SIZE - off < (int)sizeof buf ? SIZE - off : (int)sizeof buf;
            ssize_t n = write(fd, buf, want);
            if (n <= 0) return 2;
            off += n;
        }
        if (close(fd) < 0) return 3;
        g = g == 'z' ? 'a' : g + 1;
    }
}
