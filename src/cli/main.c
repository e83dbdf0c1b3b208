/* shardlm: the program's main, which only hands over to the library. */
#include "src/cli/shardlm.h"

int main(int argc, char **argv) { return shardlm_main(argc, argv); }
