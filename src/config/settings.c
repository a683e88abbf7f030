/* SPDX-License-Identifier: MIT */
/*
 * The row engine: reading a variable (NAME or NAME_FILE), parsing it by
 * the row's type and range, and reporting problems one line each.
 */
#include "settings.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#define SECOND SETTING_SECOND
#define MINUTE SETTING_MINUTE
#define HOUR SETTING_HOUR
#define DAY SETTING_DAY

/* Secrets and PEM bundles fit; anything larger is a wrong path. */
#define FILE_VALUE_MAX (1024 * 1024)

/* Printable, bounded and quoted so a problem stays on one line. */
static void put_value(FILE *f, const char *v)
{
	size_t n = 0;

	fputc('\'', f);
	for (; *v && n < 120; v++, n++) {
		unsigned char c = (unsigned char)*v;
		if (c == '\'' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			fprintf(f, "\\x%02x", c);
		else
			fputc(c, f);
	}
	fputs(*v ? "'..." : "'", f);
}

/*
 * One line: "config: NAME: what (got 'value')". A secret's value is never
 * printed; value NULL prints no suffix (the problem is not about it).
 */
void config_problem(struct config_loader *ld, const char *name, bool secret,
		    const char *value, const char *fmt, ...)
{
	va_list ap;

	ld->problems++;
	if (!ld->errs)
		return;
	fprintf(ld->errs, "config: %s: ", name);
	va_start(ap, fmt);
	vfprintf(ld->errs, fmt, ap);
	va_end(ap);
	if (value && secret) {
		fputs(" (value hidden)", ld->errs);
	} else if (value) {
		fputs(" (got ", ld->errs);
		put_value(ld->errs, value);
		fputc(')', ld->errs);
	}
	fputc('\n', ld->errs);
}

void loader_warn(struct config_loader *ld, const char *fmt, ...)
{
	char line[CONFIG_WARNINGS_MAX];
	size_t used;
	va_list ap;

	if (!ld->warnings)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	used = strlen(ld->warnings);
	/* Whole lines only: a warning that does not fit is dropped. */
	if (used + strlen(line) + 2 <= CONFIG_WARNINGS_MAX)
		snprintf(ld->warnings + used, CONFIG_WARNINGS_MAX - used,
			 "%s\n", line);
}

void config_free_secret(char *s, bool secret)
{
	if (s && secret)
		explicit_bzero(s, strlen(s));
	free(s);
}

static const char *file_kind(mode_t mode)
{
	if (S_ISDIR(mode))
		return "a directory";
	if (S_ISFIFO(mode))
		return "a FIFO";
	if (S_ISCHR(mode) || S_ISBLK(mode))
		return "a device";
	if (S_ISSOCK(mode))
		return "a socket";
	return "not a regular file";
}

/*
 * Opens path for reading when it is a regular file; NULL after reporting.
 * O_NONBLOCK, so opening a FIFO returns at once instead of waiting for a
 * writer (which hung startup), and fstat on what was opened, so nothing
 * can be swapped in between a check and the open. A file every user may
 * read is read, with a warning: a secret belongs in a file readable by
 * the relay's user or group only (mode 0600 or 0640).
 */
static FILE *open_regular(struct config_loader *ld, const char *fname,
			  const char *path)
{
	char msg[128];
	struct stat st;
	FILE *f;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);

	if (fd < 0) {
		config_problem(ld, fname, false, NULL, "cannot read '%s': %s",
			       path, strerror_r(errno, msg, sizeof(msg)));
		return NULL;
	}
	if (fstat(fd, &st) != 0) {
		config_problem(ld, fname, false, NULL, "cannot stat '%s': %s",
			       path, strerror_r(errno, msg, sizeof(msg)));
		close(fd);
		return NULL;
	}
	if (!S_ISREG(st.st_mode)) {
		config_problem(ld, fname, false, NULL,
			       "'%s' is %s: name a regular file", path,
			       file_kind(st.st_mode));
		close(fd);
		return NULL;
	}
	if (st.st_mode & S_IROTH)
		loader_warn(ld,
			    "%s: '%s' is readable by every user (mode %04o): "
			    "make it readable by the relay only (0600 or 0640)",
			    fname, path, (unsigned)(st.st_mode & 07777));
	f = fdopen(fd, "rb");
	if (!f) {
		config_problem(ld, fname, false, NULL, "cannot read '%s': %s",
			       path, strerror_r(errno, msg, sizeof(msg)));
		close(fd);
	}
	return f;
}

