#!/usr/bin/env bash
# Bazel's --workspace_status_command (.bazelrc): the version the binaries print with --version.
# `git describe` of the checkout (offline; a tag if one is reachable, else the commit, `-dirty`
# with uncommitted changes); "unknown" outside a git checkout (a source tarball) or without git.
version=$(git describe --tags --always --dirty 2>/dev/null) || version=unknown
echo "STABLE_MPTRAIN_VERSION ${version:-unknown}"
