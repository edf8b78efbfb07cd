// The gelu family (work in progress: registers no problems yet).
#pragma once
#include "hotops/op.h"

namespace hotops::gelu {

const Family& family();

}  // namespace hotops::gelu
