/* A tiny epoll echo-style server for preheat-observe's tests, built with -static: answers each
 * read ("ping\n") with "pong\n". Usage: epoll_server PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[1]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 64)) return 1;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    struct epoll_event out[16];
    char buf[4096];
    for (;;) {
        int n = epoll_wait(ep, out, 16, -1);
        for (int i = 0; i < n; i++) {
            int fd = out[i].data.fd;
            if (fd == ls) {
                int c;
                while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r <= 0) {
                close(fd);
                continue;
            }
            if (write(fd, "pong\n", 5) != 5) close(fd);
        }
    }
}
