/*
 * A scriptable CRIU test plugin, compiled by the harness tests with
 *   cc -shared -fPIC -DTP_NAME='"a"' [-DTP_MAX_HOOKS=N] [-DTP_VERSION=V] [-DTP_NO_CLAMP]
 *      [-DTP_NO_DESC] [-DTP_LEGACY_INIT] [-DTP_META] testplugin.c -o X.so
 *
 * Every event (init, exit and each device hook) appends lines to the file named by $TP_LOG and
 * then runs the comma-separated action list in $TP_<NAME>_<EVENT> (EVENT one of init exit pause
 * checkpoint resume dlate dfinish rinit postfork):
 *   ret=N           return N (default 0)
 *   retat=K:N       return N on the K-th call of this event (1-based)
 *   add=X           add_inventory_plugin(X)
 *   check=X         check_and_remove_inventory_plugin(X, strlen(X))
 *   has=X           has_inventory_plugin(X) when the host exports it ("absent" otherwise)
 *   opts            log the criu_plugin_get_options() vector ("absent" when not exported)
 *   permute         swap argv[1] and argv[2] of the vector (a getopt_long-like permutation)
 *   swrite=N:DATA   img_streamer_open(N, O_WRONLY|O_CREAT|O_TRUNC), write DATA
 *   sread=N         img_streamer_open(N, O_RDONLY), read it all
 *   sseek=N         img_streamer_open(N, O_RDONLY), try lseek (a pipe: ESPIPE)
 *   fwrite=N:DATA   openat(criu_get_image_dir(), N, O_WRONLY|O_CREAT|O_TRUNC)
 *   fread=N         openat(criu_get_image_dir(), N, O_RDONLY), read it all
 *   state           log State and TracerPid of the hook's pid
 *   host            log opts.final_state, opts.timeout, fi_strategy, the cr_plugin_ctl size
 *   null            (init) clear every hook slot: the plugin opts out of dispatch
 *   interrupt       set_compel_interrupt_only_mode()
 *   sleep=MS        sleep
 *   alarmed         log alarm_timeouted()
 *   abort           abort()
 *   runthread       (pid hooks) PTRACE_CONT the hook task's last thread, let it run 100 ms, log
 *                   whether it really ran (no stop reported, not in a stop state), stop it again
 *   compelwait      (pid hooks) as CRIU 4.1's cuda_plugin.c does with a restore thread: PTRACE_CONT
 *                   the task's last thread, then PTRACE_INTERRUPT it and stop it with
 *                   compel_wait_task(tid, -1, parse_pid_status, NULL, &creds.s, NULL); log the
 *                   result, the state and whether the credentials were filled
 *   closefds        fork a child that opens a descriptor above 2, calls close_fds(3) and exits 0
 *                   only if every descriptor above 2 is closed; log whether it did
 *   unusedfd        log whether find_unused_fd_pid(pid) is a descriptor the task does not use
 * The constructor clamps max_hooks to the host's hook count (unless TP_NO_CLAMP) and applies
 * $TP_<NAME>_MAXHOOKS / $TP_<NAME>_VERSION overrides.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TP_NAME
#define TP_NAME "tp"
#endif
#ifndef TP_MAX_HOOKS
#define TP_MAX_HOOKS 17
#endif
#ifndef TP_VERSION
#define TP_VERSION 0x200
#endif

typedef struct {
	const char *name;
	int (*init)(int stage);
	void (*exit)(int stage, int ret);
	unsigned int version;
	unsigned int max_hooks;
	void *hooks[17];
} cr_plugin_desc_t;

static void tp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tp_log(const char *fmt, ...)
{
	const char *path = getenv("TP_LOG");
	char buf[4096];
	va_list ap;
	int n, fd;

	if (!path)
		return;
	n = snprintf(buf, sizeof(buf), "%s ", TP_NAME);
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - n - 2, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	buf[n++] = '\n';
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd < 0)
		return;
	if (write(fd, buf, n) < 0) {
	}
	close(fd);
}

static void *host_sym(const char *name)
{
	return dlsym(RTLD_DEFAULT, name);
}

static long sym_size(const char *name)
{
	void *p = host_sym(name);
	Dl_info info;
	const ElfW(Sym) *sym = NULL;

	if (!p || !dladdr1(p, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym)
		return -1;
	return (long)sym->st_size;
}

static int calls[16];

static void read_fd_all(int fd, char *out, size_t cap)
{
	size_t n = 0;
	ssize_t r;

	while (n + 1 < cap && (r = read(fd, out + n, cap - 1 - n)) > 0)
		n += r;
	out[n] = 0;
}

static int run_actions(const char *event, int ev_idx, int pid, int ret)
{
	char var[128], *spec, *tok, *save;
	const char *e;
	int k = ++calls[ev_idx];

	snprintf(var, sizeof(var), "TP_%s_%s", TP_NAME, event);
	e = getenv(var);
	if (!e)
		return ret;
	spec = strdup(e);
	for (tok = strtok_r(spec, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *arg = strchr(tok, '=');
		if (arg)
			*arg++ = 0;
		if (!strcmp(tok, "ret")) {
			ret = atoi(arg);
		} else if (!strcmp(tok, "retat")) {
			char *colon = strchr(arg, ':');
			if (colon && atoi(arg) == k)
				ret = atoi(colon + 1);
		} else if (!strcmp(tok, "add")) {
			int (*f)(const char *) = host_sym("add_inventory_plugin");
			tp_log("add %s = %d", arg, f ? f(arg) : -999);
		} else if (!strcmp(tok, "check")) {
			bool (*f)(const char *, size_t) = host_sym("check_and_remove_inventory_plugin");
			tp_log("check %s = %d", arg, f ? (int)f(arg, strlen(arg)) : -999);
		} else if (!strcmp(tok, "has")) {
			bool (*f)(const char *) = host_sym("has_inventory_plugin");
			if (f)
				tp_log("has %s = %d", arg, (int)f(arg));
			else
				tp_log("has %s = absent", arg);
		} else if (!strcmp(tok, "opts") || !strcmp(tok, "permute")) {
			int (*f)(int *, char ***) = host_sym("criu_plugin_get_options");
			int argc = -1, i, r;
			char **argv = NULL, line[2048];
			size_t n = 0;
			if (!f) {
				tp_log("opts absent");
				continue;
			}
			r = f(&argc, &argv);
			if (!strcmp(tok, "permute")) {
				if (argc >= 3) {
					char *t = argv[1];
					argv[1] = argv[2];
					argv[2] = t;
				}
				continue;
			}
			line[0] = 0;
			for (i = 0; i < argc && n < sizeof(line) - 64; i++)
				n += snprintf(line + n, sizeof(line) - n, " [%s]", argv[i]);
			tp_log("opts ret=%d argc=%d%s null=%d", r, argc, line, argv && argv[argc] == NULL);
		} else if (!strcmp(tok, "swrite") || !strcmp(tok, "fwrite")) {
			char *data = strchr(arg, ':');
			int fd;
			if (data)
				*data++ = 0;
			if (tok[0] == 's') {
				int (*f)(char *, int) = host_sym("img_streamer_open");
				fd = f ? f(arg, O_WRONLY | O_CREAT | O_TRUNC) : -999;
			} else {
				int (*d)(void) = host_sym("criu_get_image_dir");
				fd = openat(d(), arg, O_WRONLY | O_CREAT | O_TRUNC, 0600);
				if (fd < 0)
					fd = -errno;
			}
			if (fd >= 0) {
				if (data && write(fd, data, strlen(data)) < 0)
					tp_log("%s %s write failed", tok, arg);
				close(fd);
				tp_log("%s %s = ok", tok, arg);
			} else {
				tp_log("%s %s = %d", tok, arg, fd);
			}
		} else if (!strcmp(tok, "sread") || !strcmp(tok, "fread") || !strcmp(tok, "sseek")) {
			char buf[1024];
			int fd;
			if (tok[0] == 's') {
				int (*f)(char *, int) = host_sym("img_streamer_open");
				fd = f ? f(arg, O_RDONLY) : -999;
			} else {
				int (*d)(void) = host_sym("criu_get_image_dir");
				fd = openat(d(), arg, O_RDONLY);
				if (fd < 0)
					fd = -errno;
			}
			if (fd < 0) {
				tp_log("%s %s = %d", tok, arg, fd);
				continue;
			}
			if (!strcmp(tok, "sseek")) {
				off_t o = lseek(fd, 0, SEEK_END);
				tp_log("sseek %s = %d", arg, o < 0 ? -errno : 0);
			}
			read_fd_all(fd, buf, sizeof(buf));
			close(fd);
			tp_log("%s %s = '%s'", tok, arg, buf);
		} else if (!strcmp(tok, "state")) {
			char path[64], buf[4096], *s, *t;
			int fd;
			snprintf(path, sizeof(path), "/proc/%d/status", pid);
			fd = open(path, O_RDONLY);
			if (fd < 0) {
				tp_log("state %d = gone", pid);
				continue;
			}
			read_fd_all(fd, buf, sizeof(buf));
			close(fd);
			s = strstr(buf, "State:");
			t = strstr(buf, "TracerPid:");
			tp_log("state %c traced=%d", s ? s[7] : '?', t ? atoi(t + 10) != 0 : -1);
		} else if (!strcmp(tok, "host")) {
			unsigned char *o = host_sym("opts");
			int *fi = host_sym("fi_strategy");
			tp_log("host final_state=%d timeout=%u fi=%d ctl=%ld imgdir=%d",
			       o ? *(int *)o : -1, o ? *(unsigned *)(o + 0x160) : 0, fi ? *fi : -1,
			       sym_size("cr_plugin_ctl"),
			       host_sym("criu_get_image_dir") ? ((int (*)(void))host_sym("criu_get_image_dir"))() >= 0 : -1);
		} else if (!strcmp(tok, "interrupt")) {
			void (*f)(void) = host_sym("set_compel_interrupt_only_mode");
			if (f)
				f();
		} else if (!strcmp(tok, "alarmed")) {
			bool (*f)(void) = host_sym("alarm_timeouted");
			tp_log("alarmed = %d", f ? (int)f() : -1);
		} else if (!strcmp(tok, "sleep")) {
			usleep(atoi(arg) * 1000);
		} else if (!strcmp(tok, "runthread")) {
			char path[96], buf[4096], *s;
			int tid = 0, st = 0, fd, stopped, state;
			struct dirent *d;
			DIR *dir;
			snprintf(path, sizeof(path), "/proc/%d/task", pid);
			dir = opendir(path);
			while (dir && (d = readdir(dir)))
				if (atoi(d->d_name) > tid)
					tid = atoi(d->d_name);
			if (dir)
				closedir(dir);
			if (ptrace(PTRACE_CONT, tid, 0, 0)) {
				tp_log("runthread %d cont failed errno=%d", tid == pid, errno);
				continue;
			}
			usleep(100 * 1000);
			stopped = waitpid(tid, &st, __WALL | WNOHANG) == tid;
			snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", pid, tid);
			fd = open(path, O_RDONLY);
			buf[0] = 0;
			if (fd >= 0) {
				read_fd_all(fd, buf, sizeof(buf));
				close(fd);
			}
			s = strrchr(buf, ')');
			state = s ? s[2] : '?';
			tp_log("runthread ran=%d", !stopped && state != 't' && state != 'T');
			if (!stopped) {
				ptrace(PTRACE_INTERRUPT, tid, 0, 0);
				waitpid(tid, &st, __WALL);
			}
		} else if (!strcmp(tok, "compelwait")) {
			/* struct proc_status_creds: a 40-byte seize_task_status, then uids, gids, ... */
			int (*wait_task)(int, int, void *, void *, void *, void *) = host_sym("compel_wait_task");
			void *parse = host_sym("parse_pid_status");
			unsigned long long creds[15];
			unsigned int *uids = (unsigned int *)((char *)creds + 40);
			char path[96];
			int tid = 0, r;
			struct dirent *d;
			DIR *dir;
			if (!wait_task || !parse) {
				tp_log("compelwait absent");
				continue;
			}
			snprintf(path, sizeof(path), "/proc/%d/task", pid);
			dir = opendir(path);
			while (dir && (d = readdir(dir)))
				if (atoi(d->d_name) > tid)
					tid = atoi(d->d_name);
			if (dir)
				closedir(dir);
			memset(creds, 0, sizeof(creds));
			uids[0] = 12345;
			if (ptrace(PTRACE_CONT, tid, 0, 0) || ptrace(PTRACE_INTERRUPT, tid, 0, 0)) {
				tp_log("compelwait ptrace failed errno=%d", errno);
				continue;
			}
			r = wait_task(tid, -1, parse, NULL, creds, NULL);
			tp_log("compelwait ret=%d state=%c uid=%d", r, ((char *)creds)[24],
			       uids[0] == (unsigned int)getuid());
		} else if (!strcmp(tok, "closefds")) {
			int (*close_fds)(int) = host_sym("close_fds");
			int st = -1, child;
			if (!close_fds) {
				tp_log("closefds absent");
				continue;
			}
			child = fork();
			if (child == 0) {
				int fd = open("/dev/null", O_RDONLY), i;
				if (fd < 3 || dup2(fd, 100) != 100 || close_fds(3) != 0)
					_exit(2);
				for (i = 3; i < 1024; i++)
					if (fcntl(i, F_GETFD) != -1)
						_exit(1);
				_exit(0);
			}
			waitpid(child, &st, 0);
			tp_log("closefds ok=%d", WIFEXITED(st) && WEXITSTATUS(st) == 0);
		} else if (!strcmp(tok, "unusedfd")) {
			int (*f)(int) = host_sym("find_unused_fd_pid");
			char path[96];
			int fd;
			if (!f) {
				tp_log("unusedfd absent");
				continue;
			}
			fd = f(pid);
			snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
			tp_log("unusedfd free=%d", fd > 2 && access(path, F_OK) != 0);
		} else if (!strcmp(tok, "abort")) {
			abort();
		}
	}
	free(spec);
	return ret;
}

