/*
 * The C-ABI surface of the emulated CRIU host, compiled once per host profile by build.rs and
 * linked into the matching `harness-engine-*` executable, which exports these symbols through a
 * dynamic list so plugins find them with dlsym(RTLD_DEFAULT, ...), as they do inside criu.
 *
 * Everything here is a thin forwarder to Rust (`harness_rs_*`, defined in src/ffi/host.rs); C is
 * only used because a C-variadic function (print_on_level) cannot be defined in stable Rust,
 * because the ELF size of the data symbols (cr_plugin_ctl, opts) must be fixed per profile, and
 * for close_fds, which plugins call in a forked child between fork() and exec(), where only
 * async-signal-safe code may run.
 *
 * Besides the plugin API, CRIU 4.1/4.2's C plugins link against a few CRIU and compel functions
 * (cuda_plugin.c: close_fds, compel_wait_task, parse_pid_status; amdgpu: find_unused_fd_pid);
 * every profile exports them, as Debian's criu 4.1.1 and 4.2.1 do.
 *
 * Profile macros (set by build.rs):
 *   HOST_HOOKS              CR_PLUGIN_HOOK__MAX of the emulated host (12, 13, 16, 17)
 *   HOST_OPTS_SIZE          sizeof(struct cr_options) of the emulated host (0x1f8, 0x200)
 *   HOST_INVENTORY_QUERY    1 when has_inventory_plugin() exists (proposed API)
 *   HOST_PLUGIN_OPTIONS     1 when criu_plugin_get_options() exists (merged after 4.2)
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#if !defined(HOST_HOOKS) || !defined(HOST_OPTS_SIZE)
#error "HOST_HOOKS and HOST_OPTS_SIZE must be defined by build.rs"
#endif

/* Forwarders implemented in Rust (src/ffi/host.rs). */
extern void harness_rs_log(unsigned int level, const char *msg, size_t len);
extern unsigned int harness_rs_loglevel(void);
extern int harness_rs_add_inventory_plugin(const char *name);
extern bool harness_rs_check_and_remove_inventory_plugin(const char *name, size_t n);
extern bool harness_rs_has_inventory_plugin(const char *name);
extern int harness_rs_check_inventory_plugins(void);
extern int harness_rs_get_image_dir(void);
extern int harness_rs_get_options(int *argc, char ***argv);
extern void harness_rs_set_interrupt_only_mode(void);
extern bool harness_rs_alarm_timeouted(void);
extern int harness_rs_img_streamer_open(const char *name, int flags);

struct seize_task_status; /* compel's; mirrored by abi::criu::SeizeTaskStatus */
typedef int (*get_status_fn)(int pid, struct seize_task_status *ss, void *data);
typedef void (*free_status_fn)(int pid, struct seize_task_status *ss, void *data);
extern int harness_rs_compel_wait_task(int pid, int ppid, get_status_fn get_status, free_status_fn free_status,
				       struct seize_task_status *ss, void *data);
extern int harness_rs_parse_pid_status(int pid, struct seize_task_status *ss, void *data);
extern int harness_rs_find_unused_fd_pid(int pid);

struct list_head {
	struct list_head *next, *prev;
};

/* CRIU's `struct cr_plugin_ctl { list_head head; list_head hook_chain[MAX]; }`: plugins read only
 * its ELF st_size (16 * (MAX + 1)) to learn the host's hook count. */
struct cr_plugin_ctl {
	struct list_head head;
	struct list_head hook_chain[HOST_HOOKS];
};
struct cr_plugin_ctl cr_plugin_ctl = { .head = { &cr_plugin_ctl.head, &cr_plugin_ctl.head } };

/* `struct cr_options opts`: 0x1f8 bytes on x86_64 in 4.1.1, 0x200 from 4.2 on (allow_uprobes moved
 * stream). The harness fills only the offsets plugins may rely on: final_state (+0), timeout
 * (+0x160), stream (+0x194 / +0x198). */
unsigned char opts[HOST_OPTS_SIZE] __attribute__((aligned(16)));

