/* SPDX-License-Identifier: MIT */
/* The settings reference: --help and the README's Markdown table. */
#include "settings.h"

#include <string.h>

static const char *default_text(const struct setting *s)
{
	if (!s->def)
		return "unset";
	return s->def[0] ? s->def : "\"\"";
}

/* Words of text on lines of at most 80 columns, each indented by 6. */
static void put_wrapped(FILE *out, const char *text)
{
	size_t col = 0;

	while (*text) {
		size_t n = strcspn(text, " ");

		if (col > 0 && col + 1 + n > 80 - 6) {
			fputc('\n', out);
			col = 0;
		}
		fprintf(out, "%s%.*s", col ? " " : "      ", (int)n, text);
		col += n + (col ? 1 : 0);
		text += n;
		text += strspn(text, " ");
	}
	fputc('\n', out);
}

static void help_rows(FILE *out, const struct config_extensions *ext,
		      const struct setting *rows, size_t n)
{
	char range[160], text[512];

	for (size_t i = 0; i < n; i++) {
		const struct setting *s = &rows[i];

		setting_range(s, range, sizeof(range));
		fprintf(out, "  %s (default: %s%s)\n", s->name, default_text(s),
			s->flags & SETTING_SECRET ? ", secret" : "");
		snprintf(text, sizeof(text), "%s%s%s%s",
			 config_row_help(ext, s), range[0] ? " [" : "", range,
			 range[0] ? "]" : "");
		put_wrapped(out, text);
	}
}

/* The variables of each database of OUTBOX_DATABASES (databases.c). */
#define DATABASE_VARS_HELP                                                     \
	"  OUTBOX_DATABASE_URL_<NAME>\n"                                       \
	"      with OUTBOX_DATABASES, the URL of the database of that name "   \
	"(upper-cased);\n      a secret, may be a _FILE\n"                     \
	"  OUTBOX_LISTEN_DATABASE_URL_<NAME>\n"                                \
	"      with OUTBOX_DATABASES, a direct connection for LISTEN to that " \
	"database;\n      unset uses its URL\n"
#define DATABASE_VARS_MARKDOWN                                                 \
	"| `OUTBOX_DATABASE_URL_<NAME>` | unset | with `OUTBOX_DATABASES`, "   \
	"the URL of the database of that name (upper-cased); a secret, may "   \
	"be a `_FILE` |\n"                                                     \
	"| `OUTBOX_LISTEN_DATABASE_URL_<NAME>` | unset | with "                \
	"`OUTBOX_DATABASES`, a direct connection for LISTEN to that "          \
	"database; unset uses its URL |\n"

void config_print_help(FILE *out, const struct config_extensions *ext)
{
	fputs("Settings (environment variables). Each NAME can instead be "
	      "read from the file\nnamed by NAME_FILE; setting both is an "
	      "error. Durations take a unit: 500ms,\n2s, 1m, 1h, 7d.\n\n",
	      out);
	help_rows(out, ext, config_core_rows, config_core_n_rows);
	fputs(DATABASE_VARS_HELP, out);
	for (size_t g = 0; ext && ext->groups && ext->groups[g]; g++)
		help_rows(out, ext, ext->groups[g]->rows,
			  ext->groups[g]->n_rows);
	for (size_t g = 0; ext && ext->groups && ext->groups[g]; g++)
		if (ext->groups[g]->prefix_help)
			fputs(ext->groups[g]->prefix_help, out);
}

/* Markdown cells must not contain a bare '|'. */
static void put_cell(FILE *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '|')
			fputc('\\', out);
		fputc(*s, out);
	}
}

static void markdown_rows(FILE *out, const struct config_extensions *ext,
			  const struct setting *rows, size_t n)
{
	char range[160];

	for (size_t i = 0; i < n; i++) {
		const struct setting *s = &rows[i];

		setting_range(s, range, sizeof(range));
		fprintf(out, "| `%s` | ", s->name);
		if (s->def) {
			fputc('`', out);
			put_cell(out, default_text(s));
			fputc('`', out);
		} else {
			fputs("unset", out);
		}
		fputs(" | ", out);
		put_cell(out, config_row_help(ext, s));
		if (range[0]) {
			fputs(" (", out);
			put_cell(out, range);
			fputc(')', out);
		}
		if (s->flags & SETTING_SECRET)
			fputs("; secret, never logged", out);
		fputs(" |\n", out);
	}
}

void config_print_markdown(FILE *out, const struct config_extensions *ext)
{
	fputs("| Variable | Default | Meaning |\n|---|---|---|\n", out);
	markdown_rows(out, ext, config_core_rows, config_core_n_rows);
	fputs(DATABASE_VARS_MARKDOWN, out);
	for (size_t g = 0; ext && ext->groups && ext->groups[g]; g++)
		markdown_rows(out, ext, ext->groups[g]->rows,
			      ext->groups[g]->n_rows);
	for (size_t g = 0; ext && ext->groups && ext->groups[g]; g++)
		if (ext->groups[g]->prefix_markdown)
			fputs(ext->groups[g]->prefix_markdown, out);
}
