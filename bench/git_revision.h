// The git revision of the hotops source tree that was built (refreshed at every build).
#pragma once

namespace hotops::bench {
// The short hash of HEAD, or "unknown" when the sources are not the top of a git repository.
const char* git_revision();
}  // namespace hotops::bench
