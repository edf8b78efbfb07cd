// The batchnorm family (work in progress: registers no problems yet).
#pragma once
#include "hotops/op.h"

namespace hotops::batchnorm {

const Family& family();

}  // namespace hotops::batchnorm
