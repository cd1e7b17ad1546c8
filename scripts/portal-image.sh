#!/usr/bin/env bash
# Build the portal's container image (Containerfile) with Podman, without any registry.
#
#   scripts/portal-image.sh            # prints the image's name on its last line
#
# 1. The base: Debian packages (python3, venv, the libraries WeasyPrint loads) laid out by
#    mmdebstrap and imported into Podman, as the job image is (scripts/test-containers.sh).
# 2. The wheels: `pip wheel -r requirements.txt`, built here for the base's Python (3.11).
# 3. `podman build` layers the venv (installed from those wheels only, no network) and the
#    project on the base.
# Each step is cached under var/images/ (or skipped when Podman has the tag), keyed by its
# recipe: the base by its package list, the wheels by requirements.txt, the image by both and
# the files it copies. Settings: PORTAL_IMAGE_SUITE (bookworm), PORTAL_IMAGE_MIRROR,
# PY (the Python that builds the wheels: a 3.11, as the base's; default $VENV/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${PORTAL_IMAGE_SUITE:-bookworm}
mirror=${PORTAL_IMAGE_MIRROR:-}
py=${PY:-${VENV:-.venv}/bin/python}
podman=(podman --runtime runc)
packages="python3,python3-venv,ca-certificates,tzdata,libpango-1.0-0,libpangoft2-1.0-0,libharfbuzz-subset0,fonts-dejavu-core"
recipe="mmdebstrap --variant=minbase --include=${packages} ${suite} ${mirror}"
base_key=$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
base="localhost/gpucloud-portal-base:${base_key}"
mkdir -p var/images

if ! "${podman[@]}" image exists "$base" 2>/dev/null; then
  tar="var/images/gpucloud-portal-base-${base_key}.tar"
  if [ ! -s "$tar" ]; then
    echo "portal image: building the base ($recipe); cached in $tar" >&2
    # shellcheck disable=SC2086  # the mirror is optional and one word
    mmdebstrap --quiet --format=tar --variant=minbase --include="$packages" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      "$suite" "$tar.part" $mirror >var/images/portal-base.log 2>&1
    mv "$tar.part" "$tar"
  fi
  "${podman[@]}" import --quiet "$tar" "$base" >/dev/null
fi

wheels_key=$( (cat requirements.txt; "$py" -c 'import sys; print(sys.version_info[:2])') | sha256sum | cut -c1-12)
wheels="var/images/wheels-${wheels_key}"
if [ ! -f "$wheels/.complete" ]; then
  echo "portal image: building the wheels of requirements.txt into $wheels" >&2
  rm -rf "$wheels"
  "$py" -m pip wheel --quiet --wheel-dir "$wheels" -r requirements.txt >&2
  # Requirements behind an environment marker are for some other Python (the base's may be
  # older than this one): their wheels too, whatever the marker says here.
  marked=$(grep -E '^[^#].*;' requirements.txt | cut -d';' -f1 | tr -d ' ' || true)
  if [ -n "$marked" ]; then
    # shellcheck disable=SC2086  # one requirement per word
    "$py" -m pip wheel --quiet --no-deps --wheel-dir "$wheels" $marked >&2
  fi
  touch "$wheels/.complete"
fi

# The image's key: the base, the wheels and every file the build copies (git's view of them,
# committed or not; tests/ stays out of the image, .containerignore).
files_key=$(git ls-files -co --exclude-standard -z -- . ':!tests' | LC_ALL=C sort -z \
  | xargs -0 sha256sum 2>/dev/null | cat - Containerfile .containerignore | sha256sum | cut -c1-12)
image="localhost/gpucloud-portal:$(printf '%s %s %s' "$base_key" "$wheels_key" "$files_key" | sha256sum | cut -c1-12)"
if ! "${podman[@]}" image exists "$image" 2>/dev/null; then
  echo "portal image: podman build -t $image" >&2
  "${podman[@]}" build --quiet --network=none --build-arg "BASE=$base" \
    --volume "$PWD/$wheels:/wheels:ro" -f Containerfile -t "$image" . >&2
  # Older builds of the portal image: each name removed (only that name: an unchanged build
  # can share its image with an older name), the layers they share stay.
  "${podman[@]}" images --format '{{.Repository}}:{{.Tag}}' localhost/gpucloud-portal \
    | { grep -vxF "$image" || true; } | while read -r old; do
      "${podman[@]}" untag "$old" "$old" >/dev/null 2>&1 || true
    done
fi
echo "$image"
