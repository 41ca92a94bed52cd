/*
 * A small process tree for the harness tests:
 *   root ─┬─ child A ── grandchild A1
 *         └─ child B (+2 threads)
 * Prints "ROOT A A1 B\n" once everything runs, then every task sleeps until killed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int ready[2], pids[2];

static void *idle(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

static void report(void)
{
	int pid = getpid();
	if (write(ready[1], &pid, sizeof(pid)) != sizeof(pid))
		_exit(1);
}

int main(void)
{
	int a, b, a1 = 0, got[3], i;

	if (pipe(ready) || pipe(pids))
		return 1;
	a = fork();
	if (a == 0) {
		int g = fork();
		if (g == 0) {
			report();
			idle(NULL);
		}
		report();
		idle(NULL);
	}
	b = fork();
	if (b == 0) {
		pthread_t t1, t2;
		pthread_create(&t1, NULL, idle, NULL);
		pthread_create(&t2, NULL, idle, NULL);
		report();
		idle(NULL);
	}
	for (i = 0; i < 3; i++)
		if (read(ready[0], &got[i], sizeof(int)) != sizeof(int))
			return 1;
	for (i = 0; i < 3; i++)
		if (got[i] != a && got[i] != b)
			a1 = got[i];
	printf("%d %d %d %d\n", getpid(), a, a1, b);
	fflush(stdout);
	idle(NULL);
	return 0;
}