/*
 * Reads the value of the file named by NAME_FILE into *out. Returns 1,
 * or -1 after reporting a problem that names the variable and the path,
 * never the content.
 */
static int file_read(struct config_loader *ld, const char *fname,
		     const char *path, char **out)
{
	FILE *f = NULL;
	char *buf = NULL;
	size_t len = 0;
	char msg[128];
	int ret = -1;

	if (*path == '\0') {
		config_problem(ld, fname, false, NULL, "empty file path");
		goto out;
	}
	f = open_regular(ld, fname, path);
	if (!f)
		goto out;
	buf = malloc(FILE_VALUE_MAX + 2);
	if (!buf) {
		config_problem(ld, fname, false, NULL, "out of memory");
		goto out;
	}
	len = fread(buf, 1, FILE_VALUE_MAX + 1, f);
	if (ferror(f)) {
		config_problem(ld, fname, false, NULL, "cannot read '%s': %s",
			       path, strerror_r(errno, msg, sizeof(msg)));
		goto out;
	}
	if (len > FILE_VALUE_MAX) {
		config_problem(ld, fname, false, NULL,
			       "file '%s' is larger than %d bytes", path,
			       FILE_VALUE_MAX);
		goto out;
	}
	buf[len] = '\0';
	if (strlen(buf) != len) {
		config_problem(ld, fname, false, NULL,
			       "file '%s' contains a NUL byte", path);
		goto out;
	}
	/* Editors and `echo` add a newline; it is never part of a value. */
	if (len > 0 && buf[len - 1] == '\n') {
		buf[--len] = '\0';
		if (len > 0 && buf[len - 1] == '\r')
			buf[--len] = '\0';
	}
	/* Copied so a short value does not hold the whole read buffer. */
	*out = strndup(buf, len);
	if (!*out) {
		config_problem(ld, fname, false, NULL, "out of memory");
		goto out;
	}
	ret = 1;
out:
	if (buf)
		explicit_bzero(buf, len + 1);
	free(buf);
	if (f)
		fclose(f);
	return ret;
}

/*
 * Reads NAME, or the file named by NAME_FILE, into *out (caller frees).
 * Returns 1 when set, 2 when read from the file, 0 when neither is set,
 * -1 after reporting a problem.
 */
int config_env_read(struct config_loader *ld, const char *name, char **out)
{
	char fname[256];
	const char *direct, *path;

	*out = NULL;
	if ((size_t)snprintf(fname, sizeof(fname), "%s%s", name, FILE_SUFFIX) >=
	    sizeof(fname)) {
		config_problem(ld, name, false, NULL, "variable name too long");
		return -1;
	}
	direct = getenv(name);
	path = getenv(fname);
	if (direct && path) {
		config_problem(ld, name, false, NULL,
			       "both %s and %s are set; set only one", name,
			       fname);
		return -1;
	}
	if (path) {
		int rc = file_read(ld, fname, path, out);
		return rc > 0 ? 2 : rc;
	}
	if (!direct)
		return 0;
	*out = strdup(direct);
	if (!*out) {
		config_problem(ld, name, false, NULL, "out of memory");
		return -1;
	}
	return 1;
}

void config_format_duration(int64_t ms, char *buf, size_t len)
{
	static const struct {
		const char *unit;
		int64_t ms;
	} units[] = {{"d", DAY}, {"h", HOUR}, {"m", MINUTE}, {"s", SECOND}};

	if (ms != 0) {
		for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
			if (ms % units[i].ms == 0) {
				snprintf(buf, len, "%" PRId64 "%s",
					 ms / units[i].ms, units[i].unit);
				return;
			}
		}
	}
	snprintf(buf, len, "%" PRId64 "%s", ms, ms ? "ms" : "");
}

