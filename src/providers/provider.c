/* placeholder until this module lands */
#include "agentguard.h"
typedef int ag__placeholder_provider;
