/* fork + exec (system()), and a forked child that touches its parent's paged memory.
 * Usage: fork_exec MODE where MODE is "exec" (prints the child's output, then "ok") or
 * "touch" (a child reads a large parent block; prints the child's status, then checks the
 * parent's block). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
  size_t n = 16 << 20;
  char *big = malloc(n);
  memset(big, 7, n);
  if (argc > 1 && strcmp(argv[1], "touch") == 0) {
    pid_t pid = fork();
    if (pid == 0) {
      /* memory the child allocates itself works */
      char *own = malloc(n);
      memset(own, 1, n);
      printf("child own memory ok\n");
      fflush(stdout);
      volatile char c = big[n / 2]; /* parent's paged memory */
      printf("child read %d\n", c);
      _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st)) printf("child signal %d\n", WTERMSIG(st));
    else printf("child exit %d\n", WEXITSTATUS(st));
    /* the parent's paged memory is untouched by the refused child */
    for (size_t i = 0; i < n; i++)
      if (big[i] != 7) { printf("parent data corrupt at %zu\n", i); return 1; }
    printf("parent data ok\n");
    return 0;
  }
  int rc = system("echo from-child; exit 4");
  printf("system returned %d\n", WEXITSTATUS(rc));
  for (size_t i = 0; i < n; i++)
    if (big[i] != 7) { printf("corrupt\n"); return 1; }
  printf("ok\n");
  return 0;
}
