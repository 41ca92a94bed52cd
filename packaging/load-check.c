/*
 * load-check: loads a CRIU plugin the way CRIU does, with dlopen(), and reads what CRIU and
 * tools read from it, without calling any of its functions (loading runs its constructors
 * only). scripts/check-dist-load.sh builds it with Zig for glibc 2.17 and runs it under old
 * glibc releases (and under qemu-user for aarch64).
 *
 * Usage: load-check PLUGIN.so NAME
 *
 * Prints the glibc it runs on, the descriptor (CR_PLUGIN_DESC) and the declared options
 * (CR_PLUGIN_OPTIONS_META). Exits 0 when the plugin loads with every symbol bound (RTLD_NOW),
 * its descriptor is named NAME, and its option metadata has a known version; 1 otherwise.
 */
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <stdio.h>
#include <string.h>

/* CRIU's cr_plugin_desc_t (criu/include/criu-plugin.h), up to the hook table. */
struct plugin_desc {
	const char *name;
	int (*init)(int stage);
	void (*exit)(int stage, int ret);
	unsigned int version;
	unsigned int max_hooks;
};

/* The option metadata this project's plugin publishes (docs/plugin-interface.md). */
struct option_meta {
	const char *name;
	const char *value_syntax;
	const char *default_value;
	const char *help;
};

struct options_meta {
	unsigned int version;
	unsigned int count;
	const struct option_meta *options;
};

#define OPTIONS_META_VERSION 1u
#define MAX_OPTIONS 256u

static const char *or_none(const char *s)
{
	return s ? s : "-";
}

int main(int argc, char **argv)
{
	const struct plugin_desc *desc;
	const struct options_meta *meta;
	void *handle;
	unsigned int i;

	if (argc != 3) {
		fprintf(stderr, "usage: %s PLUGIN.so NAME\n", argv[0]);
		return 2;
	}
	printf("load-check: glibc %s (%s)\n", gnu_get_libc_version(), gnu_get_libc_release());

	/* RTLD_NOW: every symbol the plugin needs must bind in this glibc now. */
	handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		fprintf(stderr, "load-check: dlopen(%s) failed: %s\n", argv[1], dlerror());
		return 1;
	}

	desc = dlsym(handle, "CR_PLUGIN_DESC");
	if (!desc) {
		fprintf(stderr, "load-check: %s has no CR_PLUGIN_DESC: %s\n", argv[1], dlerror());
		return 1;
	}
	if (!desc->name || strcmp(desc->name, argv[2]) != 0) {
		fprintf(stderr, "load-check: CR_PLUGIN_DESC is named '%s', not '%s'\n",
			or_none(desc->name), argv[2]);
		return 1;
	}
	printf("load-check: CR_PLUGIN_DESC: name %s, plugin ABI %u.%u.%u, max_hooks %u, init %s, exit %s\n",
	       desc->name, (desc->version >> 16) & 0xff, (desc->version >> 8) & 0xff,
	       desc->version & 0xff, desc->max_hooks, desc->init ? "set" : "none",
	       desc->exit ? "set" : "none");

	meta = dlsym(handle, "CR_PLUGIN_OPTIONS_META");
	if (!meta) {
		fprintf(stderr, "load-check: %s has no CR_PLUGIN_OPTIONS_META: %s\n", argv[1], dlerror());
		return 1;
	}
	if (meta->version != OPTIONS_META_VERSION || meta->count > MAX_OPTIONS ||
	    (meta->count && !meta->options)) {
		fprintf(stderr, "load-check: CR_PLUGIN_OPTIONS_META has version %u and %u entries (want version %u, at most %u)\n",
			meta->version, meta->count, OPTIONS_META_VERSION, MAX_OPTIONS);
		return 1;
	}
	for (i = 0; i < meta->count; i++) {
		const struct option_meta *o = &meta->options[i];

		printf("load-check: option %s.%s=%s (default %s)\n", desc->name, or_none(o->name),
		       or_none(o->value_syntax), or_none(o->default_value));
	}
	printf("load-check: ok\n");
	return 0;
}