#ifndef TP_NO_DESC
cr_plugin_desc_t CR_PLUGIN_DESC;
#define DESC (&CR_PLUGIN_DESC)
#endif

static int tp_init(int stage)
{
	int ret = run_actions("init", 0, 0, 0);
	char var[128];
	const char *e;

	snprintf(var, sizeof(var), "TP_%s_init", TP_NAME);
	e = getenv(var);
#ifdef DESC
	if (e && strstr(e, "null"))
		memset(DESC->hooks, 0, sizeof(DESC->hooks));
#else
	(void)e;
#endif
	tp_log("init stage=%d -> %d", stage, ret);
	return ret;
}

static void tp_exit(int stage, int ret)
{
	run_actions("exit", 1, 0, 0);
	tp_log("exit stage=%d ret=%d", stage, ret);
}

#define PID_HOOK(fn, ev, idx, label)                                  \
	static int fn(int pid)                                        \
	{                                                             \
		int r = run_actions(ev, idx, pid, 0);                 \
		tp_log(label " %d -> %d", pid, r);                    \
		return r;                                             \
	}
PID_HOOK(tp_pause, "pause", 2, "PAUSE_DEVICES")
PID_HOOK(tp_checkpoint, "checkpoint", 3, "CHECKPOINT_DEVICES")
PID_HOOK(tp_resume, "resume", 4, "RESUME_DEVICES_LATE")
PID_HOOK(tp_dlate, "dlate", 5, "DUMP_DEVICES_LATE")
PID_HOOK(tp_dfinish, "dfinish", 6, "DUMP_FINISH")

