/* placeholder until this module lands */
#include "internal.h"
typedef int ag__placeholder_trajectory;
