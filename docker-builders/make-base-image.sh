#!/usr/bin/env bash
# Build a Debian bookworm base image from Debian's own packages, for machines that reach a
# Debian mirror but no container registry (so `FROM debian:bookworm-slim` cannot be pulled).
#
#   sudo docker-builders/make-base-image.sh [TAG] [MIRROR]
#
# TAG defaults to kbench-base:bookworm. MIRROR defaults to the first bookworm mirror found in
# /etc/apt/sources.list or /etc/apt/sources.list.d/* (falls back to deb.debian.org).
# Pass the result to the Dockerfiles with `--build-arg BASE_IMAGE=kbench-base:bookworm`.
set -euo pipefail

tag="${1:-kbench-base:bookworm}"
mirror="${2:-}"

if [[ $(id -u) -ne 0 ]]; then
    echo "make-base-image.sh: debootstrap needs root; run it with sudo" >&2
    exit 2
fi
for tool in debootstrap docker tar; do
    command -v "$tool" >/dev/null || { echo "make-base-image.sh: '$tool' not found" >&2; exit 2; }
done

find_mirror() {
    # $1: suite. One-line format: "deb [opts] URI SUITE main"; deb822: "URIs: URI" beside "Suites: ... SUITE ...".
    local suite=$1 f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        awk -v s="$suite" '$1 == "deb" { for (i = 2; i < NF; i++) if ($i ~ /^https?:\/\// && $(i+1) == s) print $i }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        awk -v s="$suite" 'BEGIN { RS = ""; FS = "\n" } {
                uri = ""; hit = 0
                for (i = 1; i <= NF; i++) {
                    n = split($i, w, /[ \t]+/)
                    if (w[1] == "URIs:") uri = w[2]
                    if (w[1] == "Suites:") for (j = 2; j <= n; j++) if (w[j] == s) hit = 1
                }
                if (hit && uri != "") print uri
            }' "$f"
    done
}

if [[ -z $mirror ]]; then
    mirror="$(find_mirror bookworm | head -n1)"
    mirror="${mirror:-http://deb.debian.org/debian}"
fi
security="$(find_mirror bookworm-security | head -n1)"
echo "make-base-image.sh: debootstrap bookworm from $mirror -> $tag"

rootfs="$(mktemp -d /tmp/kbench-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT

debootstrap --variant=minbase bookworm "$rootfs" "$mirror"

# The sources a container built from it uses for apt-get (security updates only where the host has them).
{
    echo "deb $mirror bookworm main"
    echo "deb $mirror bookworm-updates main"
    if [[ -n $security ]]; then echo "deb $security bookworm-security main"; fi
} > "$rootfs/etc/apt/sources.list"
rm -f "$rootfs"/etc/apt/sources.list.d/*
# Keep the image small: no apt caches, no package lists (every Dockerfile runs apt-get update).
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/*

tar -C "$rootfs" --numeric-owner -c . | docker import -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' - "$tag"
docker image inspect --format '{{.RepoTags}} {{.Size}} bytes' "$tag"