static int tp_rinit(void)
{
	int r = run_actions("rinit", 7, 0, 0);
	tp_log("RESTORE_INIT -> %d", r);
	return r;
}

static int tp_postfork(void)
{
	int r = run_actions("postfork", 8, 0, 0);
	tp_log("POST_FORKING -> %d", r);
	return r;
}

#ifdef DESC
cr_plugin_desc_t CR_PLUGIN_DESC = {
	.name = TP_NAME,
	.init = tp_init,
	.exit = tp_exit,
	.version = TP_VERSION,
	.max_hooks = TP_MAX_HOOKS,
	.hooks = {
		[9] = tp_resume,
		[10] = tp_pause,
		[11] = tp_checkpoint,
		[12] = tp_postfork,
		[13] = tp_rinit,
		[14] = tp_dlate,
		[16] = tp_dfinish,
	},
};

__attribute__((constructor)) static void tp_ctor(void)
{
	char var[128];
	const char *e;
#ifndef TP_NO_CLAMP
	long size = sym_size("cr_plugin_ctl");
	if (size >= 32 && size / 16 - 1 < (long)DESC->max_hooks)
		DESC->max_hooks = size / 16 - 1;
#endif
	snprintf(var, sizeof(var), "TP_%s_MAXHOOKS", TP_NAME);
	if ((e = getenv(var)))
		DESC->max_hooks = atoi(e);
	snprintf(var, sizeof(var), "TP_%s_VERSION", TP_NAME);
	if ((e = getenv(var)))
		DESC->version = strtoul(e, NULL, 0);
	tp_log("ctor max_hooks=%u", DESC->max_hooks);
}
#else
#ifdef TP_LEGACY_INIT
int cr_plugin_init(int stage)
{
	return tp_init(stage);
}
void cr_plugin_fini(int stage, int ret)
{
	tp_exit(stage, ret);
}
int cr_plugin_pause_devices(int pid)
{
	return tp_pause(pid);
}
#endif
int tp_unused_keep(void);
int tp_unused_keep(void)
{
	return tp_checkpoint(0) + tp_resume(0) + tp_dlate(0) + tp_dfinish(0) + tp_rinit() + tp_postfork();
}
#endif

#ifdef TP_META
struct cr_plugin_option_meta {
	const char *name, *value_syntax, *default_value, *help;
};
struct cr_plugin_options_meta {
	unsigned int version, count;
	const struct cr_plugin_option_meta *options;
};
static const struct cr_plugin_option_meta tp_opts[] = {
	{ "backend", "auto|driver-api|cuda-checkpoint", "auto", "which backend checkpoints the GPU" },
	{ "verbose", NULL, NULL, NULL },
};
const struct cr_plugin_options_meta CR_PLUGIN_OPTIONS_META = {
#ifdef TP_META_VERSION
	TP_META_VERSION,
#else
	1,
#endif
	2, tp_opts
};
#endif
