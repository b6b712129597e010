#pragma once

// The version of this build: `git describe` of the checkout it was built from (a tag, or the
// commit, with `-dirty` for uncommitted changes), or "unknown" (no git, or a build without
// scripts/workspace_status.sh).
namespace mptrain {

const char* BuildVersion();

}  // namespace mptrain