/* Set from CRIU_FAULT, as fault_injection_init() does. */
int fi_strategy;

void print_on_level(unsigned int loglevel, const char *format, ...)
{
	int saved_errno = errno;
	char stack_buf[1024];
	char *buf = stack_buf;
	va_list args, copy;
	int n;

	if (loglevel != 0 && loglevel > harness_rs_loglevel()) {
		errno = saved_errno;
		return;
	}

	va_start(args, format);
	va_copy(copy, args);
	n = vsnprintf(stack_buf, sizeof(stack_buf), format, args);
	va_end(args);
	if (n >= (int)sizeof(stack_buf)) {
		buf = malloc((size_t)n + 1);
		if (buf)
			vsnprintf(buf, (size_t)n + 1, format, copy);
		else {
			buf = stack_buf;
			n = sizeof(stack_buf) - 1;
		}
	}
	va_end(copy);
	if (n > 0)
		harness_rs_log(loglevel, buf, (size_t)n);
	if (buf != stack_buf)
		free(buf);
	errno = saved_errno;
}

unsigned int log_get_loglevel(void)
{
	return harness_rs_loglevel();
}

int add_inventory_plugin(const char *name)
{
	return harness_rs_add_inventory_plugin(name);
}

/* One symbol serves both ABIs: CRIU 4.1 rules use the (name, n) strncmp prefix match; the newer
 * rules ignore `n` (garbage when a one-argument caller is linked) and match exactly. */
bool check_and_remove_inventory_plugin(const char *name, size_t n)
{
	return harness_rs_check_and_remove_inventory_plugin(name, n);
}

#if HOST_INVENTORY_QUERY
bool has_inventory_plugin(const char *name)
{
	return harness_rs_has_inventory_plugin(name);
}
#endif

int check_inventory_plugins(void)
{
	return harness_rs_check_inventory_plugins();
}

int criu_get_image_dir(void)
{
	return harness_rs_get_image_dir();
}

#if HOST_PLUGIN_OPTIONS
int criu_plugin_get_options(int *argc, char ***argv)
{
	return harness_rs_get_options(argc, argv);
}
#endif

void set_compel_interrupt_only_mode(void)
{
	harness_rs_set_interrupt_only_mode();
}

bool alarm_timeouted(void)
{
	return harness_rs_alarm_timeouted();
}

int img_streamer_open(char *filename, int flags)
{
	return harness_rs_img_streamer_open(filename, flags);
}

/* compel: wait for a task this thread traces to stop (after PTRACE_SEIZE or PTRACE_INTERRUPT). */
int compel_wait_task(int pid, int ppid, get_status_fn get_status, free_status_fn free_status,
		     struct seize_task_status *ss, void *data)
{
	return harness_rs_compel_wait_task(pid, ppid, get_status, free_status, ss, data);
}

/* CRIU: fill the struct proc_status_creds that `ss` is the first member of from /proc/PID/status. */
int parse_pid_status(int pid, struct seize_task_status *ss, void *data)
{
	return harness_rs_parse_pid_status(pid, ss, data);
}

/* CRIU (amdgpu's RESTORE_EXT_FILE): a descriptor number task `pid` does not use. */
int find_unused_fd_pid(int pid)
{
	return harness_rs_find_unused_fd_pid(pid);
}

/* CRIU: close every descriptor from `minfd` on. Called between fork() and exec(), so nothing
 * here may allocate or lock: close_range(2) where the kernel has it (as CRIU prefers), else
 * every descriptor below the soft RLIMIT_NOFILE. Returns 0, or -1 with errno set. */
int close_fds(int minfd)
{
	struct rlimit rl;
	long fd;

	if (minfd < 0) {
		errno = EINVAL;
		return -1;
	}
#ifdef SYS_close_range
	if (syscall(SYS_close_range, (unsigned int)minfd, ~0U, 0U) == 0)
		return 0;
	if (errno != ENOSYS)
		return -1;
#endif
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return -1;
	for (fd = minfd; fd < (long)rl.rlim_cur; fd++)
		close((int)fd);
	return 0;
}
