/* A file-system tool actor for the commit-on-close tests: one command per
   stdin line, one reply line per command ("ok ..." or "err NAME"). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fds[16];

static const char *ename(int e) {
    switch (e) {
    case ENOENT: return "ENOENT";
    case ELOOP: return "ELOOP";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EEXIST: return "EEXIST";
    case EISDIR: return "EISDIR";
    case ENOTDIR: return "ENOTDIR";
    case ENOTEMPTY: return "ENOTEMPTY";
    case EBADF: return "EBADF";
    case EINVAL: return "EINVAL";
    case ENOTSUP: return "ENOTSUP";
    default: return "OTHER";
    }
}

static void reply_err(void) { printf("err %s\n", ename(errno)); }

static int mode_flags(const char *m) {
    if (!strcmp(m, "w")) return O_WRONLY | O_CREAT | O_TRUNC;
    if (!strcmp(m, "wx")) return O_WRONLY | O_CREAT | O_EXCL;
    if (!strcmp(m, "a")) return O_WRONLY | O_CREAT | O_APPEND;
    if (!strcmp(m, "r+")) return O_RDWR;
    if (!strcmp(m, "c")) return O_WRONLY | O_CREAT;
    return O_RDONLY;
}

int main(void) {
    static char line[70000];
    for (int i = 0; i < 16; i++) fds[i] = -1;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *cmd = strtok(line, " ");
        if (!cmd) continue;
        char *a = strtok(NULL, " ");
        char *rest = strtok(NULL, "");
        if (!strcmp(cmd, "open")) { /* open SLOT MODE PATH */
            int s = atoi(a);
            char *m = strtok(rest, " ");
            char *p = strtok(NULL, "");
            int fd = open(p, mode_flags(m), 0644);
            if (fd < 0) reply_err(); else { fds[s] = fd; printf("ok\n"); }
        } else if (!strcmp(cmd, "write")) { /* write SLOT TEXT */
            const char *txt = rest ? rest : "";
            ssize_t n = write(fds[atoi(a)], txt, strlen(txt));
            if (n < 0) reply_err(); else printf("ok %zd\n", n);
        } else if (!strcmp(cmd, "read")) { /* read SLOT: the rest from its offset */
            char buf[4096];
            ssize_t n = read(fds[atoi(a)], buf, sizeof buf - 1);
            if (n < 0) reply_err(); else { buf[n] = 0; printf("ok %s\n", buf); }
        } else if (!strcmp(cmd, "close")) {
            int s = atoi(a);
            if (close(fds[s]) < 0) reply_err(); else { fds[s] = -1; printf("ok\n"); }
        } else if (!strcmp(cmd, "cat")) {
            int fd = open(a, O_RDONLY);
            if (fd < 0) { reply_err(); fflush(stdout); continue; }
            char buf[4096];
            ssize_t n = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (n < 0) reply_err(); else { buf[n] = 0; printf("ok %s\n", buf); }
        } else if (!strcmp(cmd, "ls")) {
            DIR *d = opendir(a);
            if (!d) { reply_err(); fflush(stdout); continue; }
            printf("ok");
            struct dirent *e;
            while ((e = readdir(d))) {
                if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) printf(" %s", e->d_name);
            }
            closedir(d);
            printf("\n");
        } else if (!strcmp(cmd, "stat")) {
            struct stat st;
            if (stat(a, &st) < 0) reply_err(); else printf("ok %lld\n", (long long)st.st_size);
        } else if (!strcmp(cmd, "unlink")) {
            if (unlink(a) < 0) reply_err(); else printf("ok\n");
        } else if (!strcmp(cmd, "mkdir")) {
            if (mkdir(a, 0755) < 0) reply_err(); else printf("ok\n");
        } else if (!strcmp(cmd, "rmdir")) {
            if (rmdir(a) < 0) reply_err(); else printf("ok\n");
        } else if (!strcmp(cmd, "rename")) {
            if (rename(a, rest) < 0) reply_err(); else printf("ok\n");
        } else if (!strcmp(cmd, "symlink")) {
            if (symlink(a, rest) < 0) reply_err(); else printf("ok\n");
        } else if (!strcmp(cmd, "trap")) {
            fflush(stdout);
            __builtin_trap();
        } else if (!strcmp(cmd, "exit")) {
            printf("bye\n");
            fflush(stdout);
            exit(atoi(a));
        } else if (!strcmp(cmd, "spin")) {
            printf("spinning\n");
            fflush(stdout);
            for (volatile int x = 0;; x++) {}
        } else {
            printf("err unknown-command\n");
        }
        fflush(stdout);
    }
    return 0;
}
