# Container runtime prerequisites for the tests and the demo; meant to be sourced (bash).
#
# Installs podman, runc and mmdebstrap from Debian when running as root and they are missing
# (and nftables, for the network fence of gang members; without nft those tests skip), then builds the job image from Debian packages with mmdebstrap (no registry is needed) and
# imports it into podman. The built tarball is cached under var/images/, keyed by its recipe,
# so later runs reuse it; the import is skipped when podman already has that tag.
#
# Exports RUNTIME_TEST_IMAGE (the image's name) when the engine works, else
# RUNTIME_TEST_SKIP (why the container tests cannot run here).
# Settings: JOB_IMAGE_SUITE (bookworm), JOB_IMAGE_PACKAGES (python3), JOB_IMAGE_MIRROR.

_runtime_image() {
  local suite=${JOB_IMAGE_SUITE:-bookworm}
  local packages=${JOB_IMAGE_PACKAGES:-python3}
  local mirror=${JOB_IMAGE_MIRROR:-}
  local recipe="mmdebstrap --variant=minbase --include=${packages// /,} ${suite} ${mirror}"
  local key
  key=$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
  local name="localhost/gpucloud-job:${key}"
  local cache="var/images/gpucloud-job-${key}.tar"

  if ! command -v podman >/dev/null || ! command -v runc >/dev/null \
    || ! command -v mmdebstrap >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "containers: installing podman, runc and mmdebstrap from Debian's packages"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc mmdebstrap >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 \
          && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc mmdebstrap >/dev/null 2>&1; } \
        || { RUNTIME_TEST_SKIP="podman/runc/mmdebstrap could not be installed from Debian"; return 0; }
    else
      RUNTIME_TEST_SKIP="podman, runc or mmdebstrap is missing and this is not root (cannot install)"
      return 0
    fi
  fi
  if ! command -v nft >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "containers: installing nftables from Debian's packages (the gang network fence)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/dev/null 2>&1 \
      || echo "containers: nftables could not be installed: the gang container tests skip" >&2
  fi
  if podman image exists "$name" 2>/dev/null; then
    RUNTIME_TEST_IMAGE=$name
    return 0
  fi
  mkdir -p var/images
  if [ ! -s "$cache" ]; then
    echo "containers: building the job image ($recipe); cached in $cache"
    # shellcheck disable=SC2086  # the mirror is optional and one word
    if ! mmdebstrap --quiet --format=tar --variant=minbase --include="${packages// /,}" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      "$suite" "$cache.part" $mirror >var/images/build.log 2>&1; then
      rm -f "$cache.part"
      RUNTIME_TEST_SKIP="the job image could not be built (see var/images/build.log)"
      return 0
    fi
    mv "$cache.part" "$cache"
  fi
  if ! podman import --quiet "$cache" "$name" >/dev/null 2>var/images/import.log; then
    RUNTIME_TEST_SKIP="podman could not import $cache (see var/images/import.log)"
    return 0
  fi
  RUNTIME_TEST_IMAGE=$name
}

RUNTIME_TEST_IMAGE=""
RUNTIME_TEST_SKIP=""
_runtime_image
if [ -n "$RUNTIME_TEST_IMAGE" ]; then
  echo "containers: podman $(podman --version | awk '{print $3}'), job image $RUNTIME_TEST_IMAGE"
else
  echo "containers: the container tests will be skipped: $RUNTIME_TEST_SKIP" >&2
fi
export RUNTIME_TEST_IMAGE RUNTIME_TEST_SKIP
