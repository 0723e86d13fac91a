/* The least a pty relay can do, for benches/bench.py's pty rows: runs argv[1..] on a new
 * pseudo-terminal (output post-processing and echo off, as oomguard's) and copies what it
 * prints to our stdout -- poll, then read and write until the master is empty, the
 * syscalls oomguard makes -- and nothing else: no scanning, no log. Its time over
 * `script` alone is the second terminal hop's, which any wrapper that gives the command a
 * terminal and reads its output pays.  cc -O2 -o pty_relay pty_relay.c */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m < 0 || grantpt(m) || unlockpt(m))
        return 1;
    int s = open(ptsname(m), O_RDWR | O_NOCTTY);
    if (s < 0)
        return 1;
    struct termios t;
    if (tcgetattr(s, &t) == 0) {
        t.c_oflag &= ~OPOST;
        t.c_lflag &= ~(ECHO | ECHOE | ECHOK | ECHONL);
        tcsetattr(s, TCSANOW, &t);
    }
    pid_t p = fork();
    if (p == 0) {
        setsid();
        dup2(s, 0);
        dup2(s, 1);
        dup2(s, 2);
        close(s);
        close(m);
        execvp(argv[1], argv + 1);
        _exit(127);
    }
    close(s);
    fcntl(m, F_SETFL, O_NONBLOCK);
    static char buf[64 * 1024];
    for (;;) {
        struct pollfd pf = {m, POLLIN, 0};
        if (poll(&pf, 1, -1) < 0 && errno != EINTR)
            break;
        ssize_t n;
        while ((n = read(m, buf, sizeof buf)) > 0)
            for (ssize_t off = 0; off < n;) {
                ssize_t w = write(1, buf + off, n - off);
                if (w <= 0)
                    return 1;
                off += w;
            }
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            break; /* EIO: the command and all its children closed the terminal */
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
