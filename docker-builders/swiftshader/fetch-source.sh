#!/bin/sh
# Put SwiftShader's source at $1, from GitHub at the pinned commit (SWIFTSHADER_SOURCE=git) or from
# the build context's source/ folder (SWIFTSHADER_SOURCE=context, for machines that reach no Git host).
# Runs inside the Dockerfile's build stage.
set -eu

dest=$1
case "$SWIFTSHADER_SOURCE" in
git)
    # Fetching one commit by sha (GitHub allows it) is much smaller than a full clone.
    # No submodule is needed for the Vulkan ICD with tests off: LLVM's sources are vendored.
    git init -q "$dest"
    git -C "$dest" remote add origin "$SWIFTSHADER_REPO"
    git -C "$dest" fetch -q --depth 1 origin "$SWIFTSHADER_COMMIT"
    git -C "$dest" checkout -q FETCH_HEAD
    got=$(git -C "$dest" rev-parse HEAD)
    if [ "$got" != "$SWIFTSHADER_COMMIT" ]; then
        echo "fetch-source.sh: asked for $SWIFTSHADER_COMMIT, got $got" >&2
        exit 1
    fi
    rm -rf "$dest/.git"
    ;;
context)
    if [ ! -f /context/source/CMakeLists.txt ]; then
        echo "fetch-source.sh: SWIFTSHADER_SOURCE=context but the build context has no source/CMakeLists.txt" >&2
        exit 1
    fi
    # A snapshot may carry the commit it was taken from; refuse a mismatch with the pin.
    if [ -f /context/source/.swiftshader-commit ]; then
        got=$(tr -d ' \n' < /context/source/.swiftshader-commit)
        if [ "$got" != "$SWIFTSHADER_COMMIT" ]; then
            echo "fetch-source.sh: source/ is commit $got, SWIFTSHADER_COMMIT is $SWIFTSHADER_COMMIT" >&2
            exit 1
        fi
    else
        echo "fetch-source.sh: warning: source/.swiftshader-commit absent, cannot check the commit" >&2
    fi
    mv /context/source "$dest"
    ;;
*)
    echo "fetch-source.sh: SWIFTSHADER_SOURCE must be 'git' or 'context', not '$SWIFTSHADER_SOURCE'" >&2
    exit 1
    ;;
esac
