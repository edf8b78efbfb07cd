// The copy family (work in progress: registers no problems yet).
#pragma once
#include "hotops/op.h"

namespace hotops::copy {

const Family& family();

}  // namespace hotops::copy