void config_format_size(int64_t bytes, char *buf, size_t len)
{
	static const struct {
		const char *unit;
		int64_t bytes;
	} units[] = {
	    {"GiB", SETTING_GIB}, {"MiB", SETTING_MIB}, {"KiB", SETTING_KIB}};

	for (size_t i = 0; bytes != 0 && i < ARRAY_SIZE(units); i++) {
		if (bytes % units[i].bytes == 0) {
			snprintf(buf, len, "%" PRId64 "%s",
				 bytes / units[i].bytes, units[i].unit);
			return;
		}
	}
	snprintf(buf, len, "%" PRId64 "B", bytes);
}

/* Whole decimal integer, nothing before or after it. */
int config_parse_int64(const char *s, int64_t *out, char *why, size_t whylen)
{
	const char *digits = s[0] == '-' ? s + 1 : s;
	char *end = NULL;
	long long n;

	if (!isdigit((unsigned char)digits[0])) {
		snprintf(why, whylen, "not a whole number");
		return -1;
	}
	errno = 0;
	n = strtoll(s, &end, 10);
	if (errno == ERANGE) {
		snprintf(why, whylen, "number out of range");
		return -1;
	}
	if (*end != '\0') {
		snprintf(why, whylen, "not a whole number");
		return -1;
	}
	*out = n;
	return 0;
}

/* A unit and what one of it is worth, in the smallest unit. */
struct unit {
	const char *name;
	int64_t scale;
};

/* A whole number directly followed by one of units: 1 when *out is set,
 * 0 when s is not of that form, -1 when the value overflows. */
static int parse_scaled(const char *s, const struct unit *units, size_t n_units,
			int64_t *out)
{
	char *end = NULL;
	if (!isdigit((unsigned char)s[0]))
		return 0;
	errno = 0;
	long long n = strtoll(s, &end, 10);
	for (size_t i = 0; i < n_units; i++) {
		if (strcmp(end, units[i].name) != 0)
			continue;
		if (errno == ERANGE || n > INT64_MAX / units[i].scale)
			return -1;
		*out = n * units[i].scale;
		return 1;
	}
	return 0;
}

static int parse_duration(const char *s, int64_t *ms, char *why, size_t whylen)
{
	static const struct unit units[] = {
	    {"ms", 1}, {"s", SECOND}, {"m", MINUTE}, {"h", HOUR}, {"d", DAY}};

	if (strcmp(s, "0") == 0) {
		*ms = 0;
		return 0;
	}
	int rc = parse_scaled(s, units, ARRAY_SIZE(units), ms);
	if (rc > 0)
		return 0;
	snprintf(why, whylen, "%s",
		 rc < 0 ? "duration too large"
			: "not a duration: a whole number with a unit ms, s, "
			  "m, h or d (500ms, 2s, 1m), or 0");
	return -1;
}

/* A whole number with a binary unit: 100B, 512KiB, 16MiB, 1GiB. */
static int parse_size(const char *s, int64_t *bytes, char *why, size_t whylen)
{
	static const struct unit units[] = {{"B", 1},
					    {"KiB", SETTING_KIB},
					    {"MiB", SETTING_MIB},
					    {"GiB", SETTING_GIB}};

	int rc = parse_scaled(s, units, ARRAY_SIZE(units), bytes);
	if (rc > 0)
		return 0;
	snprintf(why, whylen, "%s",
		 rc < 0 ? "size too large"
			: "not a size: a whole number with a unit B, KiB, MiB "
			  "or GiB (512KiB, 16MiB)");
	return -1;
}

