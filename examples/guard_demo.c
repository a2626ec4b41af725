#include <stdio.h>
#include "agentguard.h"
int main(void) { printf("agentguard %s\n", ag_version()); return 0; }
