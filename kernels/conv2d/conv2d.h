// The conv2d family (work in progress: registers no problems yet).
#pragma once
#include "hotops/op.h"

namespace hotops::conv2d {

const Family& family();

}  // namespace hotops::conv2d