static int parse_double(const char *s, double *out, char *why, size_t whylen)
{
	char *end = NULL;
	double d;

	/* strtod also takes "inf", "nan", hex and leading spaces: refuse. */
	if (!isdigit((unsigned char)s[0]) ||
	    s[strspn(s, "0123456789.eE+-")] != '\0')
		goto bad;
	errno = 0;
	d = strtod(s, &end);
	if (*end != '\0' || errno == ERANGE || !isfinite(d))
		goto bad;
	*out = d;
	return 0;
bad:
	snprintf(why, whylen, "not a number");
	return -1;
}

static int choice_index(const char *const *choices, const char *s)
{
	for (int i = 0; choices[i]; i++)
		if (strcmp(choices[i], s) == 0)
			return i;
	return -1;
}

static void choices_text(const char *const *choices, const char *sep, char *buf,
			 size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; choices[i] && used < len; i++) {
		int n = snprintf(buf + used, len - used, "%s%s", i ? sep : "",
				 choices[i]);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}

/* The constraint a value must meet, for errors, --help and the README. */
void setting_range(const struct setting *s, char *buf, size_t len)
{
	char lo[32], hi[32], list[128];

	switch (s->type) {
	case SET_WORD:
	case SET_ENUM:
		choices_text(s->choices, ", ", list, sizeof(list));
		snprintf(buf, len, "one of: %s", list);
		break;
	case SET_BOOL:
		snprintf(buf, len, "on, off, true or false");
		break;
	case SET_INT:
	case SET_DOUBLE:
		snprintf(buf, len, "%" PRId64 "..%" PRId64, s->min, s->max);
		break;
	case SET_DURATION:
		config_format_duration(s->min, lo, sizeof(lo));
		config_format_duration(s->max, hi, sizeof(hi));
		snprintf(buf, len, "%s%s..%s",
			 s->flags & SETTING_ZERO_OK ? "0 or " : "", lo, hi);
		break;
	case SET_SIZE:
		config_format_size(s->min, lo, sizeof(lo));
		config_format_size(s->max, hi, sizeof(hi));
		snprintf(buf, len, "%s..%s", lo, hi);
		break;
	case SET_STRING:
		buf[0] = '\0';
		break;
	}
}

/* Parses value into the string field at field (SET_STRING, SET_WORD). */
static int apply_string(const struct setting *s, const char *value,
			setting_check_fn *check, char **field, char *why,
			size_t whylen)
{
	const char *keep = value;
	char *copy;

	if (s->type == SET_STRING && check && check(value, why, whylen) != 0)
		return -1;
	if (s->type == SET_WORD) {
		int idx = choice_index(s->choices, value);
		if (idx < 0)
			return 1;
		keep = s->choices[idx];
	}
	copy = strdup(keep);
	if (!copy) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	*field = copy;
	return 0;
}

static int apply_enum(const struct setting *s, const char *value, void *field)
{
	int idx =
	    s->lookup ? s->lookup(value) : choice_index(s->choices, value);

	if (idx < 0)
		return 1;
	/* The enum's own type differs per row; only its size is checked
	 * (SETTING_ENUM_FIELD), so copy the bytes. */
	memcpy(field, &idx, sizeof(idx));
	return 0;
}

static int apply_bool(const char *value, bool *field)
{
	if (strcmp(value, "on") == 0 || strcmp(value, "true") == 0)
		*field = true;
	else if (strcmp(value, "off") == 0 || strcmp(value, "false") == 0)
		*field = false;
	else
		return 1;
	return 0;
}

/* SET_INT, SET_DOUBLE, SET_DURATION and SET_SIZE: parsed, then held to
 * the range. */
static int apply_number(const struct setting *s, const char *value, void *field,
			char *why, size_t whylen)
{
	int64_t n = 0;
	double d = 0;

	switch (s->type) {
	case SET_INT:
		if (config_parse_int64(value, &n, why, whylen) != 0)
			return -1;
		if (n < s->min || n > s->max)
			return 1;
		*(int *)field = (int)n;
		return 0;
	case SET_DOUBLE:
		if (parse_double(value, &d, why, whylen) != 0)
			return -1;
		if (d < (double)s->min || d > (double)s->max)
			return 1;
		*(double *)field = d;
		return 0;
	case SET_SIZE:
		if (parse_size(value, &n, why, whylen) != 0)
			return -1;
		if (n < s->min || n > s->max)
			return 1;
		*(int64_t *)field = n;
		return 0;
	default:
		if (parse_duration(value, &n, why, whylen) != 0)
			return -1;
		if (!(n == 0 && (s->flags & SETTING_ZERO_OK)) &&
		    (n < s->min || n > s->max))
			return 1;
		*(int64_t *)field = n;
		return 0;
	}
}

