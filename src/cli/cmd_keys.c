/* `shardlm keys [--markdown]`: every job key with its default and meaning, from the one key
 * table of src/job/config.c (README.md's table is `shardlm keys --markdown`). */
#include <stdio.h>
#include <string.h>

#include "src/cli/cli_fail.h"
#include "src/cli/commands.h"
#include "src/job/config.h"

static const char keys_usage[] =
    "usage: shardlm keys [--markdown]\n"
    "  Every job key (section.key), its default and what it means. A job file is INI with\n"
    "  sections [model] [train] [fsdp] [data] [log] [checkpoint] [runtime]; --set\n"
    "  section.key=value overrides one. Defaults: \"preset / init_from\" comes from\n"
    "  model.preset or model.init_from's config.json; \"derived\" is said in the meaning.\n"
    "  --markdown prints the table README.md holds.\n";

int cmd_keys(int argc, char **argv) {
    int markdown = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(keys_usage, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--markdown") != 0) {
            return cli_fail("keys", 2, "unknown option '%s' (usage: shardlm keys [--markdown])",
                            argv[i]);
        }
        markdown = 1;
    }
    if (!markdown)
        printf("# every job key: section.key, default, meaning (shardlm keys --help)\n");
    job_keys_print(stdout, markdown);
    return 0;
}
