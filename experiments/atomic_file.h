// The atomic writer lives in sim/io (the tensor writers use it too); this header
// keeps experiments' includes working.
#pragma once
#include "sim/io/atomic_file.h"