/* Why a value outside the row's range was refused. */
static void out_of_range(const struct setting *s, char *why, size_t whylen)
{
	char range[160];

	setting_range(s, range, sizeof(range));
	if (s->type == SET_WORD || s->type == SET_ENUM)
		snprintf(why, whylen, "unknown value; use %s", range);
	else if (s->type == SET_BOOL)
		snprintf(why, whylen, "not a boolean; use %s", range);
	else
		snprintf(why, whylen, "out of range; allowed %s", range);
}

/*
 * Parses value into the row's field of target, whose C type the row's
 * macro checked at compile time; on failure says why in why.
 */
static int setting_apply(const struct setting *s, const char *value,
			 setting_check_fn *check, void *target, char *why,
			 size_t whylen)
{
	void *field = (char *)target + s->offset;
	int rc;

	switch (s->type) {
	case SET_STRING:
	case SET_WORD:
		rc = apply_string(s, value, check, field, why, whylen);
		break;
	case SET_ENUM:
		rc = apply_enum(s, value, field);
		break;
	case SET_BOOL:
		rc = apply_bool(value, field);
		break;
	default:
		rc = apply_number(s, value, field, why, whylen);
		break;
	}
	/* 1: parsed, but not an allowed value. */
	if (rc > 0)
		out_of_range(s, why, whylen);
	return rc == 0 ? 0 : -1;
}

void setting_load(struct config_loader *ld, const struct setting *s,
		  setting_check_fn *check, void *target)
{
	bool secret = s->flags & SETTING_SECRET;
	const char *value;
	char why[256];
	char *raw = NULL;
	int rc;

	rc = config_env_read(ld, s->name, &raw);
	if (rc < 0)
		goto bad;
	/* A value from a file is the kind secrets are kept in: never echoed
	 * (a secret's file mapped to the wrong setting, say), and wiped. */
	if (rc == 2)
		secret = true;
	value = rc > 0 ? raw : s->def;
	if ((s->flags & SETTING_NULLABLE) && (!value || *value == '\0'))
		goto out;
	if (!value) {
		/* A row without default that cannot be NULL is required. */
		config_problem(ld, s->name, false, NULL, "must be set");
		goto bad;
	}
	if (setting_apply(s, value, check, target, why, sizeof(why)) == 0)
		goto out;
	config_problem(ld, s->name, secret, value, "%s", why);
bad:
	/* Row names are static: safe to keep until the load ends. */
	loader_mark_bad(ld, s->name);
out:
	config_free_secret(raw, secret);
}

void setting_free(const struct setting *s, void *target)
{
	char **field = (char **)((char *)target + s->offset);

	if (s->type == SET_STRING || s->type == SET_WORD)
		config_free_secret(*field, s->flags & SETTING_SECRET);
}

void loader_mark_bad(struct config_loader *ld, const char *name)
{
	if (ld->n_bad < LOADER_BAD_MAX)
		ld->bad[ld->n_bad++] = name;
}

bool config_loader_ok(const struct config_loader *ld, const char *name)
{
	for (size_t i = 0; i < ld->n_bad; i++)
		if (strcmp(ld->bad[i], name) == 0)
			return false;
	return true;
}

const char *config_list_item(const char *p, const char **item, size_t *len)
{
	const char *end = strchr(p, ',');
	size_t n = end ? (size_t)(end - p) : strlen(p);
	while (n > 0 && (*p == ' ' || *p == '\t'))
		p++, n--;
	while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
		n--;
	*item = p;
	*len = n;
	return end ? end + 1 : NULL;
}
